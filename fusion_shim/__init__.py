"""fusion_shim: run unchanged NumPy programs, offloading the large array operations that pay off to
a GPU worker over ZeroMQ, and report where the time went.

Library use::

    import fusion_shim
    fusion_shim.install(policy="remote")   # or Config.load(...) / FUSION_SHIM_* variables
    ...                                    # NumPy calls are intercepted from here on
    fusion_shim.uninstall()                # every patched attribute restored exactly

Programs: ``python -m fusion_shim app.py [args]``, ``python -m fusion_shim -m pkg.mod [args]``, or
``FUSION_SHIM=1 python app.py`` for any launch.
"""
from __future__ import annotations

from typing import Any

from . import intercept as _intercept
from . import report as _report  # light (no numpy); imported first so the function below wins:
# importing a submodule binds it on its package, which would shadow ``report()`` after its first call
from .config import Config, ConfigError
from .errors import FallbackError
from .intercept import active, install, uninstall

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "FallbackError", "active", "install", "report", "uninstall", "__version__"]


def report() -> dict[str, Any] | None:
    """The report of the running shim so far (the same map ``--report`` writes), or None."""
    rt = active()
    if rt is None:
        return None
    return _report.build(rt)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext fusion_shim``: registers the ``%%fusion_shim`` cell magic."""
    from .ipython import load_ipython_extension as load

    load(ipython)


def _report_at_exit(rt: Any) -> None:
    _report.at_exit(rt)


_intercept.on_exit(_report_at_exit)

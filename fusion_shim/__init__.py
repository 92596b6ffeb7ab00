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

import sys
import types
from typing import Any

from .config import Config, ConfigError
from .errors import FallbackError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "FallbackError", "active", "install", "report", "uninstall", "__version__"]

_LAZY = ("active", "install", "uninstall")  # from .intercept, loaded on first use: a worker never needs it


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import intercept

        return getattr(intercept, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def report() -> dict[str, Any] | None:
    """The report of the running shim so far (the same map ``--report`` writes), or None."""
    from . import intercept
    from .report import build

    rt = intercept.active()
    return None if rt is None else build(rt)


class _Package(types.ModuleType):
    """``fusion_shim.report`` is the function above: importing the ``report`` subpackage (which
    binds a submodule on its package) must not replace it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name == "report" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext fusion_shim``: registers the ``%%fusion_shim`` cell magic."""
    from .ipython import load_ipython_extension as load

    load(ipython)

"""wrapt's two C types, ``ObjectProxy`` and ``FunctionWrapper``, without importing the ``wrapt``
package, whose ``__init__`` loads asyncio and importlib.metadata (D112).

The C extension ``wrapt._wrappers`` and the ``wrapt.exceptions`` module it reads at init are loaded
from wrapt's own directory under their own names, so that a later ``import wrapt`` (the program's,
a test's) finds and uses these same modules: ``wrapt.FunctionWrapper`` and ``wrapt.BaseObjectProxy``
are then the very types the shim wrapped with. Where wrapt is imported already, where its C part is
missing or ``WRAPT_DISABLE_EXTENSIONS`` is set, the package is imported as usual and its types used.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from .. import _hooks

_types: tuple[Any, Any] | None = None  # (ObjectProxy, FunctionWrapper), once loaded


def load() -> tuple[Any, Any]:
    """(the C ``ObjectProxy``, ``FunctionWrapper``), loaded once."""
    global _types
    if _types is None:
        _types = _preloaded() or _c_only() or _from_package()
    return _types


def _preloaded() -> tuple[Any, Any] | None:
    ext = sys.modules.get("wrapt._wrappers")
    if ext is not None:  # wrapt (or this module, in an earlier install) loaded it
        return ext.ObjectProxy, ext.FunctionWrapper
    return _from_package() if "wrapt" in sys.modules else None


def _from_package() -> tuple[Any, Any]:
    import wrapt

    # wrapt 2 names the C proxy BaseObjectProxy (its ObjectProxy is a Python subclass); wrapt 1, ObjectProxy
    return getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy), wrapt.FunctionWrapper


def _c_only() -> tuple[Any, Any] | None:
    """The extension loaded from the package's directory, the package itself not run; None where
    that cannot be done (the package is then imported)."""
    import importlib
    import importlib.machinery  # D123: NumPy has loaded it; importlib.util it has not

    if os.environ.get("WRAPT_DISABLE_EXTENSIONS"):
        return None
    spec = importlib.machinery.PathFinder.find_spec("wrapt")  # sys.path, as `import wrapt` searches it
    if spec is None or not spec.submodule_search_locations:
        return None
    where = list(spec.submodule_search_locations)[0]
    ext = next((p for p in (os.path.join(where, "_wrappers" + s) for s in importlib.machinery.EXTENSION_SUFFIXES)
                if os.path.isfile(p)), None)
    if ext is None:
        return None
    added: list[str] = []
    # the extension's init imports "wrapt.exceptions", and that import would run the package's
    # __init__ (D112): an unexecuted stand-in, the package's directory its path, holds the name while the two load
    stand_in = sys.modules["wrapt"] = type(sys)("wrapt")
    stand_in.__path__ = [where]
    try:
        names = ("wrapt.exceptions", "wrapt._wrappers") if os.path.isfile(os.path.join(where, "exceptions.py")) \
            else ("wrapt._wrappers",)  # wrapt 2; wrapt 1's extension needs nothing
        for name in names:
            added.append(name)
            module = importlib.import_module(name)
    except Exception:  # an unexpected wrapt: its package, imported as usual
        for name in added:
            sys.modules.pop(name, None)
        return None
    finally:
        if sys.modules.get("wrapt") is stand_in:
            del sys.modules["wrapt"]
    # the real package, when imported, finds these in sys.modules without binding them on itself
    _hooks.when_imported("wrapt", lambda pkg: _bind(pkg, added))
    return module.ObjectProxy, module.FunctionWrapper


def _bind(package: Any, names: list[str]) -> None:
    for name in names:
        if name in sys.modules and not hasattr(package, name.rpartition(".")[2]):
            setattr(package, name.rpartition(".")[2], sys.modules[name])

"""The package's optional C extensions (``native/``), loaded by name, or from the installed copy of
the package where this one is a source checkout without them (``python -m pytest`` in the
repository after ``pip install .``, as CI runs)."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def load(short: str) -> Any:
    """The extension ``fusion_shim.<short>``; ImportError where neither this package nor an
    installed copy has it. ``sys.modules["fusion_shim.<short>"] = None`` blocks it."""
    try:
        return importlib.import_module(f"{__package__}.{short}")
    except ImportError:
        module = installed_copy(short)
        if module is None:
            raise
        return module


def installed_copy(short: str) -> Any:
    """``fusion_shim.<short>`` from another copy of the package on ``sys.path`` than this one (the
    installed one), or None where none has it."""
    import importlib.machinery  # D123: NumPy has loaded it; importlib.util it has not

    name = f"{__package__}.{short}"
    if name in sys.modules:  # None: import blocked on purpose
        return sys.modules[name]
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        pkg = os.path.join(entry or os.getcwd(), "fusion_shim")
        if not os.path.isdir(pkg) or os.path.realpath(pkg) == here:
            continue
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(pkg, short + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader(name, path)
                module = loader.create_module(importlib.machinery.ModuleSpec(name, loader, origin=path))
                loader.exec_module(module)
                sys.modules[name] = module
                return module
    return None

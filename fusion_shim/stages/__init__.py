"""Stages (docs/stages.md): a whole function run on the worker, with only its arguments and results
crossing the link; decided and checked like a call.

``@fusion_shim.stage`` marks one in code; ``--stage MODULE:QUALNAME`` (``FUSION_SHIM_STAGES``)
marks one without changing the program (:mod:`.mark`). Outside a shim the decorator gives the
function back unchanged. Nothing here imports cloudpickle: the first call sent to a worker does
(:mod:`fusion_shim.protocol.code`).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from .wrapper import Stage

__all__ = ["Stage", "stage"]


def stage(fn: Callable | None = None) -> Any:
    """Mark ``fn`` as a stage; a no-op where no shim is installed or about to be."""
    if fn is None:
        return stage
    if isinstance(fn, Stage) or not _shim_expected():
        return fn
    return Stage(fn)


def _shim_expected() -> bool:
    """Whether this process runs under the shim: installed, or set to install at NumPy's import."""
    intercept = sys.modules.get("fusion_shim.intercept")
    if intercept is not None and getattr(intercept, "_installed", None) is not None:
        return True
    return bool(getattr(sys.modules.get("fusion_shim"), "_started", False))

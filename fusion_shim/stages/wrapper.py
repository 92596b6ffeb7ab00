"""What a marked function becomes: a :class:`Stage`, which under a running shim hands each call to
the run's :class:`~fusion_shim.stages.runner.Runner` (``Runtime.stage_runner``), and otherwise calls
the function."""
from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable



class Stage:
    """A stage: calls go through the shim's runner while one is active; pickles as its function,
    so a stage that calls another ships the plain function (the worker runs it as plain code)."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runner = _runner()
        if runner is None:
            return self.fn(*args, **kwargs)
        return runner.call(self, args, kwargs)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self) -> Any:
        return _plain, (self.fn,)

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


def _plain(fn: Callable) -> Callable:
    return fn


def _runner() -> Any:
    """The active shim's stage runner, or None: no shim, policy local, the shim's own NumPy, or inside
    a stage running here (D336: the runtime's re-entrancy guard, its ``stages`` level)."""
    intercept = sys.modules.get("fusion_shim.intercept")
    rt = intercept.active() if intercept is not None else None
    if rt is None or rt.local_only:
        return None
    guard = rt.guard
    if getattr(guard, "busy", False) or getattr(guard, "stages", 0):
        return None
    return rt.stage_runner()

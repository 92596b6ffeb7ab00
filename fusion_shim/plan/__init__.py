"""Where a call runs, and why.

- :mod:`.model`: cost models. Local compute time per op, dtype and size (calibration curves plus
  every measured call, bucketed by work); each worker's device (its self-benchmark, then its
  measured kernel times); each worker's link (round trip and bandwidth each way, measured at
  connect, corrected from every call). A bucket that keeps mispredicting is reset (StarPU's rule).
- :mod:`.policy`: :func:`decide`, pure: ``local`` | ``remote`` | ``auto``; under ``auto`` only the
  input bytes a worker lacks are priced, its queue is counted, a cold worker is never waited for,
  a margin that narrows with evidence guards against optimistic models, and exploration is
  budgeted. Also :func:`floors`: the smallest input, per op, that could win at all.
- :mod:`.calibrate`: local probes on first use, in the background, cached per host and NumPy/BLAS
  build under ``$XDG_CACHE_HOME/fusion_shim``.
- :mod:`.planner`: :class:`Planner`, the state between calls (budget, calibration queue, the
  per-op floors the interceptor compares against).
- :mod:`.stages`: :class:`StageDecider`, where each stage call runs (D173), the planner's ``stages``.
- :mod:`.cells`: the floor cells' starting values, which the runtime holds before its planner is made.

The planner imports neither zmq nor torch; ``decide`` does no I/O. The names below load with their
module on first use: the runtime makes its planner on first need (D113), and reads only ``cells``
before that.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"FAMILIES": "model", "LinkModel": "model", "Profile": "model", "RateModel": "model",
          "RemoteModel": "model", "EXPLORE_FRACTION": "planner", "Planner": "planner", "StageDecider": "stages",
          "FLOOR_BYTES": "cells", "NEVER": "cells", "Call": "policy", "Decision": "policy", "WorkerState": "policy", "decide": "policy",
          "floors": "policy"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

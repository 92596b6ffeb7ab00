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

The planner imports neither zmq nor torch; ``decide`` does no I/O.
"""
from __future__ import annotations

from .model import FAMILIES, LinkModel, Profile, RateModel, RemoteModel
from .planner import EXPLORE_FRACTION, FLOOR_BYTES, Planner
from .policy import NEVER, Call, Decision, WorkerState, decide, floors

__all__ = ["Call", "Decision", "EXPLORE_FRACTION", "FAMILIES", "FLOOR_BYTES", "LinkModel", "NEVER", "Planner",
           "Profile", "RateModel", "RemoteModel", "WorkerState", "decide", "floors"]

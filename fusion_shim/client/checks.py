"""Sampled verification and pinning: which of the worker's answers are also computed here and
compared, and which op signatures run locally for the rest of the run (a checked answer that
differed, or an op in flight each time the worker went down)."""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..catalog import Prepared
from ..config import Config
from ..errors import VerificationError
from ..ledger import Ledger, Record
from ..plan import Planner
from ..verify import Sampler, compare

CRASH_LIMIT = 3  # D29: an op in flight this many times when the worker went down runs locally from then on


@dataclass
class Done:
    """The worker's answer; the record is added once it is checked (or not sampled for a check)."""
    value: Any
    rec: Record
    prep: Prepared


def signature(rec: Record) -> tuple:
    """What a verification mismatch pins to local: the op with these dtypes and ranks."""
    return rec.op, tuple(rec.dtypes), tuple(len(s) for s in rec.shapes)


class Checks:
    """The run's checks and pins; ``guard`` is the runtime's re-entrancy guard (a check's NumPy call
    is the shim's own)."""

    def __init__(self, config: Config, ledger: Ledger, planner: Planner, guard: threading.local):
        self.config = config
        self.ledger = ledger
        self.planner = planner
        self.guard = guard
        self._sampled = Sampler(config.verify)
        self.pinned_checks: dict[tuple, str] = {}  # op signature -> call site of the mismatch that pinned it
        self.crash_limit = CRASH_LIMIT
        self.crashes: dict[tuple, int] = {}  # (kernel id, input dtypes) -> times in flight when the worker went down
        self.pinned: dict[tuple, str] = {}  # -> the reason; these run locally for the rest of the run
        self._crash_lock = threading.Lock()

    # -- before a call is decided ---------------------------------------------------------------
    def pinned_reason(self, rec: Record, op_key: tuple) -> tuple[str, str] | None:
        """(record kind, reason) for a call pinned local, or None."""
        pinned_at = self.pinned_checks.get(signature(rec)) if self.pinned_checks else None
        if pinned_at is not None:
            return "local", f"pinned local: a checked answer differed at {pinned_at}"
        if self.pinned and op_key in self.pinned:
            return "fallback", self.pinned[op_key]
        return None

    def count_crash(self, op_key: tuple, exc: Exception) -> None:
        """The worker went down with this op in flight; at ``crash_limit`` it runs locally from now on."""
        with self._crash_lock:
            n = self.crashes[op_key] = self.crashes.get(op_key, 0) + 1
            if n < self.crash_limit or op_key in self.pinned:
                return
            self.pinned[op_key] = (f"pinned local: {op_key[0]}({', '.join(op_key[1])}) was in flight {n} times "
                                   f"when the worker went down (last: {type(exc).__name__})")
        self.ledger.event(f"{self.pinned[op_key]}; it runs locally for the rest of the run")

    # -- after the worker answered --------------------------------------------------------------
    def finish(self, done: Done, original: Any, sig: inspect.Signature, args: tuple, kwargs: dict) -> Any:
        """Record the call; when it is sampled for a check, compute it locally too and compare. The
        check's time is its own phase, outside the call's wall time and the production totals."""
        rec = done.rec
        if original is None or not self._sampled():  # None: the call cannot be recomputed (`a @= b`)
            self.ledger.add(rec)
            return done.value
        t = time.perf_counter()
        bound = sig.bind(*args, **kwargs)
        if "out" in bound.arguments:
            bound.arguments["out"] = None  # the check must not write into the program's array again
        self.guard.busy = True
        try:
            want = original(*bound.args, **bound.kwargs)
        except Exception as exc:  # NumPy refuses what the worker computed: NumPy's answer stands
            rec.verify, rec.phases["verify"] = f"mismatch: NumPy raised {type(exc).__name__}", time.perf_counter() - t
            self._pin(rec)
            raise
        finally:
            self.guard.busy = False
        numpy_s = time.perf_counter() - t  # NumPy's own time, without the comparison: the oracle's
        problem = compare(rec.op, done.prep.out if done.prep.out is not None else done.value, want, done.prep.arrays)
        rec.phases["verify"] = time.perf_counter() - t
        rec.local_measured_s = numpy_s
        planned = getattr(rec, "plan", None)  # call.Planned
        if planned is not None:  # a check is also a measurement of the local side
            self.planner.measured_local(planned.call, numpy_s)
        if problem is None:
            rec.verify = "ok"
            self.ledger.add(rec)
            return done.value
        rec.verify = f"mismatch: {problem}"
        self._pin(rec)
        if self.config.strict:
            raise VerificationError(f"{rec.op} at {rec.site}: the worker's answer differed from NumPy's: {problem}")
        if done.prep.out is not None:
            np.copyto(done.prep.out, want)
            return done.prep.out
        return want

    def _pin(self, rec: Record) -> None:
        self.pinned_checks[signature(rec)] = rec.site
        self.ledger.add(rec)
        self.ledger.event(f"{rec.op} {rec.dtypes} pinned local: the worker's answer at {rec.site} differed "
                          f"from NumPy's ({rec.verify})")

"""When a pool on Ray is worth opening under ``auto`` (D302): only once the program's own calls from
:data:`FLOOR_BYTES` of input on have taken :data:`OPEN_AFTER_S` here. Opening one costs seconds of CPU on this host
(Ray's import in two helper processes, the token probe and the driver that gives the keys, D300), which
a program whose calls a worker could not shorten by that much never gets back.

Imports only the standard library: the runtime makes it at NumPy's import. The same interface as
:class:`.cpuwins.CpuEvidence` (``floors``, ``observe``, ``describe``), which the runtime's evidence path reads."""
from __future__ import annotations

import _thread  # D36: threading's locks are these, without loading threading
from typing import Iterable

OPEN_AFTER_S = 2.0  # D302: about what opening a pool cost here, in helper processes (probe, import, connect)
FLOOR_BYTES = 1 << 20  # D302: below it a call is not timed (the evidence path's cost is a few us a call)


class PoolEvidence:
    """The program's calls of any op from ``floor`` bytes of input on, timed here, until their sum
    first reaches ``open_after_s``: then the pool is opened (:meth:`observe` says so once)."""

    def __init__(self, ops: Iterable[str], floor: int = FLOOR_BYTES, open_after_s: float = OPEN_AFTER_S):
        self.ops = tuple(ops)
        self.floor = floor
        self.open_after_s = open_after_s
        self.seen_s = 0.0
        self.calls = 0
        self.enough = False
        self._lock = _thread.allocate_lock()

    def floors(self) -> dict[str, int]:
        """Each op's input size from which its calls are evidence: below it, one size comparison."""
        return dict.fromkeys(self.ops, self.floor)

    def observe(self, op: str, bytes_in: int, seconds: float) -> bool:
        """One call computed here in ``seconds``; True the first time the evidence is enough."""
        if bytes_in < self.floor or self.enough:
            return False
        with self._lock:
            if self.enough:
                return False
            self.calls += 1
            self.seen_s += seconds
            self.enough = self.seen_s >= self.open_after_s
            return self.enough

    def describe(self) -> str:
        """The evidence in words, for the report."""
        return (f"{self.calls} calls of {self.floor >> 10} KiB or more took {self.seen_s:.3g} s here, against the "
                f"{self.open_after_s:g} s that opening the pool costs")


__all__ = ["OPEN_AFTER_S", "PoolEvidence"]

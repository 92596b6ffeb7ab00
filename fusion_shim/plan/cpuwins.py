"""When an embedded worker on a host without a GPU is worth starting: the ops its torch kernels
compute faster than NumPy on the same CPUs, from what input size and by how much (data, measured by
``benchmarks/cpu_wins.py``, D101), and :class:`CpuEvidence`, which sums what the program's own calls
of those ops would have saved on such a worker until that pays the worker's start (D40).

Imports only the standard library: the runtime makes it at NumPy's import, when it defers the embedded worker."""
from __future__ import annotations

import _thread  # D36: threading's locks are these, without loading threading

from .margins import first_call_margin


class CpuWin:
    """An op a CPU torch worker won against NumPy at every measured size from ``from_bytes`` of input
    on, by at least ``speedup`` (NumPy's time over the worker kernel's). D123: not a NamedTuple,
    whose class is made by eval at NumPy's import."""
    __slots__ = ("from_bytes", "op", "speedup")

    def __init__(self, op: str, from_bytes: int, speedup: float):
        self.op, self.from_bytes, self.speedup = op, from_bytes, speedup

    def __repr__(self) -> str:
        return f"CpuWin({self.op!r}, {self.from_bytes}, {self.speedup})"


# D101: measured in float64/complex128, a same-host round trip included; an op missing here did not
# win by MIN_SPEEDUP in every run
CPU_WINS: tuple[CpuWin, ...] = (
    CpuWin("numpy.fft.fft", 16_777_216, 1.6),
    CpuWin("numpy.fft.ifft", 16_777_216, 1.2),
    CpuWin("numpy.fft.ifft2", 16_777_216, 1.2),
    CpuWin("numpy.fft.fftn", 4_194_304, 1.8),
)
MIN_SPEEDUP = 1.2  # D101: what a row had to win by in every run to be listed (D40 asks more of it to count)
START_COST_S = 3.2  # D40: what the embedded worker's start cost a program it then did nothing for


class CpuEvidence:
    """What the program's calls of ``wins`` ops, at their sizes, would have saved on a CPU worker:
    each call's measured time here times (1 - 1/speedup). :meth:`observe` says when the sum first
    reaches ``start_cost_s``, once, whichever of the program's threads calls it. D40: only an op
    won by more than ``margin`` counts, the least speedup for which the planner gives a worker on
    this host's CPUs an op's first call: a worker that wins by less would be started and given none."""

    def __init__(self, wins: tuple[CpuWin, ...] | None = None, start_cost_s: float | None = None,
                 margin: float | None = None):
        wins = CPU_WINS if wins is None else wins
        self.margin = first_call_margin(shared_cpus=True) if margin is None else margin
        self.wins = {w.op: w for w in wins if w.speedup > self.margin}
        self.best = max(wins, key=lambda w: w.speedup, default=None)  # said when none is enough
        self.start_cost_s = START_COST_S if start_cost_s is None else start_cost_s
        self.saving_s = 0.0   # what the calls seen would have saved there
        self.seen_s = 0.0     # their time here
        self.calls: dict[str, int] = {}
        self.enough = False
        self._lock = _thread.allocate_lock()

    def floors(self) -> dict[str, int]:
        """Each op's input size from which its calls are evidence: below it, one size comparison."""
        return {op: w.from_bytes for op, w in self.wins.items()}

    def observe(self, op: str, bytes_in: int, seconds: float) -> bool:
        """One call computed here in ``seconds``; True the first time the evidence is enough."""
        win = self.wins.get(op)
        if win is None or bytes_in < win.from_bytes or self.enough:
            return False
        with self._lock:
            if self.enough:
                return False
            self.calls[op] = self.calls.get(op, 0) + 1
            self.seen_s += seconds
            self.saving_s += seconds * (1.0 - 1.0 / win.speedup)
            self.enough = self.saving_s >= self.start_cost_s
            return self.enough

    def describe(self) -> str:
        """The evidence in words, for the report."""
        if not self.wins:
            best = (f"; the best measured, {self.best.op.removeprefix('numpy.')}, x{self.best.speedup:g}"
                    if self.best is not None else "")
            return (f"no op a CPU worker wins here by the x{self.margin:.2f} the planner asks of a worker "
                    f"on this host's CPUs before its first call{best}")
        if not self.calls:
            return (f"no call of an op a CPU worker wins here reached its size (they are "
                    f"{', '.join(sorted(op.removeprefix('numpy.') for op in self.wins))})")
        ops = ", ".join(f"{op.removeprefix('numpy.')} x{n}" for op, n in sorted(self.calls.items()))
        return (f"{self.seen_s:.3g} s of calls a CPU worker wins here ({ops}) would have saved about "
                f"{self.saving_s:.3g} s there, against the {self.start_cost_s:g} s its start costs")


def shared_worker_why(wins: tuple[CpuWin, ...] | None = None) -> str | None:
    """D301: why a running worker on this host's CPUs gets no call under auto (None: it may get some).
    D40's rule, less the start a running worker has already paid: no op a CPU worker wins here by the
    planner's first-call margin for such a worker, so the planner would give it nothing that pays."""
    evidence = CpuEvidence(wins)
    return None if evidence.wins else evidence.describe()


__all__ = ["CPU_WINS", "CpuEvidence", "CpuWin", "MIN_SPEEDUP", "START_COST_S", "shared_worker_why"]

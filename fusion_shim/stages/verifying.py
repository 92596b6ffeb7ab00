"""``--verify`` for stages: a sampled stage call also runs here, on copies of its arguments taken
before it was sent, and its result and changed arguments are compared with the worker's; a
mismatch pins the stage here, names it, and gives the program this host's answer."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import VerificationError
from ..protocol import code
from ..verify import compare
from .state import Raised


class Check:
    def __init__(self, runner: Any, packed: Any):
        self.runner, self.packed = runner, packed
        self.copies = [a.copy() for a in packed.arrays]
        _, self.args, self.kwargs = code.loads(packed.payload, self.copies)

    @classmethod
    def maybe(cls, runner: Any, packed: Any) -> "Check | None":
        return cls(runner, packed) if runner.sampled() else None

    def finish(self, stage: Any, args: tuple, kwargs: dict, value: Any, rec: Any) -> Any:
        """The value the program gets: the worker's when it matches this host's, else this host's."""
        runner = self.runner
        t = time.perf_counter()
        guard = runner.guard
        busy, guard.busy = getattr(guard, "busy", False), True  # the reference run is plain NumPy and stages
        try:
            want: Any = stage.fn(*self.args, **self.kwargs)
        except Exception as exc:  # the stage's own exception, compared with the worker's
            want = Raised(exc)
        finally:
            guard.busy = busy
        rec.phases["verify"] = time.perf_counter() - t
        problem = _differs(value, want)
        for i, (sent, mine) in enumerate(zip(self.packed.arrays, self.copies)):
            problem = problem or _differs(sent, mine, f"argument array {i}")
        if problem is None:
            rec.verify = "ok"
            return value
        rec.verify = f"mismatch: {problem}"
        runner.decider.pin(stage.name, f"its worker answer differed from this host's ({problem})")
        runner.ledger.event(f"stage {stage.name} pinned here: the worker's answer at {rec.site} differed ({problem})")
        if runner.config.strict:
            raise VerificationError(f"stage {stage.name} at {rec.site}: the worker's answer differed: {problem}")
        for sent, mine in zip(self.packed.arrays, self.copies):
            np.copyto(sent, mine)
        return want


def _differs(got: Any, want: Any, where: str = "result") -> str | None:
    if type(got) is not type(want):
        return f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(got, Raised):  # both raised
        same = type(got.exc) is type(want.exc) and str(got.exc) == str(want.exc)
        return None if same else f"{where}: raised {got.exc!r} != {want.exc!r}"
    if isinstance(got, np.ndarray):
        problem = compare("stage", got, want, [])
        return None if problem is None else f"{where}: {problem}"
    if isinstance(got, (list, tuple)):
        if len(got) != len(want):
            return f"{where}: length {len(got)} != {len(want)}"
        return next((p for i, (g, w) in enumerate(zip(got, want)) if (p := _differs(g, w, f"{where}[{i}]"))), None)
    if isinstance(got, dict):
        if got.keys() != want.keys():
            return f"{where}: keys differ"
        return next((p for k in got if (p := _differs(got[k], want[k], f"{where}[{k!r}]"))), None)
    try:
        same = bool(got == want) or (isinstance(got, float) and abs(got - want) <= 1e-9 * max(abs(want), 1.0))
    except Exception:  # an object without a usable ==: taken as equal, like plain Python would not check it
        same = True
    return None if same else f"{where}: {got!r} != {want!r}"[:200]

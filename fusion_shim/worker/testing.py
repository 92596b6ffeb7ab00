"""A worker for tests: it holds every call a while (to be killed or abandoned mid-call) or answers
wrongly (to be caught by verification). Not offered by ``fusion-shim worker``; tests start it as

    python -m fusion_shim.worker.testing --bind URL [--device cpu] [--delay S] [--corrupt]

or in a thread: ``serve_in_thread(url, worker=FaultyWorker("cpu", delay=0.4))``.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from .server import Worker


class FaultyWorker(Worker):
    """A :class:`Worker` whose admitted calls each wait ``delay`` seconds before their kernel, outside
    every phase the reply times (the client sees a slow link, not a slow device), and whose answers,
    with ``corrupt``, are each one element off and never kept. A test may change ``delay`` between calls."""

    def __init__(self, *args: Any, delay: float = 0.0, corrupt: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.corrupt = corrupt

    def warm(self, shared: bool = False) -> None:
        super().warm(shared)
        self.info.update(test_delay=self.delay, test_corrupt=self.corrupt)

    def _planned(self, frames: list) -> None:
        return None  # every call goes through _execute, where the faults are

    def _execute(self, rid: int, header: dict, arrays: list, *admitted: Any, **kwargs: Any) -> Any:
        if self.delay:
            time.sleep(self.delay)
        if self.corrupt:
            header = {**header, "keep": False}  # a wrong answer is never kept for later calls
        return super()._execute(rid, header, arrays, *admitted, **kwargs)

    def _reply(self, rid: int, results: list, timing: dict, extra: dict, dests: list, slots: list) -> Any:
        if self.corrupt:
            results = [corrupt(r) for r in results]
            extra = {k: v for k, v in extra.items() if k != "fps"}
        return super()._reply(rid, results, timing, extra, dests, slots)


def corrupt(a: Any) -> Any:
    """A wrong answer of the right type, one element off."""
    a = a.copy()
    if a.size:
        flat = a.reshape(-1)
        flat[0] = flat[0] + (1 if a.dtype.kind in "biu" else 1e-3 * (abs(flat[0]) + 1))
    return a


def main(argv: list[str] | None = None) -> int:
    from . import command  # under FUSION_SHIM=1, this process was never armed (fusion_shim._own_process)

    p = command.parser("python -m fusion_shim.worker.testing")
    p.add_argument("--delay", type=float, default=0.0, help="hold every call this many seconds")
    p.add_argument("--corrupt", action="store_true", help="return wrong answers")
    opts = p.parse_args(sys.argv[1:] if argv is None else argv)
    if opts.corrupt:
        print("fusion_shim worker: TEST MODE --corrupt: every answer is wrong", file=sys.stderr, flush=True)

    def make(device: str, memory_budget: int | None, **kwargs: Any) -> FaultyWorker:
        return FaultyWorker(device, memory_budget, delay=opts.delay, corrupt=opts.corrupt, **kwargs)

    return command.start(p, opts, make)


if __name__ == "__main__":
    sys.exit(main())

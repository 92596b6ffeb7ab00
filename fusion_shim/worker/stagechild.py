"""The process a worker runs one principal's stages in (docs/stages.md): ``python -m
fusion_shim.worker.stagechild FD``, FD a socket to the worker (:mod:`.stages`).

A job is a header (the function's reference, the array metas), the payload, then one buffer per array
that is not a reference; the answer is a header and its buffers (:mod:`fusion_shim.protocol.wire`,
"The stage pipe"). The arrays a job
tagged with a fingerprint stay here (``KEEP_BYTES``, least recently used first), so a matrix that
many stage calls use crosses once. A stage that crashes this process or never returns costs the
worker only this process: it kills it and starts another for the next job.
"""
from __future__ import annotations

import collections
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..protocol import code, messages
from ..protocol.fingerprint import fingerprint
from ..protocol.wire import to_wire

KEEP_BYTES = 2 << 30  # arrays kept for later jobs of this principal
MAX_TRACEBACK = 16_000  # characters of it sent back
NOTE = {"text": ""}  # said with every answer: what of the sandbox does not hold, why NumPy stays on the CPU


class Held:
    """Arrays by fingerprint, bounded in bytes."""

    def __init__(self, budget: int = KEEP_BYTES):
        self.budget, self.used = budget, 0
        self.arrays: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    def get(self, fp: str) -> np.ndarray | None:
        arr = self.arrays.get(fp)
        if arr is not None:
            self.arrays.move_to_end(fp)
        return arr

    def put(self, fp: str, arr: np.ndarray) -> None:
        if fp in self.arrays or arr.nbytes > self.budget:
            return
        while self.used + arr.nbytes > self.budget:
            _, old = self.arrays.popitem(last=False)
            self.used -= old.nbytes
        self.arrays[fp] = arr
        self.used += arr.nbytes

    def drop(self, fp: str) -> None:
        arr = self.arrays.pop(fp, None)
        if arr is not None:
            self.used -= arr.nbytes


def _fp(arr: np.ndarray) -> str:
    meta, buf = to_wire(arr)
    return fingerprint(meta, buf)


def receive(conn: Connection, meta: dict) -> np.ndarray:
    """One array's buffer read straight into fresh, writable memory."""
    arr = np.empty(meta["shape"], np.dtype(meta["dtype"]), order=meta["order"])
    if arr.size:
        conn.recv_bytes_into(arr.reshape(-1, order="A").view(np.uint8))
    else:
        conn.recv_bytes()
    return arr


def run_job(conn: Connection, held: Held) -> None:
    job, payload = messages.recv_stage_job(conn)
    metas = job["metas"]
    arrays: list[Any] = [None if m.get("ref") else receive(conn, m) for m in metas]
    missing = []
    for i, m in enumerate(metas):
        if m.get("ref"):
            arrays[i] = held.get(m["fp"])
            if arrays[i] is None:
                missing.append(m["fp"])
    if missing:
        return _answer(conn, {"missing": missing}, [])
    fn = None
    if job.get("fn") is not None:
        fn, why = code.resolve(job["fn"])
        if fn is None:
            return _answer(conn, {"code_missing": why}, [])
    before = [m.get("fp") or _fp(a) for m, a in zip(metas, arrays)]
    t = time.perf_counter()
    raised = False
    try:
        packed_fn, args, kwargs = code.loads(payload, arrays)
        fn = packed_fn if fn is None else fn
        value: Any = fn(*args, **kwargs)
    except BaseException as exc:  # the stage's own exception goes back to its caller
        raised, value = True, _with_frames(exc)
    took = time.perf_counter() - t
    changed = [i for i, (fp, a) in enumerate(zip(before, arrays)) if _fp(a) != fp]
    for i, m in enumerate(metas):
        if "fp" in m:
            if i in changed:
                held.drop(m["fp"])
            else:
                held.put(m["fp"], arrays[i])
    try:
        data, results = code.dumps(value)
    except Exception as exc:  # a value that does not pickle: said as an error of that type
        what = "exception" if raised else "result"
        raised = True
        data, results = code.dumps(TypeError(f"the stage's {what} does not pickle: {type(exc).__name__}: {exc}"))
    wired = [to_wire(a) for a in (*results, *(arrays[i] for i in changed))]
    header = {"ok": True, "raised": raised, "nres": len(results), "changed": changed, "stage_s": took, "note": NOTE["text"],
              "metas": [meta for meta, _ in wired]}
    _answer(conn, header, [data, *(buf for _, buf in wired)])


def _with_frames(exc: BaseException) -> BaseException:
    """``exc`` carrying the stage's own traceback as text (D216): frames do not pickle, and the
    caller would see only its side's."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # the stage's, not run_job's
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        setattr(exc, code.STAGE_TRACEBACK, text[-MAX_TRACEBACK:].rstrip())
    except Exception:  # an exception that takes no attributes: sent without its frames
        pass
    return exc


def _answer(conn: Connection, header: dict, buffers: list) -> None:
    messages.send_stage_answer(conn, header, buffers)


DEVICES = ("cuda",)  # D307: on the CPU, torch would use the same CPUs as NumPy, at a cost per call (D71)
DEVICE: dict[str, Any] = {"calls": None}  # this process's DeviceCalls, where its NumPy calls go to a device


def device_calls(device: str) -> Any:
    """D307: this process's NumPy calls that the catalog admits run on ``device`` through the
    worker's own backend and kernels, in this process (:mod:`.devicecalls`); the rest run in NumPy."""
    from .devicecalls import on_device

    DEVICE["calls"] = on_device(device)
    return DEVICE["calls"]


def main(argv: list[str], unconfined: str = "", devices: tuple[str, ...] = DEVICES) -> int:
    """``unconfined``: what of the sandbox does not hold (:func:`.isolation.confine`, already run);
    ``devices``: the device types whose stages' NumPy calls run there (a test names "cpu")."""
    conn = Connection(int(argv[0]))
    NOTE["text"] = unconfined
    if len(argv) > 1 and argv[1] in devices:
        try:
            device_calls(argv[1])
        except Exception as exc:  # no device: the stages run with NumPy on this host's CPUs
            cpu = f"its NumPy calls ran on the worker's CPUs, not its {argv[1]} device: {type(exc).__name__}: {exc}"
            NOTE["text"] = "; ".join(filter(None, (unconfined, cpu[:300])))
    held = Held()
    while True:
        try:
            run_job(conn, held)
        except (EOFError, OSError):  # the worker is gone, or killed this job: nothing to answer
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "started by hand: no sandbox"))

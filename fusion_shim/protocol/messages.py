"""The messages, built and read in one place for both sides (their format: :mod:`.wire`).

The worker builds its replies (:func:`ready`, :func:`result`, :func:`error`, :func:`stats`) as a
:class:`Reply`, encoded once, after the keys that only the end of a request knows (``shm_mapped``)
are added. The client builds its requests (:func:`hello`, :func:`call_header`,
:func:`stats_request`) as a :class:`Request`, which the channel encodes once it knows where each
buffer goes, and reads what a ``result`` says beyond its arrays (:func:`read_timing`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from . import wire

WORKER_PHASES = ("h2d", "kernel", "d2h")  # the worker's own time in a result's ``timing``
_TIMED = frozenset((*WORKER_PHASES, "fingerprint"))  # the keys of ``timing`` read as seconds
# D354: floating results of these many bytes together are scanned by the worker, its copy still in cache
FINITE_SCAN_MIN, FINITE_SCAN_MAX = 4 << 10, 1 << 20
_all = np.logical_and.reduce  # what ndarray.all calls, without its Python wrapper


class Reply(NamedTuple):
    """A reply not yet encoded: its header, its arrays, their fingerprints, and where each array
    already lies in a client's shared-memory slot (a locator, or None for a frame)."""
    header: dict
    arrays: Sequence[np.ndarray] = ()
    fps: Sequence[str | None] | None = None
    locs: Sequence[dict | None] | None = None

    def frames(self, **extra: Any) -> list:
        """The reply's frames, ``extra`` added to its header."""
        header = {**self.header, **extra}
        if self.locs is None:
            return wire.encode(header, self.arrays, fps=self.fps)
        it = iter(self.locs)
        return wire.encode(header, self.arrays, fps=self.fps, place=lambda meta, buf: next(it))


class Request(NamedTuple):
    """A request not yet encoded: its header, its inputs through :func:`wire.to_wire`, their
    fingerprints, the indices that travel as references, and the results it declares
    (``(dtype, shape)`` pairs, which a shared-memory lane offers slots for). ``skeleton``: a
    :class:`~fusion_shim.protocol.skeleton.Skeleton` its reply is read from (D48); ``by_socket``:
    its buffers bypass the channel's shared-memory lane."""
    header: dict
    items: Sequence[tuple[dict, Any]] = ()
    fps: Sequence[str | None] | None = None
    refs: Sequence[int] = ()
    results: Sequence[tuple[Any, tuple]] = ()
    skeleton: Any = None
    by_socket: bool = False

    @property
    def id(self) -> int:
        return self.header["id"]

    def frames(self, place: wire.Place | None = None, **extra: Any) -> list:
        """The request's frames, ``extra`` added to its header; ``place`` as in :func:`wire.encode_wired`."""
        return wire.encode_wired({**self.header, **extra}, self.items, self.fps, self.refs, place)


# --- the worker's replies ---------------------------------------------------------------------------

def ready(rid: int, info: dict, health_s: float, shm: dict | None = None) -> Reply:
    """A ``hello`` answered: the worker's ``info`` (pid, device, bench, ...), its answer to a
    shared-memory offer, and how long the health check took."""
    return Reply({"t": "ready", "id": rid, **info, **({"shm": shm} if shm is not None else {}),
                  "health_s": health_s})


def result(rid: int, timing: dict, results: Sequence[np.ndarray], fps: Sequence[str | None] | None = None,
           locs: Sequence[dict | None] | None = None, **extra: Any) -> Reply:
    """A call's results, with the worker's phases (``timing``) and ``extra`` (``kept``, ``evicted``)."""
    return Reply({"t": "result", "id": rid, "timing": timing, **extra}, results, fps, locs)


def error(rid: int, kind: str, exc: str, msg: str, **extra: Any) -> Reply:
    """A request that failed: ``kind`` from ``wire.ERROR_KINDS``, the exception's type name, the message."""
    return Reply({"t": "error", "id": rid, "kind": kind, "exc": exc, "msg": msg, **extra})


def stats(rid: int, counters: dict) -> Reply:
    return Reply({"t": "stats", "id": rid, **counters})


def scans_finite(declared: Sequence[tuple[np.dtype, tuple]]) -> bool:
    """D354: whether a reply with these declared results (dtype, shape) says ``finite`` where it can:
    its floating results' bytes within the window (below it the client's own scan is as cheap)."""
    n = sum(math.prod(shape) * dt.itemsize for dt, shape in declared if dt.kind in "fc")
    return FINITE_SCAN_MIN <= n <= FINITE_SCAN_MAX


def all_finite(results: Sequence[np.ndarray]) -> bool:
    """Whether every floating result holds no inf or nan (``isfinite``, as the client's scan)."""
    return all(r.dtype.kind not in "fc" or _all(np.isfinite(r), axis=None) for r in results)


# --- the client's requests ---------------------------------------------------------------------------

def hello(rid: int, shm: dict | None = None) -> Request:
    """A ``hello``, with a shared-memory offer where the link may use one."""
    return Request({"t": "hello", "id": rid, **({"shm": shm} if shm is not None else {})})


def stats_request(rid: int, shm_drop: Sequence[str] | None = None) -> Request:
    """A ``stats`` request; ``shm_drop``: segment names the worker may unmap."""
    return Request({"t": "stats", "id": rid, **({"shm_drop": list(shm_drop)} if shm_drop else {})})


def call_header(rid: int, op: str, params: dict, layouts: list, results: Sequence[tuple[Any, tuple]],
                keep: bool = False) -> dict:
    """The header of a ``call`` of kernel ``op``; ``results``: the (dtype, shape) of each result, in
    NumPy's axes; ``keep``: the worker should keep the results and say their fingerprints."""
    # a result asked for in a permuted axis order travels transposed to it, and is declared so
    declared = [{"dtype": np.dtype(dt).str, "shape": [shape[i] for i in lay] if isinstance(lay, list) else list(shape)}
                for (dt, shape), lay in zip(results, layouts)]
    header = {"t": "call", "id": rid, "op": op, "params": params, "layouts": layouts, "results": declared}
    if keep:
        header["keep"] = True
    return header


class Timing(NamedTuple):
    """What a ``result`` says beyond its arrays."""
    phases: dict[str, float]   # the worker's h2d, kernel and d2h seconds, where it sent them
    fingerprint: float         # seconds the worker spent fingerprinting results it kept
    oom_retry: bool            # it ran out of device memory, freed its caches and ran the call again
    kept: frozenset[str]       # the call's input fingerprints it now holds
    evicted: tuple[str, ...]   # fingerprints it dropped to make room
    result_fps: tuple[str | None, ...]  # per result, its fingerprint where the worker kept it
    rejected: tuple[str, ...] = ()      # the times left out as impossible ("kernel=nan")


def read_timing(reply: dict) -> Timing:
    """The worker's account of a call from a ``result`` header. A time of the wrong type is left
    out; one that is not a finite number of seconds >= 0 too, and named in ``rejected``."""
    timing = reply.get("timing")
    if not isinstance(timing, dict):
        timing = {}
    phases: dict[str, float] = {}
    rejected = []
    for k, v in timing.items():
        t = type(v)
        if (t is float or t is int) and k in _TIMED:  # not a bool, whose type is its own
            if 0 <= v < math.inf:
                phases[k] = float(v)
            else:
                rejected.append(f"{k}={v}")
    fingerprint = phases.pop("fingerprint", 0.0)
    kept, evicted = reply.get("kept"), reply.get("evicted")
    metas = reply.get("arrays") or ()
    return Timing(phases, fingerprint, bool(timing.get("oom_retry")), frozenset(kept) if kept else frozenset(),
                  tuple(evicted) if evicted else (),
                  tuple([m["fp"] if isinstance(m, dict) and m.get("fp") else None for m in metas]), tuple(rejected))


# --- stages (opt-in: docs/stages.md) --------------------------------------------------------------------

def stage_header(rid: int, fn: dict | None, versions: dict, deadline_s: float, run: str | None = None) -> dict:
    """The header of a ``stage`` request: the function by reference (``fn``) or by value (None);
    ``run``: the client program's run, whose stages share one stage process on the worker."""
    header = {"t": "stage", "id": rid, "fn": fn, "versions": versions, "deadline_s": float(deadline_s)}
    if run is not None:
        header["run"] = run
    return header


def stage_result(rid: int, payload: np.ndarray, results: Sequence[np.ndarray], changed: Sequence[int],
                 changed_arrays: Sequence[np.ndarray], raised: bool, timing: dict, note: str = "") -> Reply:
    """A stage's answer: its pickled return value (or exception), the arrays it refers to, then the
    arguments changed in place (``changed``: their indices among the request's arrays after the payload)."""
    header = {"t": "result", "id": rid, "timing": timing, "nres": len(results), "changed": list(changed),
              "raised": bool(raised)}
    if note:  # what the report should say of where the stage's NumPy ran (D307)
        header["note"] = note
    return Reply(header, [payload, *results, *changed_arrays])


class StageAnswer(NamedTuple):
    """A stage's ``result`` read: the payload, the arrays it refers to, the changed arguments."""
    payload: np.ndarray
    results: list
    changed: list  # (index among the request's arrays after its payload, its new contents)
    raised: bool
    worker_s: float
    note: str = ""


def read_stage(reply: dict, arrays: list) -> StageAnswer:
    """Check a stage's ``result`` against its arrays; raises :class:`wire.WireError` on a mismatch."""
    nres, changed = reply.get("nres"), reply.get("changed")
    if not isinstance(nres, int) or not isinstance(changed, list) or not arrays:
        raise wire.WireError("a stage result needs 'nres', 'changed' and a payload")
    if 1 + nres + len(changed) != len(arrays) or not all(isinstance(i, int) and i >= 0 for i in changed):
        raise wire.WireError(f"a stage result of {len(arrays)} arrays does not match nres={nres}, {len(changed)} changed")
    if arrays[0].dtype != np.uint8 or arrays[0].ndim != 1:
        raise wire.WireError("a stage's payload must be one-dimensional |u1")
    timing = reply.get("timing") if isinstance(reply.get("timing"), dict) else {}
    worker_s = timing.get("stage", 0.0)
    worker_s = float(worker_s) if isinstance(worker_s, (int, float)) and math.isfinite(worker_s) else 0.0
    return StageAnswer(arrays[0], list(arrays[1:1 + nres]), list(zip(changed, arrays[1 + nres:])),
                       reply.get("raised") is True, max(worker_s, 0.0),
                       str(reply["note"])[:300] if isinstance(reply.get("note"), str) else "")


# --- the stage pipe: a worker and its stage process (:mod:`.wire`, "The stage pipe") -----------------

class PipeAnswer(NamedTuple):
    """What a stage process answered: its header, the pickled value, and its arrays."""
    header: dict
    value: bytes = b""
    arrays: Sequence[np.ndarray] = ()


def send_stage_job(conn: Any, fn: Any, metas: list, payload: Any, arrays: Sequence[Any]) -> None:
    """A job for the stage process: ``arrays`` one per meta, references (no buffer) skipped."""
    conn.send_bytes(wire.pack_map({"fn": fn, "metas": metas}))
    conn.send_bytes(payload)
    for a in arrays:
        if not isinstance(a, wire.Ref):
            conn.send_bytes(a.reshape(-1, order="A").view(np.uint8) if a.size else b"")


def recv_stage_job(conn: Any) -> tuple[dict, bytes]:
    """A job's header and payload, in the stage process; its buffers follow, one per plain meta."""
    return wire.unpack_map(conn.recv_bytes()), conn.recv_bytes()


def send_stage_answer(conn: Any, header: dict, buffers: Sequence[Any] = ()) -> None:
    conn.send_bytes(wire.pack_map(header))
    for buf in buffers:
        conn.send_bytes(buf)


def recv_stage_answer(conn: Any, max_bytes: int) -> PipeAnswer:
    """A stage process's answer, read as a client's message is: the header bounded, the metas checked
    and their total within ``max_bytes`` before a buffer is read, each buffer exactly its size (a
    longer one is an ``OSError`` from the pipe, a shorter one a :class:`wire.WireError`)."""
    header = wire.unpack_map(conn.recv_bytes(wire.MAX_HEADER))
    if not header.get("ok"):
        return PipeAnswer(header)
    checked = wire.checked_metas(header.get("metas"), max_bytes)
    value = conn.recv_bytes(max_bytes)
    arrays = []
    for dt, shape, order, nbytes in checked:
        buf = conn.recv_bytes(max(nbytes, 1))
        if len(buf) != nbytes:
            raise wire.WireError(f"a buffer of {len(buf)} bytes where its meta needs {nbytes}")
        arrays.append(np.frombuffer(buf, dtype=dt).reshape(shape, order=order))
    return PipeAnswer(header, value, arrays)

"""One record per intercepted call that left the fast path, and the aggregates the report reads.

Memory stays bounded for long runs: full records are kept up to ``MAX_RECORDS``; aggregates per op
are always exact. Calls that the fast path kept local (below the size floor) are only counted.
"""
from __future__ import annotations

import _thread  # D36: threading's locks are these, without loading threading
import os
import sys
import time
from collections import Counter, defaultdict
from operator import add as _add
from typing import Any, Callable, Sequence

MAX_RECORDS = 10_000  # full records kept in all
MAX_PER_SITE = 2_000  # ... and per call site; past it a site is only aggregated (long loops)
# Production phases in the order a call goes through them. "verify" (a check's local recompute) is
# kept apart: it is reported on its own line, never inside these.
# "abandoned": an exploration's wait for a worker that ran out of its deadline, before the call ran here.
PHASES = ("wait_ready", "link_probe", "fingerprint", "encode", "send", "transfer", "h2d", "kernel", "d2h", "decode",
          "abandoned", "local")


UNCLASSIFIED = "unclassified"  # fallbacks_by_kind's key for a fallback recorded without its kind
_LISTS, _DICTS = ("shapes", "dtypes"), ("phases",)  # fields whose default is a fresh container


class Record:
    """One call: what it was, what was decided and why, and where its time went. A plain class with
    ``__slots__`` (D36): a dataclass's generated methods cost their exec at NumPy's import. ``plan``
    (the call path's decision) is set by the call path and is not a field. D351: the fields most
    calls leave as they are (``_RARE``) are class-level defaults, given by keyword, an instance's
    own value (in its ``__dict__``) only once one is set."""

    __slots__ = ("op", "family", "site", "shapes", "dtypes", "kind", "reason", "predicted_local_s",
                 "predicted_remote_s", "phases", "bytes_sent", "bytes_received", "wall_s", "start_s", "thread",
                 "shm_sent", "shm_received", "worker", "repeated", "plan", "__dict__")
    FIELDS = ("op", "family", "site", "shapes", "dtypes", "kind", "reason", "fallback", "predicted_local_s",
              "predicted_remote_s", "phases", "bytes_sent", "bytes_received", "wall_s", "start_s", "raised",
              "thread", "verify", "local_measured_s", "resident_hits", "bytes_saved", "resends", "evictions",
              "shm_sent", "shm_received", "worker", "repeated", "cdtype", "flops", "bytes_in", "bytes_out",
              "params", "inputs", "results")
    # where kind is "fallback": why, an errors.FallbackKind (D323); reason: the detail
    fallback: Any = None
    raised: str | None = None            # the exception NumPy raised, if it did
    verify: str | None = None            # "ok" or "mismatch: ..." when the call was checked
    local_measured_s: float | None = None  # NumPy's own time for this call, when a check measured it
    resident_hits = 0                    # inputs sent by reference: the worker held them
    bytes_saved = 0                      # ... and their bytes, which did not travel
    resends = 0                          # references the worker no longer held, resent by value
    evictions = 0                        # entries the worker dropped from its store during this call
    # what a replay needs (fusion_shim.replay): the planner's view of the call (where not given: its
    # plan's, read by as_dict), its scalar arguments, and buffer tokens of its inputs and results
    # (Ledger.trace_io)
    cdtype: str | None = None
    flops: float | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    params: dict | None = None
    inputs: list | None = None
    results: list | None = None

    def __init__(self, op: str, family: str, site: str = "?", shapes: Sequence = (),
                 dtypes: Sequence = (), kind: str = "local", reason: str = "",
                 predicted_local_s: float | None = None, predicted_remote_s: float | None = None,
                 phases: dict[str, float] | None = None, bytes_sent: int = 0, bytes_received: int = 0,
                 wall_s: float = 0.0, start_s: float = 0.0, thread: int = 0, shm_sent: int = 0,
                 shm_received: int = 0, worker: int | None = None, repeated: bool = False, **rare: Any):
        self.op = op
        self.family = family
        self.site = site
        # D351: replaced whole, never changed in place: none yet is a shared empty tuple (as_dict makes lists)
        self.shapes = shapes
        self.dtypes = dtypes
        # "worker" | "local" (decided) | "unsupported" | "fallback" | "raised" (NumPy raised the
        # program's own error here: never a fallback)
        self.kind = kind
        self.reason = reason
        self.predicted_local_s = predicted_local_s
        self.predicted_remote_s = predicted_remote_s
        self.phases = {} if phases is None else phases
        self.bytes_sent = bytes_sent
        self.bytes_received = bytes_received
        self.wall_s = wall_s
        self.start_s = start_s          # since the run started
        self.thread = thread            # threading.get_ident() of the calling thread (trace tracks)
        self.shm_sent = shm_sent        # input bytes that went through shared memory, not the socket
        self.shm_received = shm_received  # ... and result bytes that came back that way
        self.worker = worker            # the index of the worker that answered it (the trace's device tracks)
        self.repeated = repeated        # sent from the template of an earlier call with its layout (D45)
        if rare:
            unknown = rare.keys() - _RARE
            if unknown:
                raise TypeError(f"Record() got unknown fields {sorted(unknown)}")
            self.__dict__.update(rare)

    def as_dict(self) -> dict[str, Any]:
        """The fields, containers copied (what the JSON report holds)."""
        out = {name: getattr(self, name) for name in Record.FIELDS}
        planned = getattr(self, "plan", None)
        if planned is not None and out["flops"] is None:  # D351: read here, not copied on every call
            call = planned.call
            out["cdtype"], out["flops"], out["bytes_in"], out["bytes_out"] = (call.dtype, call.flops, call.bytes_in,
                                                                              call.bytes_out)
        for name in _LISTS:
            out[name] = list(out[name])
        for name in _DICTS:
            out[name] = dict(out[name])
        for name in ("inputs", "results"):
            if out[name] is not None:
                out[name] = list(out[name])
        return out

    def __eq__(self, other: object) -> bool:
        return self.as_dict() == other.as_dict() if type(other) is Record else NotImplemented

    __hash__ = None  # mutable: compared by value, so not hashable

    def __repr__(self) -> str:
        return f"Record({self.op!r}, kind={self.kind!r}, reason={self.reason!r}, wall_s={self.wall_s!r})"


_RARE = frozenset(Record.FIELDS) - set(Record.__slots__)  # D351: the fields set by keyword, defaults on the class


def call_site(depth: int = 2) -> str:
    """file:line of the first frame outside numpy, wrapt and fusion_shim: the user's line."""
    frame = sys._getframe(depth)
    library = _library
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        known = library.get(filename)
        if known is None:
            known = library[filename] = _is_library(filename)
        if not known:
            # D49: a frame's line is read off its code's line table from the start: made once per place
            key = (id(code), frame.f_lasti)
            made = _sites.get(key)
            if made is None:
                made = (code, f"{filename}:{frame.f_lineno}")
                if len(_sites) < SITES_MAX:
                    _sites[key] = made
            return made[1]
        frame = frame.f_back
    return "?"


_library: dict[str, bool] = {}  # by file name: whether its frames are skipped (a program has few files)
# places whose file:line is kept: (id of the code, instruction offset) -> (the code, held so that
# its id is not another's, and its site)
SITES_MAX = 4096
_sites: dict[tuple[int, int], tuple[Any, str]] = {}


def _is_library(filename: str) -> bool:
    return (f"{os.sep}numpy{os.sep}" in filename or f"{os.sep}wrapt{os.sep}" in filename
            or f"{os.sep}fusion_shim{os.sep}" in filename)


class Ledger:
    def __init__(self, trace_io: bool = False, unready: bool = False) -> None:
        self.lock = _thread.allocate_lock()
        # with a JSON report: each recorded call's inputs and results as buffer tokens (a replay's residency)
        self.tracing = trace_io
        self.buffers = Buffers()
        self.started = time.perf_counter()
        self.records: list[Record] = []
        self.dropped = 0
        self.ops: dict[str, dict[str, Any]] = defaultdict(_new_op)
        self.sites: dict[tuple[str, str], dict[str, Any]] = {}  # by (site, op): one line may call several ops
        # calls kept local by the size floor: one list cell per op, bumped by the interceptor's
        # fast path without a lock or a lookup (a count, not a record; see intercept)
        self.fast_path: dict[str, list[int]] = defaultdict(lambda: [0])
        # unready: every floor is NEVER until a worker is first ready (policy auto): the fast path's
        # counts until then are calls no worker was ready for, not calls below a floor (worker_ready)
        self.unready: dict[str, int] | None = None if unready else {}
        self.events: list[tuple[float, str]] = []  # worker lifecycle: started, ready, faults
        # the same counts kept in C (the trampolines and the C fast path): (read, reset),
        # read() -> {op: calls kept local by the floor}
        self.counters: list[tuple[Callable[[], dict[str, int]], Callable[[], None]]] = []
        # seconds the shim spent starting, per phase (bootstrap, launcher, interception at NumPy's
        # import, each part made on first need): kept apart from every call's time
        self.startup: dict[str, float] = {}
        # thread id -> a list that gets that thread's records too, uncapped (a stage measured here
        # counts the calls it made: :mod:`fusion_shim.stages.runner`)
        self.taps: dict[int, list[Record]] = {}

    def clear(self) -> None:
        """Forget every record, aggregate and event (a new phase of a run; tests)."""
        with self.lock:
            self.records.clear()
            self.dropped = 0
            self.ops.clear()
            self.sites.clear()
            self.events.clear()
            for cell in self.fast_path.values():
                cell[0] = 0  # the same cells: the interceptor's wrappers hold them
            if self.unready is not None:
                self.unready = {}  # a worker was ready: what is counted from now on is below a floor

    def reset_after_fork(self) -> None:
        """A forked child reports its own calls, not its parent's: start afresh (a new lock too,
        since another thread of the parent may have held the old one at the fork)."""
        self.lock = _thread.allocate_lock()
        self.clear()
        self.startup = {}  # the parent paid for what it loaded; the child's own first needs count

    def worker_ready(self) -> None:
        """A worker is ready for the first time: the fast path's counts so far were made while none
        was (kept apart as ``no_worker``); those from now on are calls below a floor."""
        with self.lock:
            if self.unready is None:
                self.unready = self._below_locked()

    def add_startup(self, phase: str, seconds: float) -> None:
        with self.lock:
            self.startup[phase] = self.startup.get(phase, 0.0) + seconds

    def now(self) -> float:
        return time.perf_counter() - self.started

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append((self.now(), text))

    def add(self, rec: Record) -> None:
        with self.lock:
            agg = self.ops[rec.op]
            agg["family"] = rec.family
            agg["calls"] += 1
            agg[rec.kind] += 1
            agg["bytes_sent"] += rec.bytes_sent
            agg["bytes_received"] += rec.bytes_received
            agg["wall_s"] += rec.wall_s
            # D49: per tuple of phase names (an op's calls mostly have one), the sums of their seconds
            by_names, names = agg["phases"], tuple(rec.phases)
            sums = by_names.get(names)
            if sums is None:
                by_names[names] = list(rec.phases.values())
            else:
                sums[:] = map(_add, sums, rec.phases.values())
            agg["repeated"] += rec.repeated
            # the counts most calls leave at zero, added only where one is not
            if rec.shm_sent or rec.shm_received:
                agg["shm_sent"] += rec.shm_sent
                agg["shm_received"] += rec.shm_received
            if rec.resident_hits or rec.bytes_saved or rec.resends or rec.evictions:
                agg["resident_hits"] += rec.resident_hits
                agg["bytes_saved"] += rec.bytes_saved
                agg["resends"] += rec.resends
                agg["evictions"] += rec.evictions
            if rec.verify is not None:
                agg["verified"] += 1
                agg["mismatches"] += rec.verify != "ok"
            if rec.kind in ("unsupported", "fallback", "raised"):
                agg["reasons"][f"{rec.kind}: {rec.reason}"] += 1
                if rec.kind == "fallback":
                    agg["fallbacks_by_kind"][rec.fallback or UNCLASSIFIED] += 1
            key = (rec.site, rec.op)
            site = self.sites.get(key)
            if site is None:
                site = self.sites[key] = {"site": rec.site, "op": rec.op, "calls": 0, "wall_s": 0.0, "worker": 0,
                                          "verify_s": 0.0}
            site["calls"] += 1
            site["wall_s"] += rec.wall_s
            site["worker"] += rec.kind == "worker"
            if "verify" in rec.phases:
                site["verify_s"] += rec.phases["verify"]
            if len(self.records) < MAX_RECORDS and site["calls"] <= MAX_PER_SITE:
                self.records.append(rec)
            else:
                self.dropped += 1
            if self.taps:
                tap = self.taps.get(rec.thread)
                if tap is not None:
                    tap.append(rec)

    def snapshot_ops(self) -> dict[str, dict[str, Any]]:
        """The per-op aggregates now, the size floor's counts included (a copy)."""
        with self.lock:
            return self._ops_locked()

    def _ops_locked(self) -> dict[str, dict[str, Any]]:
        ops = {}
        for name, agg in sorted(self.ops.items()):
            ops[name] = {**agg, "reasons": dict(agg["reasons"]), "phases": _phase_sums(agg["phases"]),
                         "fallbacks_by_kind": {str(k): n for k, n in agg["fallbacks_by_kind"].items()}}
        below = self._below_locked()
        unready = below if self.unready is None else self.unready
        for name, n in below.items():
            if n:
                op = ops.setdefault(name, {**_new_op(), "reasons": {}, "phases": {}, "fallbacks_by_kind": {}})
                op["no_worker"] = min(unready.get(name, 0), n)
                op["below_floor"] = n - op["no_worker"]
        return ops

    def _below_locked(self) -> dict[str, int]:
        """The fast path's counts per op (Python cells and C counters), since the run or a clear."""
        below = {name: n for name, (n,) in self.fast_path.items()}
        for read, _ in self.counters:
            for name, n in read().items():
                below[name] = below.get(name, 0) + n
        return below

    def trace_io(self, rec: Record, args: tuple, kwargs: dict, result: Any) -> None:
        """After a recorded call returned: its scalar arguments, and tokens for its array inputs and
        results (the same token for the same live buffer: what a worker could already hold)."""
        with self.lock:
            try:
                rec.params, rec.inputs, rec.results = self.buffers.trace(args, kwargs, result)
            except Exception as exc:  # an odd array-like: the call is recorded without its buffers, never raised
                self.events.append((self.now(), f"buffers of a {rec.op} call not traced: {type(exc).__name__}"))

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            ops = self._ops_locked()
            return {
                "ops": ops,
                "sites": {f"{site} {op}": dict(v) for (site, op), v in self.sites.items()},
                "events": [{"t_s": t, "what": w} for t, w in self.events],
                "records": [r.as_dict() for r in self.records],
                "records_dropped": self.dropped,
                "startup": dict(self.startup),
                # D238: the records are a sample (the first calls, MAX_PER_SITE per site): a replay scales by site
                "sample": {"kept": len(self.records), "dropped": self.dropped, "max_records": MAX_RECORDS,
                           "max_per_site": MAX_PER_SITE, "traced": self.tracing},
            }


BUFFERS_MAX = 4096  # buffer tokens held; the oldest forgotten first (its buffer then reads as new)
_SCALARS = (bool, int, float, str, type(None))


class Buffers:
    """Tokens for array buffers: one per (address, shape, strides, dtype) while the array that owns
    it lives (a weak reference tells a freed buffer's address reused); a result always gets a new
    one (D239: by address, not content: a recording never hashes the program's data)."""

    def __init__(self) -> None:
        self._held: dict[tuple, tuple[Any, int]] = {}
        self._next = 0

    def _key(self, arr: Any) -> tuple:
        return (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str)

    def _token(self, arr: Any, fresh: bool) -> int:
        import weakref

        key = self._key(arr)
        held = self._held.get(key)
        if held is not None and not fresh and held[0]() is not None:
            return held[1]
        self._next += 1
        root = arr
        while getattr(root, "base", None) is not None and hasattr(root.base, "__array_interface__"):
            root = root.base
        try:
            ref = weakref.ref(root)
        except TypeError:  # a base that takes no weak reference: held for the run
            ref = (lambda r: (lambda: r))(root)
        self._held.pop(key, None)
        self._held[key] = (ref, self._next)
        if len(self._held) > BUFFERS_MAX:
            self._held.pop(next(iter(self._held)))
        return self._next

    def trace(self, args: tuple, kwargs: dict, result: Any) -> tuple[dict, list[int], list[int]]:
        params: dict[str, Any] = {}
        inputs: list[int] = []
        for i, value in enumerate((*args, *kwargs.values())):
            name = str(i) if i < len(args) else list(kwargs)[i - len(args)]
            if isinstance(value, type):  # a dtype given as its scalar type (einsum's dtype=np.float32)
                params[name] = value.__name__
            elif hasattr(value, "__array_interface__"):
                inputs.append(self._token(value, fresh=False))
            elif isinstance(value, _SCALARS) or (isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)):
                params[name] = value
        outs = result if isinstance(result, tuple) else (result,)
        results = [self._token(r, fresh=True) for r in outs if hasattr(r, "__array_interface__")]
        return params, inputs, results


def _phase_sums(by_names: dict[tuple, list]) -> dict[str, float]:
    """An op's seconds per phase, from its sums per tuple of phase names."""
    out: dict[str, float] = {}
    for names, sums in by_names.items():
        for name, seconds in zip(names, sums):
            out[name] = out.get(name, 0.0) + seconds
    return out


def _new_op() -> dict[str, Any]:
    return {"family": "", "calls": 0, "worker": 0, "local": 0, "unsupported": 0, "fallback": 0,
            "raised": 0, "below_floor": 0, "no_worker": 0, "verified": 0, "mismatches": 0, "repeated": 0,
            "resident_hits": 0, "bytes_saved": 0, "resends": 0, "evictions": 0, "bytes_sent": 0, "bytes_received": 0,
            "shm_sent": 0, "shm_received": 0, "wall_s": 0.0,
            "phases": {}, "reasons": Counter(), "fallbacks_by_kind": Counter()}

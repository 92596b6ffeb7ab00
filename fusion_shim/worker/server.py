"""The worker: a ZeroMQ ROUTER that answers ``hello`` once warm and ``call`` with a kernel's results.

It imports nothing of the client side (no interceptor, planner or ledger). Every request is
validated (:func:`fusion_shim.protocol.wire.decode`) before anything is allocated; whatever a
request does wrong is answered with an ``error`` reply and the loop goes on: a client can make a
call fail, never the worker.

Security and faults:

- A tcp address, loopback included, needs ``keys`` (CURVE with a ZAP allow-list,
  :mod:`fusion_shim.auth`) or ``insecure=True``, which warns loudly; ``ipc://`` relies on its
  directory and on the peer's uid (D60). ``max_bytes`` is the budget of one message; it is
  ZeroMQ's ``MAXMSGSIZE`` on the socket as well, so a larger frame is dropped with its connection
  before it is buffered; what one principal has waiting is bounded too (D69, :mod:`.inbox`).
- Connections past a total and a per-principal limit are shut, never a crash (D193,
  :mod:`.connections`); a principal's data goes a grace after its last connection closed (D195).
- A call declares its results; they count against the budget before the kernel runs, FFT sizes
  (``n``, ``s``) must fit them, a call whose shapes make more result elements than it declared
  (:mod:`.shapes`: ``kron``, ``outer``, ``einsum``, ...) is refused before it runs (D61), and a
  kernel that returns anything else is answered with an error.
- Out of memory: the caller's resident entries are dropped (but for this call's inputs), caches are
  freed and the call is tried once more, then answered with an ``out_of_memory`` error (the client
  computes it locally).
- ``hello`` runs a health check through the same path as a call and compares the answer exactly.

Principals (D60, :mod:`fusion_shim.transport.principal`): each request belongs to the principal of
its connection (a CURVE key, an ``ipc://`` peer's uid, else one anonymous principal). Resident
entries, mapped segments, counters and stats are kept per principal; nothing of one is visible to
another.

Residency: inputs a client tags with a fingerprint and results of at least
``protocol.fingerprint.RESIDENT_MIN`` bytes stay on the device in :class:`.store.ResidentStore`; a
reference the store does not hold for the caller's principal is answered ``missing``. An input is
kept only when the bytes that came hash to its tag (D59): a client's wrong tag costs it the reuse,
never another call its answer. A backend without ``to_device`` / ``compute`` / ``to_host`` (a test
backend) keeps nothing and answers every reference ``missing``.

Shared memory: on a same-host link (``ipc://``, ``inproc://``) clients may put buffers in shared memory
(:mod:`fusion_shim.transport.shm`): inputs are read from the client's segments (staged to a GPU
through pinned memory), results are written into the slots a call offers, and the segments of a
client that died are swept while idle. Kernels written with numba.cuda (:mod:`.numba_kernels`) join
torch's where they can run; ``ready`` lists the kernels this worker has.
"""
from __future__ import annotations

import inspect
import math
import os
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

from ..protocol import messages, wire
from ..protocol.fingerprint import RESIDENT_MIN, fingerprint
from ..protocol.forms import ResultForm
from ..transport import check_url
from ..transport import shm_common
from ..transport.shm_worker import ShmMapper
from ..transport.principal import ANON, Principal
from . import planned
from .inbox import DRAIN_MIN, Inbox, principal_budget, trim_heap
from .listen import INSECURE_WARNING, QUEUED_PER_CONNECTION, Listener  # noqa: F401  (names tests import)
from .memory import MAX_MESSAGE_BYTES, default_max_bytes, free_memory, is_oom  # noqa: F401  (tests import)
from .plans import Plans
from .shapes import over_declared, size_params_over
from .store import ResidentStore, default_budget

TRIM_AFTER = 64 << 20  # D197: received since the last trim, an idle loop trims the heap
TRIM_TAIL_S = 1.0  # and a smaller tail of large messages a second after the last trim
ALIGN = 16  # bytes: inputs a CPU kernel reads in place start at a multiple of this
_HEALTH_A = np.array([[1.0, 2.0], [3.0, 4.0]])
_HEALTH_B = np.array([[5.0, 6.0], [7.0, 8.0]])
_HEALTH_AB = np.array([[19.0, 22.0], [43.0, 50.0]])  # exact in binary floating point


class Worker:
    """``backend`` and ``kernels`` default to torch (:mod:`.kernels`); tests may give a NumPy pair
    (a backend has ``device``, ``warm()``, ``run(kernel, arrays, params, layouts)``)."""

    def __init__(self, device: str = "auto", memory_budget: int | None = None, *,
                 max_bytes: int | None = None, backend: Any = None, kernels: dict | None = None,
                 bench_cache: bool = True, allow_code: str | None = None):
        self.numba = "unavailable: a test backend"
        if backend is None:
            from .backend import TorchBackend  # torch only here, on the worker side
            from .kernels import KERNELS
            from .numba_kernels import numba_kernels

            backend = TorchBackend(device, bench_cache)
            extra, self.numba = numba_kernels(backend.device.type)  # where they can run
            kernels = {**KERNELS, **extra}
        self.kernels = kernels
        self.backend = backend
        self.max_bytes = default_max_bytes(getattr(backend, "device", None)) if max_bytes is None else max_bytes
        self.traffic: dict[str, dict[str, int]] = {}  # principal -> call messages, counted at the socket
        self.info: dict[str, Any] = {}
        self.last_was_call = False
        self.resident = hasattr(backend, "compute")  # residency needs a device-level backend
        budget = memory_budget if memory_budget is not None else (
            default_budget(backend.device) if self.resident else 0)
        self.store = ResidentStore(budget)
        self.fingerprint_mismatches: dict[str, int] = {}  # principal -> inputs not hashing to their tag
        self.shm: ShmMapper | None = None  # clients' segments, on a same-host link
        self.principal = ANON  # whose request is being handled
        self.allow_code = allow_code  # code from clients (docs/stages.md)
        self.stages = None  # its host, made at the first stage request (D177)
        self._first_stage: Callable[[], None] | None = None
        self.plans = Plans()  # D75: admitted plain calls, by their header but for its id

    def stage_host(self, frames: list) -> Any:
        """The stage host where ``frames`` may be a stage request this worker could take, else None."""
        if not self.allow_code or len(frames) < 2 or not wire.may_be_stage(frames[1]):
            return None
        if self.stages is None:
            from .stages import StageHost

            device_type = getattr(getattr(self.backend, "device", None), "type", "cpu")
            self.stages = StageHost(self.allow_code, self.max_bytes, device_type)
            if self._first_stage is not None:
                self._first_stage()
        return self.stages

    def at_first_stage(self, fn: Callable[[], None]) -> None:
        """``fn`` runs, in the serving thread, when the first stage request makes the stage host."""
        self._first_stage = fn

    def abandon_stages(self) -> None:
        """As this process dies by a signal: its stage processes and their directories go (D187)."""
        if self.stages is not None:
            self.stages.abandon()

    def enable_shm(self, url: str) -> None:
        """Offer the shared-memory lane to clients of ``url``: same-host schemes only, never tcp."""
        if check_url(url) in ("ipc", "inproc") and shm_common.available():
            self.shm = ShmMapper(self.max_bytes)

    def idle(self) -> None:
        """Housekeeping between requests: the segments of clients that died are swept (at most
        once a second, so a worker that is never idle still sweeps)."""
        if self.shm is not None:
            self.shm.sweep()

    def warm(self, shared: bool = False) -> None:
        """Warm up and self-benchmark; ``shared``: this worker shares its CPUs with the program that
        started it (an embedded worker), so its benchmark stays short."""
        if self.numba == "simulator":  # never mistaken for a GPU run
            print("fusion_shim worker: numba kernels run under numba's CUDA SIMULATOR (NUMBA_ENABLE_CUDASIM=1): "
                  "for tests only, far slower than NumPy", file=sys.stderr, flush=True)
        # a backend's warm() takes no argument (a test backend's, say); torch's also takes ``shared``
        takes_shared = "shared" in inspect.signature(self.backend.warm).parameters
        bench = self.backend.warm(shared=shared) if takes_shared else self.backend.warm()
        torch = sys.modules.get("torch")  # loaded by the torch backend; a test backend has none
        self.info = {"pid": os.getpid(), "device": str(self.backend.device),
                     "torch": getattr(torch, "__version__", "none"), "bench": bench, "memory_budget": self.store.budget,
                     "max_bytes": self.max_bytes, "numba": self.numba, "kernels": sorted(self.kernels),
                     "boot": shm_common.boot_id()}  # which machine: a client there shares its CPUs

    def health(self) -> str | None:
        """A small matmul through the call path (to the device and back), its answer checked
        exactly; None when healthy, else what went wrong."""
        try:
            out, _ = self.backend.run(self.kernels["matmul"], [_HEALTH_A, _HEALTH_B], {"cdtype": "<f8"}, ["C"])
        except Exception as exc:
            return f"health check raised {type(exc).__name__}: {exc}"[:500]
        if len(out) != 1 or not np.array_equal(out[0], _HEALTH_AB):
            return f"health check: a 2x2 matmul gave {[np.asarray(o).tolist() for o in out]}, not {_HEALTH_AB.tolist()}"
        return None

    def stats(self, principal: Principal) -> dict[str, Any]:
        """What ``principal`` may learn of this worker: its own traffic, entries, segments and mismatches."""
        traffic = self.traffic.get(principal.name, {"calls": 0, "bytes_in": 0, "bytes_out": 0, "busy": 0})
        shm_stats = self.shm.stats_for(principal) if self.shm is not None else {}
        return {**traffic, **self.store.stats(principal.name), **shm_stats,
                "fingerprint_mismatches": self.fingerprint_mismatches.get(principal.name, 0)}

    def forget(self, name: str) -> int:
        """D195: principal ``name``'s run ended (its last connection closed a grace ago): its
        resident entries, plans and counters go, and the memory they took goes back to the system."""
        freed = self.store.forget(name)
        self.plans.forget(name)
        self.traffic.pop(name, None)
        self.fingerprint_mismatches.pop(name, None)
        if freed:
            free_memory(self.backend)
        if self.shm is not None:
            freed += self.shm.release()  # the input buffers its entries held stay mapped for reuse otherwise
        if freed:
            trim_heap()
        return freed

    def count(self, principal: Principal, bytes_in: int, bytes_out: int) -> None:
        """A call message answered for ``principal``: its bytes each way."""
        t = self.traffic.get(principal.name) or self._traffic(principal)  # D346: a known principal's, no call
        t["calls"] += 1
        t["bytes_in"] += bytes_in
        t["bytes_out"] += bytes_out

    def count_busy(self, principal: Principal) -> None:
        """A request of ``principal`` answered ``busy`` past its budget (D270), before it was handled."""
        self._traffic(principal)["busy"] += 1

    def _traffic(self, principal: Principal) -> dict[str, int]:
        t = self.traffic.get(principal.name)
        if t is None:
            t = self.traffic[principal.name] = {"calls": 0, "bytes_in": 0, "bytes_out": 0, "busy": 0}
        return t

    def handle(self, frames: list, principal: Principal = ANON) -> list:
        """One request of ``principal`` in, one reply out; never raises."""
        self.principal = principal
        if self.resident and (answered := self._planned(frames)) is not None:
            return answered  # D76: a planned call on a device-level backend, answered in one pass
        reply = self._handle(frames)
        mapped = self.shm.take_new() if self.shm is not None else None
        # the client may unlink the names mapped while handling it
        return reply.frames(shm_mapped=mapped) if mapped else reply.frames()

    def _planned(self, frames: list) -> list | None:
        """D76: a planned call's reply frames in one pass; None: answer it through the general path."""
        who = self.principal
        hit = self.plans.find(who.name, frames, self.max_bytes)
        if hit is None:
            return None
        rid, arrays, plan = hit
        if (kernel := self.kernels.get(plan.header["op"])) is None:
            return None
        self.last_was_call = True
        return planned.answer(self.backend, kernel, plan, rid, arrays, self.shm, who)

    def _handle(self, frames: list) -> messages.Reply:
        rid = 0
        self.last_was_call = False
        try:
            hit = self.plans.find(self.principal.name, frames, self.max_bytes)
            # D79: a plan with segment inputs is decoded in full here (its reads, its errors)
            if hit is not None and not hit[2].segments and (kernel := self.kernels.get(hit[2].header["op"])) is not None:
                rid, arrays, plan = hit
                self.last_was_call = True
                return self._execute(rid, plan.header, arrays, kernel, *plan.admitted)
            early = None
            if self.shm is not None and frames:
                early = wire.decode_header(frames[0])
                rid = early["id"]  # a segment that cannot give an input is answered under its request's id
                self.shm.drop(early.get("shm_drop"), self.principal)
            segments = self.shm.acting_for(self.principal) if self.shm is not None else None
            header, arrays = wire.decode(frames, max_bytes=self.max_bytes, segments=segments, header=early)
            rid = header["id"]
            kind = header["t"]
            self.last_was_call = kind == "call"
            if kind == "stats":
                return messages.stats(rid, self.stats(self.principal))
            if kind == "hello":
                t = time.perf_counter()
                sick = self.health()
                if sick is not None:
                    return messages.error(rid, "unhealthy", "HealthCheck", sick)
                shm = None
                if "shm" in header:
                    shm = (self.shm.answer_probe(header["shm"], self.principal) if self.shm is not None
                           else {"ok": False, "why": "this worker's link is not same-host (ipc://)"})
                return messages.ready(rid, self.info, time.perf_counter() - t, shm)
            if kind == "stage":  # a worker with code allowed takes these before they reach here
                return messages.error(rid, "refused", "CodeRefused", "this worker was started without --allow-code")
            if kind != "call":
                return messages.error(rid, "bad_request", "WireError", f"a worker does not accept {kind!r}")
            return self._call(rid, header, arrays, frames[0])
        except wire.WireError as exc:
            return messages.error(rid, "version" if "version" in str(exc) else "bad_request", "WireError", str(exc))
        except Exception as exc:  # the boundary: any fault becomes a reply, the loop stays up
            return messages.error(rid, "kernel_error", type(exc).__name__, str(exc))

    def _call(self, rid: int, header: dict, arrays: list, frame: Any) -> messages.Reply:
        try:
            admitted = self._admit(header, arrays)
        except _Refusal as no:
            return messages.error(rid, no.kind, no.exc, str(no))
        self.plans.learn(self.principal.name, frame, header, arrays, admitted[1:], self.max_bytes,
                         lambda: ResultForm(admitted[1], self.resident))
        return self._execute(rid, header, arrays, *admitted)

    def _admit(self, header: dict, arrays: list) -> tuple[Any, list, list, list]:
        """The call's kernel, declared results, result slots as opened and as offered; raises
        :class:`_Refusal` for a call that is not admitted."""
        kernel = self.kernels.get(header.get("op"))
        if kernel is None:
            raise _Refusal("unknown_op", "KeyError", f"no kernel {header.get('op')!r}")
        params, layouts = header.get("params"), header.get("layouts")
        if not isinstance(params, dict) or not isinstance(layouts, list) or "cdtype" not in params:
            raise _Refusal("bad_request", "WireError", "a call needs 'params' with 'cdtype' and 'layouts'")
        if not isinstance(params["cdtype"], str) or params["cdtype"] not in wire.DTYPES:
            raise _Refusal("bad_request", "WireError", f"cdtype {params['cdtype']!r} is not accepted")
        declared = wire.declared_results(
            header.get("results"), self.max_bytes - sum(a.nbytes for a in arrays if not isinstance(a, wire.Ref)))
        if len(declared) != len(layouts):
            raise _Refusal("bad_request", "WireError", f"{len(declared)} declared results, {len(layouts)} layouts")
        too_big = size_params_over(header["op"], params, declared) or over_declared(
            header["op"], arrays, params, declared)  # D61: before any allocation
        if too_big:
            raise _Refusal("bad_request", "WireError", too_big)
        slots = header.get("out_shm") if self.shm is not None else None
        if not isinstance(slots, list) or len(slots) != len(declared):
            slots = [None] * len(declared)
        # result slots in the client's segments, opened before the kernel: a bad one is a bad request
        dests = [None if slot is None else self.shm.out_slot(slot, math.prod(shape) * dt.itemsize, self.principal)
                 for slot, (dt, shape) in zip(slots, declared)]
        return kernel, declared, dests, slots

    def _execute(self, rid: int, header: dict, arrays: list, kernel: Any, declared: list, dests: list,
                 slots: list) -> messages.Reply:
        """Run an admitted call; its ``result`` reply, or an ``error`` one (``header``'s id may be
        another call's: a plan's is its first call's)."""
        params, layouts = header["params"], header["layouts"]
        extra: dict[str, Any] = {}
        try:
            if self.resident:
                results, timing, extra = self._run_resident(kernel, header, arrays, params, layouts)
                if "missing" in extra:
                    return messages.error(rid, "missing", "KeyError", f"{len(extra['missing'])} inputs are not held here",
                                  missing=extra["missing"])
            else:
                refs = [a.fp for a in arrays if isinstance(a, wire.Ref)]
                if refs:
                    return messages.error(rid, "missing", "KeyError", "this worker keeps nothing", missing=refs)
                if _host_kernels(self.backend):
                    arrays = [_aligned(a) for a in arrays]
                results, timing = self._run(kernel, arrays, params, layouts)
        except Exception as exc:
            kind = "out_of_memory" if is_oom(exc) else "kernel_error"
            return messages.error(rid, kind, type(exc).__name__, str(exc)[:2000])
        got = [(r.dtype, r.shape) for r in results]
        if got != declared:
            return messages.error(rid, "kernel_error", "ResultMismatch",
                          f"kernel made {[f'{d.str}{list(s)}' for d, s in got]}, the call declared "
                          f"{[f'{d.str}{list(s)}' for d, s in declared]}")
        if messages.scans_finite(declared) and messages.all_finite(results):  # D354: scanned here, in cache
            extra["finite"] = True
        return self._reply(rid, results, timing, extra, dests, slots)

    def _reply(self, rid: int, results: list, timing: dict, extra: dict, dests: list,
               slots: list) -> messages.Reply:
        """The ``result`` reply: results in their slots where offered, the others as frames."""
        fps = extra.pop("fps", None)
        locs = _place(results, dests, slots, self.shm) if any(d is not None for d in dests) else None
        return messages.result(rid, timing, results, fps, locs, **extra)

    def _run_resident(self, kernel: Any, header: dict, arrays: list, params: dict,
                      layouts: list) -> tuple[list, dict, dict]:
        """Inputs from the store or the message, the kernel on the device, results kept when asked.
        Out of memory: the store is emptied but for this call's inputs, and the call runs once more."""
        metas = header["arrays"]
        t0 = time.perf_counter()
        tensors, missing = [], []
        for meta, a in zip(metas, arrays):
            if isinstance(a, wire.Ref):
                ref = {"dtype": a.dtype.str, "shape": list(a.shape), "order": a.order}
                t = self.store.get(self.principal.name, a.fp, ref)
                if t is None:
                    missing.append(a.fp)
                tensors.append(t)
            elif "shm" in meta:  # in a client's segment: staged through pinned memory on a GPU
                tensors.append(self.backend.to_device(a, staged=True))
            else:
                tensors.append(self.backend.to_device(a))
        if missing:
            self.backend.sync()  # staged copies land before their pinned buffers are reused
            return [], {}, {"missing": missing}
        held = {m["fp"] for m in metas if "fp" in m}  # this call's inputs: never evicted by it
        evicted: list = []
        checked_s = 0.0
        for meta, a, t in zip(metas, arrays, tensors) if held else ():
            if "fp" in meta and not isinstance(a, wire.Ref):
                c = time.perf_counter()
                received = _received_fingerprint(meta, a)
                checked_s += time.perf_counter() - c
                if received == meta["fp"]:
                    evicted += self.store.put(self.principal.name, meta["fp"], t, meta, held)
                else:  # D59: kept only under the fingerprint of the bytes that came
                    who = self.principal.name
                    self.fingerprint_mismatches[who] = self.fingerprint_mismatches.get(who, 0) + 1
        self.backend.sync()
        t1 = time.perf_counter()
        timing: dict[str, float] = {"fingerprint": checked_s} if checked_s else {}
        try:
            results = self.backend.compute(kernel, tensors, params, layouts)
        except Exception as exc:
            if not is_oom(exc):
                raise
            evicted += self.store.evict_all(self.principal.name, except_=held)
            free_memory(self.backend)
            results = self.backend.compute(kernel, tensors, params, layouts)
            timing["oom_retry"] = 1.0
        self.backend.sync()
        t2 = time.perf_counter()
        out = self.backend.to_host(results)
        t3 = time.perf_counter()
        timing.update(h2d=t1 - t0 - checked_s, kernel=t2 - t1, d2h=t3 - t2)
        extra: dict[str, Any] = {"evicted": evicted}
        if header.get("keep") is True:  # keep results, say their fingerprints
            extra["fps"], extra["evicted"] = self._keep(results, out, held, evicted)
            timing["fingerprint"] = timing.get("fingerprint", 0.0) + time.perf_counter() - t3
        # what the client may send by reference
        extra["kept"] = [fp for fp in held if self.store.holds(self.principal.name, fp)] if held else []
        return out, timing, extra

    def _keep(self, results: list, out: list, held: set, evicted: list) -> tuple[list, list]:
        fps: list = []
        for dev, host in zip(results, out):
            if host.nbytes < RESIDENT_MIN or not (host.flags.c_contiguous or host.flags.f_contiguous):
                fps.append(None)  # small, or travelling as a copy: the bytes sent would not be ``dev``
                continue
            meta, buf = wire.to_wire(host)
            fp = fingerprint(meta, buf)
            evicted = evicted + self.store.put(self.principal.name, fp, dev, meta, held)
            fps.append(fp if self.store.holds(self.principal.name, fp) else None)  # too large for the budget: not kept
        return fps, evicted

    def _run(self, kernel: Any, arrays: list, params: dict, layouts: list) -> tuple[list, dict]:
        """Run once; out of memory: free what can be freed and run once more."""
        try:
            return self.backend.run(kernel, arrays, params, layouts)
        except Exception as exc:
            if not is_oom(exc):
                raise
        free_memory(self.backend)
        results, timing = self.backend.run(kernel, arrays, params, layouts)
        timing["oom_retry"] = 1.0
        return results, timing


def _received_fingerprint(meta: dict, a: np.ndarray) -> str:
    """The fingerprint of the bytes that came for an input, as its meta lays them out."""
    return fingerprint(meta, a.reshape(-1, order="A").view(np.uint8) if a.size else b"")


def _host_kernels(backend: Any) -> bool:
    """True when kernels read the received buffers in place (a CPU device); a CUDA backend only
    copies them to the device, which takes any alignment."""
    return getattr(getattr(backend, "device", None), "type", "cpu") == "cpu"


def _aligned(a: np.ndarray) -> np.ndarray:
    """A received buffer starts wherever ZeroMQ put it: small frames at any byte, large ones at
    8 mod 16; copied to fresh, aligned memory (D54: torch on the CPU can crash on such data)."""
    if a.ctypes.data % ALIGN == 0:
        return a
    out = np.empty_like(a)
    np.copyto(out, a)
    return out


def _place(out: list, dests: list, slots: list, shm: ShmMapper | None) -> list:
    """The ``shm`` locator of each result written into its slot, or None for a result that travels
    inline (no slot, or one it could not be written into)."""
    return [{"name": slot["name"], "offset": slot["offset"]} if dest is not None and shm.write(dest, host) else None
            for host, dest, slot in zip(out, dests, slots)]


class _Refusal(Exception):
    """A call not admitted: answered with an ``error`` reply of ``kind``."""

    def __init__(self, kind: str, exc: str, msg: str):
        super().__init__(msg)
        self.kind, self.exc = kind, exc


def serve(url: str, worker: Worker, *, parent_pid: int | None = None, stop: threading.Event | None = None,
          keys: Any = None, insecure: bool = False, ready: threading.Event | None = None,
          on_request: Any = None, on_bound: Any = None, connection_limits: dict | None = None) -> None:
    """Bind ``url``, warm up, then answer requests until ``stop`` is set or the parent exits.

    ``keys``: a directory from ``fusion-shim keys`` (CURVE, allow-listed clients only), or
    ``(public, secret, auth.AllowList)`` held in memory (a pool's worker). A tcp address without
    ``keys`` is refused unless ``insecure``. ``ready`` is set once bound; ``on_bound`` is called with
    the endpoint bound (a ``tcp://host:*`` address names its port there); ``on_request`` (tests) is
    called with every request that reaches the dispatcher; ``connection_limits`` (tests): keyword
    arguments of :class:`.connections.Connections` (``max_total``, ``max_per_principal``, ``grace_s``)."""
    listener = Listener(url, worker.max_bytes, keys, insecure, connection_limits)
    sock, conns = listener.sock, listener.conns
    worker.enable_shm(url)
    if on_bound is not None:
        on_bound(sock.getsockopt(zmq.LAST_ENDPOINT).decode())
    if ready is not None:
        ready.set()
    inbox = Inbox(sock, keys is not None, principal_budget(worker.max_bytes),  # D69, D270: bounded per principal
                  worker.count_busy)
    unreturned, trimmed_at = 0, time.monotonic()  # bytes received since the heap was last trimmed, and when
    try:
        # hellos that arrive meanwhile wait: nobody is told "ready" early
        inbox.running(lambda: worker.warm(shared=parent_pid is not None))
        while stop is None or not stop.is_set():
            stages = worker.stages  # D171: answered from their own threads
            if stages is not None:
                _send_stage_replies(inbox, stages)
            got = inbox.next(200 if stages is None else stages.poll_ms(200))
            if got is None:
                _housekeeping(worker, conns)
                if unreturned >= TRIM_AFTER or (unreturned >= DRAIN_MIN and time.monotonic() - trimmed_at >= TRIM_TAIL_S):
                    trim_heap()  # D197: idle, the freed buffers of large messages go back to the system
                    unreturned, trimmed_at = 0, time.monotonic()
                if parent_pid is not None and not _alive(parent_pid):
                    return  # the embedded worker's client is gone: do not linger as an orphan
                continue
            frames, principal, received = got
            if keys is not None:
                conns.learn(frames[1], principal.name)
            if on_request is not None:
                on_request(frames[1:])
            # D351: a worker that takes no code (the default) asks no further
            if worker.allow_code and (host := worker.stage_host(frames)) is not None and host.take(frames, principal):
                continue
            reply = inbox.running(worker.handle, frames[1:], principal)
            try:
                sent = inbox.send(frames[0].bytes, reply, principal)  # D270: counted until it leaves
                if worker.last_was_call:
                    worker.count(principal, received, sent or 0)
            except zmq.ZMQError as exc:  # the client vanished between request and reply
                print(f"fusion_shim worker: reply not sent: {exc}", file=sys.stderr)
            unreturned += received
            if received >= DRAIN_MIN:
                inbox.drain()  # D197
            worker.idle()  # D351: _housekeeping inline, its second part only where a principal has left
            if conns.left:
                _forget_ended(worker, conns)
    finally:
        if worker.stages is not None:
            worker.stages.close()
        inbox.close()
        listener.close()
        if worker.shm is not None:
            worker.shm.sweep(force=True)  # names left by clients that died


def _housekeeping(worker: Worker, conns: Any) -> None:
    """Between requests: the worker's own, and the data of principals whose runs ended (D195)."""
    worker.idle()
    _forget_ended(worker, conns)


def _forget_ended(worker: Worker, conns: Any) -> None:
    for name in conns.ended():
        worker.forget(name)


def _send_stage_replies(inbox: Inbox, stages: Any) -> None:
    for ident, reply in stages.replies():
        try:
            inbox.send(ident, reply)
        except zmq.ZMQError as exc:  # the client vanished while its stage ran
            print(f"fusion_shim worker: stage reply not sent: {exc}", file=sys.stderr)


def _alive(pid: int) -> bool:
    if os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def serve_in_thread(url: str, device: str = "auto", *, worker: Worker | None = None,
                    memory_budget: int | None = None, **serve_kwargs: Any) -> tuple[threading.Thread, threading.Event]:
    """A worker in a thread of this process (``inproc://`` URLs, or a socket): for tests and
    debugging. Returns once it is bound. The Worker object is ``thread.worker`` (tests look into
    its resident store)."""
    stop = threading.Event()
    bound = threading.Event()
    worker = Worker(device, memory_budget) if worker is None else worker
    thread = threading.Thread(target=serve, args=(url, worker), kwargs={"stop": stop, "ready": bound, **serve_kwargs},
                              name="fusion-shim-worker", daemon=True)
    thread.worker = worker
    thread.start()
    while not bound.wait(0.05):
        if not thread.is_alive():
            raise RuntimeError(f"the worker thread for {url} exited before binding")
    return thread, stop

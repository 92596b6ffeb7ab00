"""The worker: a ZeroMQ ROUTER that answers ``hello`` once warm and ``call`` with a kernel's results.

It imports neither wrapt nor the planner. Every request is validated (:func:`fusion_shim.wire.decode`)
before anything is allocated; whatever a request does wrong is answered with an ``error`` reply and
the loop goes on: a client can make a call fail, never the worker.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import zmq

from .. import wire
from ..residency import RESIDENT_MIN, fingerprint
from ..transport import context, is_loopback, send_frames
from .store import ResidentStore, default_budget

MAX_MESSAGE_BYTES = 1 << 36


class Worker:
    def __init__(self, device: str = "auto", test_delay: float = 0.0, test_corrupt: bool = False,
                 memory_budget: int | None = None):
        from .kernels import KERNELS, TorchBackend  # torch only here, on the worker side

        self.kernels = KERNELS
        self.backend = TorchBackend(device)
        self.test_delay = test_delay  # test-only: hold every call this long, to kill it mid-call
        self.test_corrupt = test_corrupt  # test-only: return wrong answers, for verification tests
        self.traffic = {"calls": 0, "bytes_in": 0, "bytes_out": 0}  # call messages, counted at the socket
        self.info: dict[str, Any] = {}
        self.last_was_call = False
        self.store = ResidentStore(memory_budget if memory_budget is not None else default_budget(self.backend.device))

    def warm(self) -> None:
        import torch

        bench = self.backend.warm()
        self.info = {"pid": os.getpid(), "device": str(self.backend.device), "torch": torch.__version__,
                     "bench": bench, "test_delay": self.test_delay, "test_corrupt": self.test_corrupt,
                     "memory_budget": self.store.budget}

    def handle(self, frames: list) -> list:
        """One request in, one reply out; never raises."""
        rid = 0
        self.last_was_call = False
        try:
            header, arrays = wire.decode(frames, max_bytes=MAX_MESSAGE_BYTES)
            rid = header["id"]
            kind = header["t"]
            self.last_was_call = kind == "call"
            if kind == "hello":
                return wire.encode({"t": "ready", "id": rid, **self.info})
            if kind == "stats":
                return wire.encode({"t": "stats", "id": rid, **self.traffic, **self.store.stats()})
            if kind != "call":
                return _error(rid, "bad_request", "WireError", f"a worker does not accept {kind!r}")
            return self._call(rid, header, arrays)
        except wire.WireError as exc:
            return _error(rid, "version" if "version" in str(exc) else "bad_request", "WireError", str(exc))
        except Exception as exc:  # the boundary: any fault becomes a reply, the loop stays up
            return _error(rid, "kernel_error", type(exc).__name__, str(exc))

    def _call(self, rid: int, header: dict, arrays: list) -> list:
        kernel = self.kernels.get(header.get("op"))
        if kernel is None:
            return _error(rid, "unknown_op", "KeyError", f"no kernel {header.get('op')!r}")
        params, layouts = header.get("params"), header.get("layouts")
        if not isinstance(params, dict) or not isinstance(layouts, list) or "cdtype" not in params:
            return _error(rid, "bad_request", "WireError", "a call needs 'params' with 'cdtype' and 'layouts'")
        if params["cdtype"] not in wire.DTYPES:
            return _error(rid, "bad_request", "WireError", f"cdtype {params['cdtype']!r} is not accepted")
        if self.test_delay:
            time.sleep(self.test_delay)
        metas = header["arrays"]
        try:
            t0 = time.perf_counter()
            tensors, missing = [], []
            for a in arrays:
                if isinstance(a, wire.Ref):
                    t = self.store.get(a.fp, {"dtype": a.dtype.str, "shape": list(a.shape), "order": a.order})
                    if t is None:
                        missing.append(a.fp)
                    tensors.append(t)
                else:
                    tensors.append(self.backend.to_device(a))
            if missing:
                return _error(rid, "missing", "KeyError", f"{len(missing)} inputs are not held here", missing=missing)
            held = {m["fp"] for m in metas if "fp" in m}  # this call's inputs: never evicted by it
            evicted = []
            for meta, a, t in zip(metas, arrays, tensors):
                if "fp" in meta and not isinstance(a, wire.Ref):
                    evicted += self.store.put(meta["fp"], t, meta, held)
            self.backend.sync()
            t1 = time.perf_counter()
            results = self.backend.run(kernel, tensors, params, layouts)
            self.backend.sync()
            t2 = time.perf_counter()
            out = self.backend.to_host(results)
            t3 = time.perf_counter()
            fps = None
            if self.test_corrupt:
                out = [_corrupt(r) for r in out]
            elif header.get("keep") is True:  # residency: keep results, tell the client their fingerprints
                fps, evicted = self._keep(results, out, held, evicted)
            t4 = time.perf_counter()
        except Exception as exc:
            oom = "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"
            return _error(rid, "out_of_memory" if oom else "kernel_error", type(exc).__name__, str(exc)[:2000])
        timing = {"h2d": t1 - t0, "kernel": t2 - t1, "d2h": t3 - t2}
        if fps is not None:
            timing["fingerprint"] = t4 - t3
        kept = [fp for fp in held if fp in self.store]  # what the client may send by reference next time
        return wire.encode({"t": "result", "id": rid, "timing": timing, "evicted": evicted, "kept": kept},
                           out, fps=fps)

    def _keep(self, results: list, out: list, held: set, evicted: list) -> tuple[list, list]:
        fps: list = []
        for dev, host in zip(results, out):
            if host.nbytes < RESIDENT_MIN or not (host.flags.c_contiguous or host.flags.f_contiguous):
                fps.append(None)  # small, or travelling as a copy: the bytes sent would not be ``dev``
                continue
            meta, buf = wire.to_wire(host)
            fp = fingerprint(meta, buf)
            evicted = evicted + self.store.put(fp, dev, meta, held)
            fps.append(fp if fp in self.store else None)  # too large for the budget: not kept
        return fps, evicted


def _corrupt(a: Any) -> Any:
    """TEST ONLY (--test-corrupt): a wrong answer of the right type, one element off."""
    a = a.copy()
    if a.size:
        flat = a.reshape(-1)
        flat[0] = flat[0] + (1 if a.dtype.kind in "biu" else 1e-3 * (abs(flat[0]) + 1))
    return a


def _error(rid: int, kind: str, exc: str, msg: str, **extra: Any) -> list:
    return wire.encode({"t": "error", "id": rid, "kind": kind, "exc": exc, "msg": msg, **extra})


def serve(url: str, worker: Worker, *, parent_pid: int | None = None,
          stop: threading.Event | None = None, allow_network: bool = False) -> None:
    """Bind ``url``, warm up, then answer requests until ``stop`` is set or the parent exits."""
    if not is_loopback(url) and not allow_network:
        raise SystemExit(
            f"refusing to bind {url}: a network address needs authentication (ZeroMQ CURVE), which this "
            "version does not provide yet; bind a loopback address or an ipc:// path")
    sock = context().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(url)
    try:
        worker.warm()  # hellos that arrive meanwhile wait in the socket: nobody is told "ready" early
        while stop is None or not stop.is_set():
            if not sock.poll(200):
                if parent_pid is not None and not _alive(parent_pid):
                    return  # the embedded worker's client is gone: do not linger as an orphan
                continue
            frames = sock.recv_multipart(copy=False)
            if len(frames) < 2:
                continue  # no routing identity: nothing to answer to
            reply = worker.handle(frames[1:])
            try:
                sent = send_frames(sock, reply, prefix=[frames[0].bytes])
                if worker.last_was_call:
                    worker.traffic["calls"] += 1
                    worker.traffic["bytes_in"] += sum(f.nbytes if hasattr(f, "nbytes") else len(f) for f in frames[1:])
                    worker.traffic["bytes_out"] += sent
            except zmq.ZMQError as exc:  # the client vanished between request and reply
                print(f"fusion_shim worker: reply not sent: {exc}", file=sys.stderr)
    finally:
        sock.close(linger=0)


def _alive(pid: int) -> bool:
    if os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def serve_in_thread(url: str, device: str = "auto", test_delay: float = 0.0, test_corrupt: bool = False,
                    memory_budget: int | None = None) -> tuple[threading.Thread, threading.Event]:
    """An in-process worker (``inproc://`` URLs): for tests and debugging, no socket involved.
    The Worker object is ``thread.worker`` (tests look into its resident store)."""
    stop = threading.Event()
    worker = Worker(device, test_delay, test_corrupt, memory_budget)
    thread = threading.Thread(target=serve, args=(url, worker), kwargs={"stop": stop},
                              name="fusion-shim-worker", daemon=True)
    thread.worker = worker
    thread.start()
    return thread, stop

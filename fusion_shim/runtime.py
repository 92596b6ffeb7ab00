"""The client side of one run: the worker link, the decision, the remote call, the record.

The app never waits for a cold worker under ``auto``: the worker is started (or connected) in the
background and calls run locally until it answers ``ready``. Under ``remote`` the first call waits
for readiness, up to ``ready_timeout``, and that wait is its own phase (``wait_ready``) in the report.
Any fault (no reply by the deadline, a dead worker, an error reply, a malformed reply) is recorded
and the call is computed locally: a fault costs time, never an exception or a wrong answer.
"""
from __future__ import annotations

import inspect
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import plan, transport, wire
from .catalog import OpSpec, Prepared, Unsupported, prepare
from .config import Config
from .ledger import Ledger, Record, call_site

MAX_RESTARTS = 2  # an embedded worker that died is restarted this many times, then the run stays local


class FallbackError(RuntimeError):
    """Raised in strict mode where a call would otherwise have fallen back to local computation."""


class WorkerFault(transport.TransportError):
    """The worker answered with an error instead of a result."""


@dataclass
class Done:
    value: Any


class WorkerLink:
    """One worker: its process when embedded, its readiness, one channel per thread."""

    def __init__(self, config: Config, ledger: Ledger, profile: plan.Profile, guard: threading.local):
        self.config = config
        self.ledger = ledger
        self.profile = profile
        self.guard = guard
        self.url = config.worker
        self.embedded = config.worker is None
        self.proc: subprocess.Popen | None = None
        self.owner = os.getpid()
        self.tmpdir: str | None = None
        self.state = "starting"
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.restarts = 0
        self.ready_after_s: float | None = None
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # spawn, stop and probe never interleave
        self._probing = False
        self.stopped = False  # after stop(): no restart, no probe (a late thread must not respawn)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self.embedded:
            self._spawn()
        self._probe()

    def _spawn(self) -> None:
        if self.tmpdir is None:
            self.tmpdir = tempfile.mkdtemp(prefix="fusion-shim-")
        self.url = f"ipc://{self.tmpdir}/worker-{self.restarts}.sock"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
        env["FUSION_SHIM"] = "0"  # the worker must not intercept (nor start a worker of its own)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
        log = open(os.path.join(self.tmpdir, "worker.log"), "ab")
        cmd = [sys.executable, "-m", "fusion_shim", "worker", "--bind", self.url,
               "--device", self.config.device, "--parent-pid", str(os.getpid())]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()
        self.ledger.event(f"embedded worker started (pid {self.proc.pid}) at {self.url}")

    def _probe(self) -> None:
        """Say hello in the background; the worker answers once warm."""
        with self._lock:
            if self._probing or self.stopped:
                return
            self._probing = True
        threading.Thread(target=self._handshake, name="fusion-shim-handshake", daemon=True).start()

    def _handshake(self) -> None:
        try:
            chan = self.channel()
            rid = next(self._ids)
            t = time.monotonic()
            header, _ = chan.request(rid, wire.encode({"t": "hello", "id": rid}),
                                     t + self.config.ready_timeout, self.alive)
            if header["t"] != "ready":
                raise transport.BadReply(f"hello answered with {header['t']!r}")
            self.info = {k: header.get(k) for k in ("pid", "device", "torch", "bench")}
            rtt = min(self._ping(chan) for _ in range(5))
            if not self.profile.calibrated:
                self.guard.busy = True  # the probes call NumPy: they must not be intercepted
                try:
                    self.profile.local_gflops.update(plan.calibrate_local())
                finally:
                    self.guard.busy = False
                self.profile.calibrated = True
            bench = self.info.get("bench") or {}
            for family in plan.FAMILIES:
                if isinstance(bench.get(family), (int, float)) and bench[family] > 0:
                    self.profile.worker_gflops[family] = float(bench[family])
            self.profile.rtt_s = rtt
            self.state = "ready"
            self.ready_after_s = self.ledger.now()
            self.ready.set()
            self.ledger.event(f"worker ready at {self.url} on {self.info.get('device')} "
                              f"(pid {self.info.get('pid')}, round trip {rtt * 1e6:.0f} us)")
        except transport.TransportError as exc:
            self.state = "down"
            self.ledger.event(f"worker not ready: {exc}")
            self._maybe_restart()
        finally:
            with self._lock:
                self._probing = False

    def _ping(self, chan: transport.Channel) -> float:
        rid = next(self._ids)
        t = time.perf_counter()
        chan.request(rid, wire.encode({"t": "hello", "id": rid}), time.monotonic() + 5, self.alive)
        return time.perf_counter() - t

    def alive(self) -> bool:
        if self.proc is None:
            return True
        if os.getpid() == self.owner:
            return self.proc.poll() is None
        try:  # a forked child cannot wait() for its parent's worker; ask the kernel instead
            os.kill(self.proc.pid, 0)
            return True
        except OSError:
            return False

    def fault(self, exc: Exception) -> None:
        """A call failed: stop sending until the worker proves itself again."""
        self.ready.clear()
        self.state = "down"
        self.ledger.event(f"worker fault: {type(exc).__name__}: {exc}")
        if isinstance(exc, transport.Timeout) or isinstance(exc, transport.BadReply):
            self._drop_channel()  # its socket may still hold the late reply; a fresh one is simpler
        if not self.alive():
            self._maybe_restart()
        else:
            self._probe()

    def _maybe_restart(self) -> None:
        with self._lock:
            if self.stopped or not self.embedded or self.alive() or os.getpid() != self.owner:
                return
            if self.restarts >= MAX_RESTARTS:
                self.ledger.event(f"embedded worker exited (code {self.proc.returncode}); "
                                  f"{MAX_RESTARTS} restarts used, the rest of the run stays local")
                return
            self.restarts += 1
            self.ledger.event(f"embedded worker exited (code {self.proc.returncode}); restart {self.restarts}")
            self._drop_channel()
            self._spawn()  # a new URL: every thread's channel() notices and reconnects
            self._probing = False
            self._probe()

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.ready.is_set():
            if self.state == "down" and not self._probing:
                return False
            if not self.ready.wait(min(0.05, max(deadline - time.monotonic(), 0))) and time.monotonic() >= deadline:
                return False
        return True

    # -- channels -------------------------------------------------------------------------------
    def channel(self) -> transport.Channel:
        chan = getattr(self._local, "chan", None)
        if chan is None or chan.pid != os.getpid() or chan.url != self.url:
            chan = transport.Channel(self.url)
            self._local.chan = chan
        return chan

    def _drop_channel(self) -> None:
        chan = getattr(self._local, "chan", None)
        if chan is not None and chan.pid == os.getpid():
            chan.close()
        self._local.chan = None

    def next_id(self) -> int:
        return next(self._ids)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
        self.state = "stopped"
        self.ready.clear()
        if self.proc is not None and os.getpid() == self.owner and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmpdir and os.getpid() == self.owner:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


class Runtime:
    """Everything one process's shim holds; created by :func:`fusion_shim.install`."""

    def __init__(self, config: Config):
        self.config = config
        self.ledger = Ledger()
        self.profile = plan.Profile()
        self.guard = threading.local()  # .busy: the shim's own NumPy calls must not re-enter it
        self.local_only = config.policy == "local"
        self.floor_bytes = 0 if config.policy == "remote" else plan.FLOOR_BYTES
        self.link: WorkerLink | None = None
        self.started_wall = time.time()
        self.export_env = False  # set by the launcher: children reuse this process's worker
        self._results: dict[str, type] = {}

    def start(self) -> None:
        """Start (or connect to) the worker in the background; called once NumPy is imported."""
        if self.local_only or self.link is not None:
            return
        self.link = WorkerLink(self.config, self.ledger, self.profile, self.guard)
        self.link.start()
        if self.export_env and self.link.embedded:
            os.environ["FUSION_SHIM_WORKER"] = self.link.url

    def worker_state(self) -> str:
        return "none" if self.link is None else self.link.state

    # -- the slow path: one intercepted call that is a candidate ----------------------------------
    def call(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> Done | Record | None:
        """``Done`` (the worker's answer), a ``Record`` (compute locally and report), or None
        (a call made by the shim itself: compute locally, record nothing)."""
        if getattr(self.guard, "busy", False):
            return None
        self.guard.busy = True
        try:
            return self._call(spec, sig, args, kwargs)
        finally:
            self.guard.busy = False

    def _call(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> Done | Record:
        t0 = time.perf_counter()
        rec = Record(spec.name, spec.family, site=call_site(4), start_s=t0 - self.ledger.started)
        try:
            prep = prepare(spec, sig, args, kwargs)
        except Unsupported as exc:
            rec.kind, rec.reason = "unsupported", str(exc)
            return rec
        rec.shapes = [list(a.shape) for a in prep.arrays]
        rec.dtypes = [a.dtype.str for a in prep.arrays]
        if self.config.policy == "remote" and self.link is not None and not self.link.ready.is_set():
            waited = time.perf_counter()
            self.link.wait_ready(self.config.ready_timeout)
            rec.phases["wait_ready"] = time.perf_counter() - waited
        decision = plan.decide(self.config.policy, spec.family, prep.flops, prep.bytes_in, prep.bytes_out,
                               self.worker_state(), self.profile, self.config.min_flops)
        rec.reason = decision.reason
        rec.predicted_local_s, rec.predicted_remote_s = decision.local_s, decision.remote_s
        if decision.where == "local":
            # under policy remote every supported call was meant for the worker: that is a fallback
            rec.kind = "fallback" if self.config.policy == "remote" else "local"
            return rec
        try:
            value = self._remote(prep, rec)
        except transport.TransportError as exc:
            if not isinstance(exc, WorkerFault):  # an error reply is about this call, not the worker
                self.link.fault(exc)
            rec.kind, rec.reason = "fallback", f"{type(exc).__name__}: {exc}"[:300]
            return rec
        rec.kind = "worker"
        rec.wall_s = time.perf_counter() - t0
        self.profile.learn(spec.family, "worker", decision.remote_s, rec.wall_s)
        self.ledger.add(rec)
        return Done(value)

    def _remote(self, prep: Prepared, rec: Record) -> Any:
        link = self.link
        chan = link.channel()
        rid = link.next_id()
        t0 = time.perf_counter()
        frames = wire.encode({"t": "call", "id": rid, "op": prep.spec.kernel_id, "params": prep.params,
                              "layouts": prep.layouts}, prep.arrays)
        t1 = time.perf_counter()
        header, arrays = chan.request(rid, frames, time.monotonic() + self.config.timeout, link.alive)
        t2 = time.perf_counter()
        rec.bytes_sent = sum(_nbytes(f) for f in frames)
        if header["t"] == "error":
            raise WorkerFault(f"worker raised {header.get('exc')} ({header.get('kind')}): {header.get('msg')}"[:300])
        if header["t"] != "result":
            raise transport.BadReply(f"a call answered with {header['t']!r}")
        rec.bytes_received = sum(a.nbytes for a in arrays)
        value = self._assemble(prep, arrays)
        t3 = time.perf_counter()
        timing = header.get("timing") if isinstance(header.get("timing"), dict) else {}
        worker_s = {k: float(v) for k, v in timing.items() if k in ("h2d", "kernel", "d2h") and isinstance(v, (int, float))}
        rec.phases.update(worker_s)
        rec.phases.update(encode=t1 - t0, transfer=max(t2 - t1 - sum(worker_s.values()), 0.0), decode=t3 - t2)
        self.profile.learn_link(rec.bytes_sent + rec.bytes_received, rec.phases["transfer"])
        return value

    def _assemble(self, prep: Prepared, arrays: list) -> Any:
        """NumPy's return value from the worker's arrays, after checking each is what NumPy returns."""
        if len(arrays) != len(prep.results):
            raise transport.BadReply(f"{len(arrays)} results, expected {len(prep.results)}")
        for arr, (dtype, shape), layout in zip(arrays, prep.results, prep.layouts):
            if isinstance(layout, list):  # travels transposed to that axis order (worker.kernels)
                shape = tuple(shape[i] for i in layout)
            if arr.dtype != dtype or arr.shape != shape:
                raise transport.BadReply(f"result {arr.dtype}{list(arr.shape)}, expected {dtype}{list(shape)}")
        # a small frame can land unaligned; the copy keeps its memory order (an F result stays F)
        arrays = [a if a.flags.aligned else a.copy(order="K") for a in arrays]
        arrays = [a.transpose(np.argsort(lay)) if isinstance(lay, list) else a
                  for a, lay in zip(arrays, prep.layouts)]
        if prep.finish is not None:  # the row's own assembly (issue 4): NumPy's cheap epilogue, here
            return prep.finish(arrays)
        if prep.returns != "array":
            return self._result_type(prep.returns)(*arrays)
        result = arrays[0]
        if prep.out is not None:
            np.copyto(prep.out, result)
            return prep.out
        if prep.scalar_0d and result.ndim == 0:
            return result[()]
        return result

    def _result_type(self, name: str) -> type:
        cls = self._results.get(name)
        if cls is None:
            from numpy.linalg import _linalg
            cls = self._results[name] = getattr(_linalg, name)
        return cls

    # -- after a local computation ---------------------------------------------------------------
    def local_done(self, rec: Record, seconds: float, exc: BaseException | None) -> None:
        rec.phases["local"] = seconds
        rec.wall_s = time.perf_counter() - self.ledger.started - rec.start_s
        rec.raised = None if exc is None else type(exc).__name__
        if rec.kind == "local" and rec.predicted_local_s:
            self.profile.learn(rec.family, "local", rec.predicted_local_s, seconds)
        self.ledger.add(rec)
        if self.config.strict and exc is None and rec.kind in ("unsupported", "fallback"):
            raise FallbackError(f"{rec.op} at {rec.site} ran locally: {rec.kind}: {rec.reason}")

    # -- end of run ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self.link is not None:
            self.link.stop()


def _nbytes(frame: Any) -> int:
    return frame.nbytes if hasattr(frame, "nbytes") else len(frame)

"""The client side of one run: the worker link, the decision, the remote call, the record.

The app never waits for a cold worker under ``auto``: the worker is started (or connected) in the
background and calls run locally until it answers ``ready``, at the cost of one size comparison each
(every floor is NEVER until then, plan.Planner.held). Under ``remote`` the first call waits
for readiness, up to ``ready_timeout``, and that wait is its own phase (``wait_ready``) in the report.
Any fault (no reply by the deadline, a dead worker, an error reply, a malformed reply) is recorded
and the call is computed locally: a fault costs time, never an exception or a wrong answer.

Issue 8 (reliability):

- Each call's deadline follows its prediction: ``max(DEADLINE_FLOOR_S, DEADLINE_FACTOR x predicted
  worker time)``, capped by ``Config.timeout``, once that worker has answered the op (with that
  dtype) before (an unmeasured prediction can be off by 10x: a CPU worker's first SVD was); a call
  that runs out teaches the model it was slow.
- An op (kernel id and dtypes) in flight when the worker died or its connection dropped ``CRASH_LIMIT``
  times runs locally for the rest of the run; the events and each record say so.
- Under ``remote`` only a cold worker (starting, or restarted) is waited for; a worker that faulted is
  probed again in the background (backing off) while calls run locally, so no call waits on it.
- One channel per thread and per process: a forked child opens its own (``Channel.pid``).

Issue 5: on a host with no GPU (:func:`gpu_visible`), an embedded worker under ``auto`` would run
torch on the very CPUs the program already has. It is started only once the program has run
``CPU_WORKER_AFTER_S``: its start (process, torch import, self-benchmark) cost programs of 0.3-1.4 s
on the 2-core development machine 2-16% even at idle priority, while torch's multi-threaded FFTs can
win a few percent back only over a long run. Until then every floor is NEVER (nothing can leave the
process) and the report says why. ``FUSION_SHIM_DEVICE=cpu`` starts it at once.
"""
from __future__ import annotations

import glob
import inspect
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from . import linkprobe, plan, transport
from .protocol import wire
from .catalog import OpSpec, Prepared, Unsupported, prepare
from .config import Config
from .ledger import Ledger, Record, call_site
from .protocol.fingerprint import fingerprint, worth_keeping
from .residency import HashRate, Mirror, Reuse
from .transport import shm as shmlane
from .verify import compare

# One per process, shared by every Runtime, so that intercept.bypassed() holds across installs:
# while a thread's .busy is set, its NumPy calls are not intercepted nor recorded.
GUARD = threading.local()
MAX_RESTARTS = 2  # an embedded worker that died is restarted this many times, then the run stays local
CRASH_LIMIT = 3  # an op in flight this many times when the worker went down runs locally from then on
DEADLINE_FLOOR_S = 5.0   # per-call deadline: max(floor, factor x predicted), capped by Config.timeout,
DEADLINE_FACTOR = 20.0   # once the family has a measured worker time (before that: Config.timeout)
SYNC_LINK_PROBE_S = 0.05  # a call predicted to take this long here waits for its link's first bandwidth probe,
SYNC_LINK_PROBE_RTTS = 100  # and this many of the link's round trips
QUIET_TRIES = 4  # a probe on its own thread waits for an idle moment this many checks (about 0.2 s), then runs
HANDOFF_RTT_S = 1e-3  # ... unless its link is this close: then the next call that wants it makes it (below)
REPROBE_MAX_S = 5.0  # a faulted worker is probed again after 0.1 s, doubling up to this
CPU_WORKER_AFTER_S = 10.0  # no GPU here: the embedded (CPU) worker starts once the program has run this long


def gpu_visible() -> bool:
    """Whether this host shows a GPU the embedded worker's torch could use, without importing torch:
    NVIDIA's device files or driver list, or ROCm's ``/dev/kfd``; ``CUDA_VISIBLE_DEVICES`` set empty
    or to -1 hides them."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*")
                or os.path.exists("/dev/kfd"))


def _parallel_blas() -> bool:
    """Whether this process's BLAS may run helper threads (more than one CPU allowed, no *_NUM_THREADS=1):
    they spin for a while after each call, on the CPUs a same-host worker computes on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    from .plan.calibrate import THREAD_VARS  # the BLAS thread settings the calibration cache is keyed on

    return cpus > 1 and not any(os.environ.get(v, "").strip() == "1" for v in THREAD_VARS)


def _lower_priority(pid: int) -> None:
    """Issue 5: under ``auto`` nobody waits for the embedded worker, and it shares the program's CPUs.
    It runs at idle priority (SCHED_IDLE; where that is missing, nice 19): its warm-up (torch import,
    self-benchmark) takes only CPU time nothing else wants, and while the program waits for one of
    its answers it has the CPUs. On the 2-core development machine a warm-up at nice 10 stalled
    multi-threaded BLAS calls up to 10x, and at nice 19 still cost 10-15% of a BLAS-bound program.
    The price: on a machine saturated by other work the worker warms slowly or not at all, and
    ``auto`` then stays local. Under ``remote`` the program waits for it: it keeps normal priority."""
    try:
        # Python 3.10 has no process_group: there the worker leads a session of its own, and with
        # autogroup scheduling (most Linux desktops and these machines) a session is a scheduling
        # group that competes with the program's as an equal, whatever the priority inside it: the
        # group's own nice must drop too. Never the program's own session's group: that would be
        # the user's whole terminal session, the program included
        if os.getsid(pid) == pid != os.getsid(0):
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write("19")
    except OSError:
        pass
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    except (AttributeError, OSError):
        pass


class FallbackError(RuntimeError):
    """Raised in strict mode where a call would otherwise have fallen back to local computation."""


class WorkerFault(transport.TransportError):
    """The worker answered with an error instead of a result."""


class VerificationError(FallbackError):
    """Strict mode: a checked answer from the worker differed from NumPy's."""


class Planned(NamedTuple):
    """What the planner decided for one call, kept on its record (``rec.plan``, not a field: the
    record's fields are what the report serialises) until the call is timed and learnt from."""
    call: plan.Call
    decision: plan.Decision
    inputs_up: int | None = None  # the fewest input bytes a worker could be priced for, where looked at


@dataclass
class Done:
    """The worker's answer; the record is added once it is checked (or not sampled for a check)."""
    value: Any
    rec: Record
    prep: Prepared


class WorkerLink:
    """One worker: its process when embedded, its readiness, one channel per thread."""

    def __init__(self, config: Config, ledger: Ledger, planner: plan.Planner, guard: threading.local,
                 url: str | None = None, index: int = 0):
        self.config = config
        self.ledger = ledger
        self.planner = planner
        self.guard = guard
        self.index = index  # this worker's place in the planner's profile (issue 5)
        self.url = url
        self.embedded = url is None
        self.inflight = 0  # this process's calls on it now, and their predicted seconds (the planner's queue)
        self.backlog_s = 0.0
        self.answered: set[tuple[str, str]] = set()  # (op, dtype) it has answered: their deadlines follow predictions
        self.rtt_s: float | None = None                    # measured at the first handshake
        self.bandwidth: tuple[float, float] | None = None  # (up, down) bytes/s, measured on first need
        self._bw_probing = False
        self._bw_handoff = False  # the probe's thread found the program busy: the next call makes it
        self.proc: subprocess.Popen | None = None
        self.owner = os.getpid()
        self.tmpdir: str | None = None
        self.state = "starting"
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.cpus_shared = False  # shares_cpus(), as of the last ready
        self.contended = False    # ... and this process's BLAS may run threads beside it (read for every decision)
        self.mirror = Mirror()  # what this worker is believed to hold (issue 6): a hint
        self.restarts = 0
        self.ready_after_s: float | None = None
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # spawn, stop and probe never interleave
        self._probing = False
        self._probe_gen = 0
        self._failed_probes = 0  # consecutive; sets the back-off and keeps the events short
        self.stopped = False  # after stop(): no restart, no probe (a late thread must not respawn)
        self.curve = _load_curve(config)
        self.lane = shmlane.ClientLane(config.shm, ledger.event)  # same-host shared memory (issue 9)
        _links.add(self)
        if self.curve is None and not self.embedded and not transport.is_loopback(self.url):
            ledger.event(f"connecting to {self.url} without authentication: the worker must run --insecure "
                         "(set FUSION_SHIM_SERVER_KEY and FUSION_SHIM_CLIENT_KEYS for CURVE)")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.lane.start(self.url)
        if self.embedded:
            self._spawn()
        self._probe()

    def shm(self) -> "shmlane.ShmPool | None":
        """The shared-memory pool for this worker, where the lane was negotiated (issue 9)."""
        return self.lane.pool()

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
        # a process group of its own (a terminal's Ctrl-C, sent to the foreground group, is the
        # program's to handle), in the program's session: with autogroup scheduling a session is a
        # scheduling group, and from one of its own, even one niced to 19, an idle-priority worker
        # warming up cost BLAS-bound programs 4-4.5% on the 2-core development machine (paired runs
        # of decompositions and chain_reuse), against 0.6-1.4% from the program's own group, where
        # SCHED_IDLE yields to the program's threads at once (_lower_priority)
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **group)
        log.close()
        if self.config.policy == "auto":
            _lower_priority(self.proc.pid)
        self.state = "starting"  # a cold worker: under policy remote calls wait for it, as at start
        self.ledger.event(f"embedded worker started (pid {self.proc.pid}) at {self.url}")

    def _probe(self) -> None:
        """Say hello in the background; the worker answers once warm."""
        with self._lock:
            if self._probing or self.stopped:
                return
            self._probing = True
            self._probe_gen += 1
            gen = self._probe_gen
        threading.Thread(target=self._handshake, args=(gen,), name="fusion-shim-handshake", daemon=True).start()

    def _handshake(self, gen: int) -> None:
        ok = False
        chan = None
        try:
            # its own channel, closed at the end: a probe thread must not leave a socket behind
            chan = transport.Channel(self.url, self.curve)
            rid = next(self._ids)
            t = time.monotonic()
            hello = {"t": "hello", "id": rid}
            offer = self.lane.offer(self.url)  # issue 9: shared memory, if the worker can map ours
            if offer is not None:
                hello["shm"] = offer
            try:
                header, _ = chan.request(rid, wire.encode(hello), t + self.config.ready_timeout, self._probe_alive)
            finally:
                self.lane.withdraw()
            if header["t"] == "error":
                raise transport.BadReply(f"hello answered with an error: {header.get('kind')}: {header.get('msg')}")
            if header["t"] != "ready":
                raise transport.BadReply(f"hello answered with {header['t']!r}")
            info = {k: header.get(k) for k in ("pid", "device", "torch", "bench", "memory_budget", "numba", "kernels",
                                               "boot")}
            if info.get("pid") != self.info.get("pid"):
                self.mirror.clear()  # a new worker process holds nothing yet
                if info.get("numba") == "simulator":  # issue 9: said where the report shows it
                    self.ledger.event("numba kernels run under numba's CUDA SIMULATOR on the worker: tests only, slow")
            self.info = info
            self.cpus_shared = self.shares_cpus()
            self.contended = self.cpus_shared and _parallel_blas()
            if offer is not None:
                self.lane.answered(header.get("shm"), info.get("pid"))
            if self.ready_after_s is not None:  # back after a fault: the link was measured before
                self.info["link"] = {"rtt_s": self.rtt_s, **self._bandwidth_info()}
                self.planner.worker_ready(self.index, self.info.get("bench"), self.rtt_s or 150e-6,
                                          *(self.bandwidth or (None, None)))
                self._ready(f"worker back at {self.url} (pid {self.info.get('pid')})")
                ok = True
                return
            # issue 5: the round trip measured before any call is sent; the bandwidth on first need
            # (measure_bandwidth_soon); the local side calibrates on first use (plan.planner)
            rtt = self.rtt_s = min(self._ping(chan) for _ in range(5))
            self.info["link"] = {"rtt_s": rtt, **self._bandwidth_info()}
            up, down = self.bandwidth or (None, None)
            self.planner.worker_ready(self.index, self.info.get("bench"), rtt, up, down)
            self.ready_after_s = self.ledger.now()
            self._ready(f"worker ready at {self.url} on {self.info.get('device')} "
                        f"(pid {self.info.get('pid')}, round trip {rtt * 1e6:.0f} us)")
            ok = True
        except transport.TransportError as exc:
            if self.state != "stopped":
                self.state = "down"
            if not self._failed_probes:  # one event per outage, not one per retry
                self.ledger.event(f"worker not ready: {type(exc).__name__}: {exc}")
            self._failed_probes += 1
            self._maybe_restart()
        finally:
            if chan is not None:
                chan.close()
            with self._lock:
                if self._probe_gen == gen:  # a restart may have started a newer probe meanwhile
                    self._probing = False
        if not ok:
            self._reprobe_later()

    def _bandwidth_info(self) -> dict:
        if self.bandwidth is None:
            return {}
        return {"up_bytes_per_s": self.bandwidth[0], "down_bytes_per_s": self.bandwidth[1]}

    def measure_bandwidth_soon(self, wait: bool = False) -> bool:
        """Issue 5: bulk transfers each way (about 7 MB in all, linkprobe), the first time a call could
        go to this worker; until it is done the planner prices the link with its prior. On a thread of its own,
        or with ``wait`` on the caller's: a probe that shares a busy CPU with the program measures
        the program, not the link (on one core it read a third of the bandwidth), so a call long
        enough to pay for a few milliseconds has it made while the program waits anyway. The thread
        waits a little (QUIET_TRIES) for the program to be idle (its other threads' CPU time, as for
        calibration probes): beside the program's BLAS calls a probe cost a 0.3 s program 5%. Still
        busy, over a link within HANDOFF_RTT_S (where the probe is a few milliseconds of copying) it
        leaves the probe to the next call that wants it, on the program's thread: made beside a
        client busy on its one core, a loopback probe read 17 MB/s for a link that moves 2-3 GB/s,
        and every floor went past the program's calls for the rest of the run. Returns whether the
        probe was made here, now."""
        with self._lock:
            if self.bandwidth is not None or self._bw_probing or self.stopped or not self.ready.is_set():
                return False
            self._bw_probing = True
            wait = wait or self._bw_handoff
        if wait:
            self._measure_bandwidth()
        else:
            threading.Thread(target=self._measure_bandwidth_when_quiet, name="fusion-shim-link-probe",
                             daemon=True).start()
        return wait

    def _measure_bandwidth_when_quiet(self) -> None:
        from .plan import calibrate

        for _ in range(QUIET_TRIES):
            # idle: the program's threads, and no call of its in flight here (waiting for one, the
            # program looks idle, but its transfer shares the link and its kernel maybe the CPUs)
            if self.stopped or (calibrate.others_busy() <= calibrate.BUSY_SHARE and not self.inflight):
                break
            time.sleep(calibrate.CONTENDED_PAUSE_S)
        else:
            if self.rtt_s is not None and self.rtt_s <= HANDOFF_RTT_S:
                with self._lock:
                    self._bw_handoff = True
                    self._bw_probing = False
                self.ledger.event(f"link bandwidth to {self.url}: the program was busy throughout {QUIET_TRIES} "
                                  "checks; the next call that could go there measures it (until then the "
                                  "link is priced with its prior and no call explores it)")
                return
        # idle by now, or a farther link (its probe waits on the network more than on the CPU): left
        # unmeasured longer, a link is never explored (a client held to one core, always busy,
        # stopped offloading the chain of calls that pays there)
        self._measure_bandwidth()

    def _measure_bandwidth(self) -> None:
        chan = None
        try:
            chan = transport.Channel(self.url, self.curve)  # its own socket, closed at the end
            up, down, why, moved = linkprobe.bandwidth(chan, self.next_id, self.rtt_s or 0.0, self._probe_alive,
                                                       min(self.config.timeout, 30.0))
            if why is not None:
                self.ledger.event(f"link bandwidth to {self.url} not measured ({why}); priced with the prior")
                up = down = plan.LinkModel().up_bps
            self.bandwidth = (up, down)
            self.info["link"] = {"rtt_s": self.rtt_s, **self._bandwidth_info()}
            self.planner.link_measured(self.index, up, down)
            self.ledger.event(f"link to {self.url}: {up / 1e6:.0f} MB/s up, {down / 1e6:.0f} MB/s down "
                              f"(the probe moved {moved / 1e6:.1f} MB, not counted with the calls)")
            if self.planner.policy == "auto":
                self.ledger.event(f"floors: {self.planner.describe_floors()}")
        except transport.TransportError as exc:
            self.ledger.event(f"link bandwidth to {self.url} not measured: {exc}")
        finally:
            if chan is not None:
                chan.close()
            with self._lock:
                self._bw_probing = False

    def shares_cpus(self) -> bool:
        """Whether the worker computes on this machine's CPUs (a CPU device, the same boot id; a worker
        that does not say: a same-host URL): a call abandoned there keeps competing with this process."""
        if not str(self.info.get("device") or "cpu").startswith("cpu"):
            return False
        boot = self.info.get("boot")
        if isinstance(boot, str) and boot:
            return boot == shmlane.boot_id()
        return self.embedded or transport.is_loopback(self.url or "")

    def offers(self, kernel_id: str) -> bool:
        """Whether this worker has the kernel (its ``ready`` reply lists them; before it: assumed)."""
        kernels = self.info.get("kernels")
        return not isinstance(kernels, list) or kernel_id in kernels

    def plan_state(self, missing: int | None, reused: int = 0) -> plan.WorkerState:
        """What the planner sees of this worker for one call; ``missing``: the input bytes it is priced
        for (None: all of them), ``reused``: bytes among them priced over their reuse (_Wired.to_send)."""
        state = self.state
        if state == "ready" and self.inflight > 0:
            state = "busy"
        return plan.WorkerState(state, self.inflight, self.backlog_s, missing, self.url or "", self.contended,
                                reused)

    def _ready(self, text: str) -> None:
        with self._lock:
            if self.stopped:
                return
            self._failed_probes = 0
            self.state = "ready"
            self.ready.set()
        self.ledger.event(text)

    def _reprobe_later(self) -> None:
        """A worker that is still there (external, or embedded and alive) is asked again, backing off;
        an embedded one that died is _maybe_restart's business."""
        with self._lock:
            if self.stopped or self._probing or self.state == "ready" or os.getpid() != self.owner:
                return
            if self.embedded and not self.alive():
                return
        delay = min(0.1 * 2 ** min(self._failed_probes - 1, 8), REPROBE_MAX_S)
        timer = threading.Timer(delay, self._probe)
        timer.daemon = True
        timer.start()

    def _ping(self, chan: transport.Channel) -> float:
        """One round trip, less the worker's health check (real device work, issue 8)."""
        rid = next(self._ids)
        t = time.perf_counter()
        header, _ = chan.request(rid, wire.encode({"t": "hello", "id": rid}), time.monotonic() + 5, self.watch)
        took = time.perf_counter() - t
        health = header.get("health_s")
        return max(took - health, took / 10) if isinstance(health, float) else took

    def _probe_alive(self) -> bool:
        """A probe also ends when the link is stopped: its thread must not hold a socket for up to
        ready_timeout after uninstall."""
        return not self.stopped and self.alive()

    @property
    def watch(self) -> "Any":
        """What a request on this link watches besides its socket: the embedded worker's process
        (its exit ends the wait as WorkerDied), or nothing for a worker this process did not start."""
        return self.alive if self.proc is not None else None

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
        self.planner.worker_down(self.index)
        self.ledger.event(f"worker fault: {type(exc).__name__}: {exc}")
        self._drop_channel()  # its socket may still hold a late reply or a dead connection: start afresh
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

    def wait_ready(self, timeout: float, while_starting: bool = False) -> bool:
        """Wait for readiness up to ``timeout``; False at once when there is no hope (stopped, or an
        embedded worker dead with no restart left), or with ``while_starting`` once the worker is
        no longer a cold one starting up (its first probe failed: calls do not wait on retries)."""
        deadline = time.monotonic() + timeout
        while not self.ready.is_set():
            if self.stopped or (self.embedded and self.restarts >= MAX_RESTARTS and not self.alive()):
                return False
            if while_starting and self.state != "starting":
                return False
            if not self.ready.wait(min(0.05, max(deadline - time.monotonic(), 0))) and time.monotonic() >= deadline:
                return False
        return True

    # -- channels -------------------------------------------------------------------------------
    def channel(self) -> transport.Channel:
        chan = getattr(self._local, "chan", None)
        if chan is None or chan.pid != os.getpid() or chan.url != self.url:
            # a forked child lands here too: it never touches its parent's socket (issue 8)
            chan = transport.Channel(self.url, self.curve)
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
        self._close_shm()
        self._drop_channel()  # this thread's; other threads' channels go with their threads
        if self.proc is not None and os.getpid() == self.owner and self.proc.poll() is None:
            self.proc.terminate()
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped worker would hold SIGTERM pending
            except OSError:
                pass
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmpdir and os.getpid() == self.owner:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


    def _close_shm(self) -> None:
        """Unlink this client's segment names (issue 9); a worker that outlives it is told to unmap
        them (an embedded one is about to exit; the others would only notice this process gone)."""
        names = self.lane.close()
        if names and not self.embedded and os.getpid() == self.owner:
            try:
                rid = next(self._ids)
                self.channel().request(rid, wire.encode({"t": "stats", "id": rid, "shm_drop": names}),
                                       time.monotonic() + 0.5, self.watch)
            except transport.TransportError:
                pass  # it unmaps them when it sees this process gone


def call_header(rid: int, prep: Prepared) -> dict:
    """The header of the ``call`` message for a prepared call (wire.py's docstring has the format)."""
    # a result asked for in a permuted axis order travels transposed to it (see _assemble)
    results = [{"dtype": dt.str, "shape": [shape[i] for i in lay] if isinstance(lay, list) else list(shape)}
               for (dt, shape), lay in zip(prep.results, prep.layouts)]
    return {"t": "call", "id": rid, "op": prep.spec.kernel_id, "params": prep.params, "layouts": prep.layouts,
            "results": results}


def call_message(rid: int, prep: Prepared) -> list:
    """The ``call`` message for a prepared call, every input by value."""
    return wire.encode(call_header(rid, prep), prep.arrays)


def _load_curve(config: Config) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) from the Config's key files, or None."""
    if not config.server_key:
        return None
    from .auth import load_pair, load_public

    public, secret = load_pair(config.client_keys)
    return load_public(config.server_key), public, secret


_links: "weakref.WeakSet[WorkerLink]" = weakref.WeakSet()


def _links_after_fork() -> None:
    for link in list(_links):
        link._lock = threading.RLock()  # a parent thread may have held it at the fork
        link._probing = False  # the parent's probe thread does not exist here


os.register_at_fork(after_in_child=_links_after_fork)


class Runtime:
    """Everything one process's shim holds; created by :func:`fusion_shim.install`."""

    def __init__(self, config: Config):
        self.config = config
        self.ledger = Ledger()
        self.guard = GUARD  # .busy: the shim's own NumPy calls must not re-enter it
        self.local_only = config.policy == "local"
        self._urls: list[str | None] = list(config.workers) or [config.worker]  # None: an embedded worker
        cache = None
        if not self.local_only:
            from .plan import calibrate
            key = calibrate.build_key()
            cache = calibrate.Cache(calibrate.cache_path(key), key)
        from .catalog import CATALOG, OPERATORS
        self.planner = plan.Planner(config.policy, len(self._urls), min_flops=config.min_flops, cache=cache,
                                    background=self._background, on_event=self.ledger.event,
                                    ops={s.name: s.family for s in (*CATALOG, *OPERATORS)})
        self.planner.inputs_may_be_resident = config.residency
        self.planner.on_floors = self._publish_floor
        self.planner.worker_busy = lambda: any(link.inflight and link.cpus_shared for link in self.links)
        # an embedded CPU worker is deferred (see the module's docstring); under auto every floor
        # stays NEVER until a worker is ready (Planner.held), so until it has started and warmed
        self.deferred = (config.policy == "auto" and self._urls == [None] and config.device == "auto"
                         and not gpu_visible())
        self.links: list[WorkerLink] = []
        self._inflight_lock = threading.Lock()
        self.fast_calls: dict[str, list] = {}  # op name -> its C fast paths (intercept), which hold its floor
        self._bg_lock = threading.Lock()
        self._bg_queue: "queue.SimpleQueue | None" = None
        self._bg_pid = 0
        # whether `@`, `@=` and `.dot` are intercepted, and why not (set by intercept, issue 3)
        self.operators: dict[str, Any] = {"intercepted": False, "why": "not installed", "fast_path": "wrapt"}
        self.link: WorkerLink | None = None
        self.started_wall = time.time()
        self.export_env = False  # set by the launcher: children reuse this process's worker
        self._verify_debt = 0.0  # sampling: a call is checked each time this reaches 1
        self.pinned_checks: dict[tuple, str] = {}  # op signature -> call site of the mismatch that pinned it
        self.reuse = Reuse()  # inputs this process keeps passing to remote candidates (issue 5)
        self.hash_rate = HashRate()  # how fast this process fingerprints inputs (what a look costs)
        self._results: dict[str, type] = {}
        # issue 8: ops in flight when the worker went down, by (kernel id, input dtypes)
        self.crash_limit = CRASH_LIMIT
        self.crashes: dict[tuple, int] = {}
        self.pinned: dict[tuple, str] = {}  # -> the reason; these run locally for the rest of the run
        self._crash_lock = threading.Lock()

    def start(self) -> None:
        """Start (or connect to) the workers in the background; called once NumPy is imported."""
        if self.local_only or self.link is not None:
            return
        self.links = [WorkerLink(self.config, self.ledger, self.planner, self.guard, url, i)
                      for i, url in enumerate(self._urls)]
        self.link = self.links[0]  # the first (with one worker, the only one)
        if self.deferred:
            self.link.state = "deferred"
            self.ledger.event(f"no GPU on this host: the embedded worker would run on this program's own CPUs, "
                              f"so it starts only after {CPU_WORKER_AFTER_S:g} s of run (FUSION_SHIM_DEVICE=cpu "
                              "starts it now; FUSION_SHIM_WORKER connects to another host's)")
            timer = threading.Timer(CPU_WORKER_AFTER_S, self._start_deferred)
            timer.daemon = True
            timer.start()
            if self.export_env:  # children connect to the worker this process will start, never their own
                self.link.tmpdir = tempfile.mkdtemp(prefix="fusion-shim-")
                os.environ["FUSION_SHIM_WORKER"] = self.link.url = f"ipc://{self.link.tmpdir}/worker-0.sock"
            return
        for link in self.links:  # the floors stay NEVER until one is ready (Planner.held)
            link.start()
        if self.config.policy == "auto":  # calibration and floors run there: started off the program's calls
            self._background_thread()
        if self.export_env and self.link.embedded:
            os.environ["FUSION_SHIM_WORKER"] = self.link.url

    def _start_deferred(self) -> None:
        """The deferred embedded CPU worker: the program has run long enough to pay for its start."""
        from . import intercept

        link = self.link
        if (intercept._runtime is not self or link is None or link.stopped or link.state != "deferred"
                or os.getpid() != link.owner):
            return
        self.deferred = False
        self.ledger.event(f"the program has run {CPU_WORKER_AFTER_S:g} s: starting the embedded worker on this host's CPUs")
        link.start()
        if self.config.policy == "auto":
            self._background_thread()

    # -- what the interceptor and the planner read (issue 5) ----------------------------------------
    @property
    def floor_bytes(self) -> int:
        """The smallest floor of any op (the C fast path compares with it); each op's own is
        ``floor_cell(name)[0]``."""
        return self.planner.floor_bytes

    def floor_cell(self, name: str) -> list[int]:
        """The op's floor as a one-element list the interceptor reads without a lock or a lookup."""
        return self.planner.floor_cells[name]

    def operator_floors(self) -> tuple[int, int, int]:
        """The own floors of ``@``, ``@=`` and ``.dot`` (catalog.OPERATORS' order)."""
        from .catalog import OPERATORS

        return tuple(self.floor_cell(spec.name)[0] for spec in OPERATORS)

    def _publish_floor(self, floor_bytes: int, ops: Any = ()) -> None:
        """The planner refreshed floors: the C fast path holds the smallest, each wrapped function
        and each operator its own (issue 3)."""
        from . import intercept

        with intercept._lock:  # never after uninstall published -1, nor for a runtime replaced since
            if intercept._runtime is not self or self.local_only:
                return
            intercept.native.publish_floor(floor_bytes)
            for name in ops:
                for fast in self.fast_calls.get(name, ()):
                    fast.floor = self.floor_cell(name)[0]
            if any(name.startswith("numpy.ndarray.") for name in ops):
                intercept.native.publish_op_floors(self.operator_floors())

    def _background(self, fn: Any, name: str) -> None:
        """Run ``fn`` on the shim's background thread, whose NumPy calls are not intercepted
        (calibration probes, every floor at once)."""
        self._background_thread().put((fn, name))

    def _background_thread(self) -> "queue.SimpleQueue":
        """The background thread's queue. One thread for the run, started with the workers (under
        policy auto; else on first use): starting a thread waits for it to run, which beside a
        BLAS call on a 2-core machine took 0.5-4 ms of the program's thread (the first calibration
        probe queued, in traced runs of ``mix``)."""
        with self._bg_lock:
            if self._bg_queue is None or self._bg_pid != os.getpid():  # a forked child starts its own
                self._bg_queue, self._bg_pid = queue.SimpleQueue(), os.getpid()
                threading.Thread(target=self._background_loop, args=(self._bg_queue,), name="fusion-shim-background",
                                 daemon=True).start()
            return self._bg_queue

    def _background_loop(self, jobs: "queue.SimpleQueue") -> None:
        self.guard.busy = True
        while True:
            fn, name = jobs.get()
            if fn is None:
                return
            try:
                fn()
            except Exception as exc:  # a failed probe leaves the priors in place; say so
                self.ledger.event(f"{name} failed: {type(exc).__name__}: {exc}")

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
        rec = Record(spec.name, spec.family, site=call_site(4), start_s=t0 - self.ledger.started,
                     thread=threading.get_ident())
        try:
            prep = prepare(spec, sig, args, kwargs)
        except Unsupported as exc:
            rec.kind, rec.reason = "unsupported", str(exc)
            return rec
        rec.shapes = [list(a.shape) for a in prep.arrays]
        rec.dtypes = [a.dtype.str for a in prep.arrays]
        pinned_at = self.pinned_checks.get(_signature(rec)) if self.pinned_checks else None
        if pinned_at is not None:
            rec.kind, rec.reason = "local", f"pinned local: a checked answer differed at {pinned_at}"
            return rec
        op_key = (spec.kernel_id, tuple(rec.dtypes))
        if self.pinned and op_key in self.pinned:
            rec.kind, rec.reason = "fallback", self.pinned[op_key]
            return rec
        # only a cold worker is waited for; one that faulted is probed in the background instead
        if (self.config.policy == "remote" and self.link is not None and self.link.state == "starting"
                and not any(link.ready.is_set() for link in self.links)):
            waited = time.perf_counter()
            self.link.wait_ready(self.config.ready_timeout, while_starting=True)
            rec.phases["wait_ready"] = time.perf_counter() - waited
        unoffered = self._unoffered(spec)
        if unoffered is not None:
            rec.kind, rec.reason = "unsupported", unoffered
            return rec
        call = plan.Call(spec.name, spec.family, _dtype_code(prep), prep.flops, prep.bytes_in, prep.bytes_out)
        decision = self.planner.decide(call, self._states(spec, [None] * len(self.links)))
        wired = None
        inputs_up = None  # the fewest input bytes a worker could be priced for (None: not looked at)
        # Residency (issue 6): fingerprint only a remote candidate: a call that goes to a worker, or
        # one that would if its inputs were already there by more than hashing them costs, or one for
        # which where its inputs are decides whether it is evidence for its op's floor (issue 5). Each
        # worker is then priced for the input bytes it does not hold (issue 5), and the one that holds
        # them is preferred.
        if self.config.residency and self.links and decision.remote_s is not None and (
                decision.where == "worker" or self._would_offload_if_resident(spec, call)
                or self.planner.residency_decides(call, decision)):
            t = time.perf_counter()
            wired = _Wired(prep.arrays)
            rec.phases["fingerprint"] = spent = time.perf_counter() - t
            self.hash_rate.observe(wired.hashed, spent)
            to_send = [wired.to_send(link.mirror, self.reuse) for link in self.links]
            inputs_up = min(wired.least_to_send(link.mirror, self.reuse) for link in self.links)
            self.reuse.note(wired.fps)
            if any(priced != prep.bytes_in for priced, _ in to_send):
                decision = self.planner.decide(call, self._states(spec, *zip(*to_send)))
        if (self.config.policy == "auto" and decision.remote_s is not None and decision.local_s is not None
                and any(link.bandwidth is None for link in self.links) and (decision.where == "worker" or (
                    self.planner.link_could_matter(call, self._states(spec, [None] * len(self.links)))))):
            # a worker is in the running for this call, its link aside: the link's bandwidth is
            # worth measuring now (priced with the prior until then; where even a free link would
            # leave the call here, never; under policy remote nothing is decided, and the probe's
            # traffic would only blur the counts). A call long enough waits for it and is decided
            # again with the measured link; so does the next call to want it after the probe's
            # thread found the program busy (measure_bandwidth_soon).
            t = time.perf_counter()
            probed = False
            for link in self.links:
                if link.bandwidth is None:
                    # the probe takes a few round trips and ~1-4 MB: waited for only where that is small
                    wait = decision.local_s >= max(SYNC_LINK_PROBE_S, SYNC_LINK_PROBE_RTTS * (link.rtt_s or 1.0))
                    probed = link.measure_bandwidth_soon(wait) or probed
            if probed:
                rec.phases["link_probe"] = time.perf_counter() - t
                decision = self.planner.decide(call, self._states(spec, *(
                    zip(*to_send) if wired is not None else ([None] * len(self.links),))))
        rec.plan = Planned(call, decision, inputs_up)
        rec.reason = decision.reason
        rec.predicted_local_s, rec.predicted_remote_s = decision.local_s, decision.remote_s
        if decision.where == "local":
            # under policy remote every supported call was meant for the worker: that is a fallback
            rec.kind = "fallback" if self.config.policy == "remote" else "local"
            return rec
        link = self.links[decision.worker or 0]
        predicted = decision.remote_s
        deadline_s = self.config.timeout
        if predicted is not None and (call.op, call.dtype) in link.answered:
            deadline_s = min(deadline_s, max(DEADLINE_FLOOR_S, DEADLINE_FACTOR * predicted))
        # an exploration's cost is bounded: past this it is computed here; not where the worker computes
        # on this machine's CPUs, where the abandoned call would go on competing with the local one
        # (measured on 2 cores: a local solve 10x slower while the worker finished the abandoned one;
        # there the planner prices explorations more pessimistically instead, policy.SIGMA_SHARED_CPUS)
        bounded = decision.explore and not link.cpus_shared
        if bounded:
            deadline_s = min(deadline_s, self.planner.explore_deadline(decision))
        with self._inflight_lock:
            link.inflight += 1
            link.backlog_s += predicted or 0.0
        t_sent = time.perf_counter()
        try:
            value = self._remote(prep, rec, link, wired, deadline_s, call, decision)
        except transport.Timeout as exc:
            if not bounded:
                return self._failed(exc, rec, link, call, op_key, t_sent, deadline_s, predicted)
            # an exploration out of its deadline: not a fault (the worker is up, only slower than
            # hoped); the late reply is dropped when it comes, and the call runs here. The worker may
            # still be computing it: its next answers, measured, will show that
            waited = time.perf_counter() - t_sent
            self.planner.abandoned(link.index, call, waited)
            rec.phases["abandoned"] = waited
            rec.kind = "local"
            rec.reason = (f"exploration abandoned after {waited * 1e3:.3g} ms (predicted {(predicted or 0) * 1e3:.3g} "
                          f"ms there, {(decision.local_s or 0) * 1e3:.3g} ms here): computed here")
            rec.plan = Planned(call, plan.Decision("local", rec.reason, decision.local_s, decision.remote_s))
            if self.planner.explorations_abandoned == 1:
                self.ledger.event(f"an exploration of {call.op} on {link.url} was abandoned after "
                                  f"{waited * 1e3:.3g} ms and computed here (explorations' cost is bounded "
                                  "by their budget; the report's planner section counts them)")
            return rec
        except transport.TransportError as exc:
            return self._failed(exc, rec, link, call, op_key, t_sent, deadline_s, predicted)
        except Exception as exc:
            # a bug on the shim's own remote path (not NumPy's error, not the worker's: NumPy runs
            # after this, in the caller's frame) must not reach the program either (issue 8)
            link.fault(exc)
            rec.kind, rec.reason = "fallback", f"internal error: {type(exc).__name__}: {exc}"[:300]
            return rec
        finally:
            with self._inflight_lock:
                link.inflight -= 1
                link.backlog_s = max(link.backlog_s - (predicted or 0.0), 0.0) if link.inflight else 0.0
        rec.kind = "worker"
        rec.wall_s = time.perf_counter() - t0
        link.answered.add((call.op, call.dtype))
        return Done(value, rec, prep)

    def _failed(self, exc: Exception, rec: Record, link: "WorkerLink", call: plan.Call, op_key: tuple,
                t_sent: float, deadline_s: float, predicted: float | None) -> Record:
        """A call the link failed (issue 8): a fallback, said in its record; the link is faulted
        unless the worker only answered this call with an error."""
        detail = ""
        if isinstance(exc, transport.Timeout):
            detail = f" ({deadline_s:.3g} s: predicted {predicted or 0:.3g} s)"
            # it took at least this long: the next prediction for the op moves up
            self.planner.timed_out(link.index, call, time.perf_counter() - t_sent)
        if isinstance(exc, (transport.WorkerDied, transport.WorkerLost)):
            self._count_crash(op_key, exc)
        if not isinstance(exc, WorkerFault):  # an error reply is about this call, not the worker
            link.fault(exc)
        rec.kind, rec.reason = "fallback", f"{type(exc).__name__}: {exc}{detail}"[:300]
        return rec

    def _would_offload_if_resident(self, spec: OpSpec, call: plan.Call) -> bool:
        """Would some ready worker take the call if it held every input, with the time hashing them
        to find out added to its side? A look that costs more than the call could gain (a
        matrix-vector product reads its 32 MB matrix once: 1.7 ms here, 1.2 ms to hash) loses even
        when they are there. (Pure: no learning.)"""
        look = self.hash_rate.seconds(call.bytes_in)
        states = [replace(w, backlog_s=w.backlog_s + look)
                  for w in self._states(spec, [0] * len(self.links))]
        try:
            return plan.decide(self.config.policy, call, self.planner.profile, states, 0.0,
                               self.config.min_flops).where == "worker"
        except Exception:  # a planner bug: no residency for this call, never an exception
            return False

    def _unoffered(self, spec: OpSpec) -> str | None:
        """Why no worker can run this row (a numba row where no worker has numba-cuda, issue 9)."""
        if not self.links or any(link.offers(spec.kernel_id) for link in self.links):
            return None
        return f"the worker has no kernel {spec.kernel_id} (numba: {self.link.info.get('numba')})"

    def _states(self, spec: OpSpec, missing: Any, reused: Any = None) -> list[plan.WorkerState]:
        """Each worker as the planner sees it for this call (``missing``, ``reused``: per worker, as
        plan_state takes them); one without the row's kernel is no candidate."""
        return [link.plan_state(m, r) if link.offers(spec.kernel_id) else plan.WorkerState("without-kernel",
                                                                                            name=link.url or "")
                for link, m, r in zip(self.links, missing, reused or [0] * len(self.links))]

    def _count_crash(self, op_key: tuple, exc: Exception) -> None:
        """The worker went down with this op in flight; at ``crash_limit`` it runs locally from now on."""
        with self._crash_lock:
            n = self.crashes[op_key] = self.crashes.get(op_key, 0) + 1
            if n < self.crash_limit or op_key in self.pinned:
                return
            self.pinned[op_key] = (f"pinned local: {op_key[0]}({', '.join(op_key[1])}) was in flight {n} times "
                                   f"when the worker went down (last: {type(exc).__name__})")
        self.ledger.event(f"{self.pinned[op_key]}; it runs locally for the rest of the run")

    # -- after the worker answered -----------------------------------------------------------------
    def remote_done(self, done: Done, original: Any, sig: inspect.Signature, args: tuple, kwargs: dict) -> Any:
        """Record the call; when it is sampled for a check, compute it locally too and compare. The
        check's time is its own phase, outside the call's wall time and the production totals."""
        rec = done.rec
        if original is None or not self._sampled():  # None: the call cannot be recomputed (`a @= b`)
            self.ledger.add(rec)
            return done.value
        t = time.perf_counter()
        bound = sig.bind(*args, **kwargs)
        if "out" in bound.arguments:
            bound.arguments["out"] = None  # the check must not write into the program's array again
        self.guard.busy = True
        try:
            want = original(*bound.args, **bound.kwargs)
        except Exception as exc:  # NumPy refuses what the worker computed: NumPy's answer stands
            rec.verify, rec.phases["verify"] = f"mismatch: NumPy raised {type(exc).__name__}", time.perf_counter() - t
            self._pin(rec)
            raise
        finally:
            self.guard.busy = False
        numpy_s = time.perf_counter() - t  # NumPy's own time, without the comparison (issue 5's oracle)
        problem = compare(rec.op, done.prep.out if done.prep.out is not None else done.value, want, done.prep.arrays)
        rec.phases["verify"] = time.perf_counter() - t
        rec.local_measured_s = numpy_s
        planned: Planned | None = getattr(rec, "plan", None)
        if planned is not None:  # a check is also a measurement of the local side
            self.planner.measured_local(planned.call, numpy_s)
        if problem is None:
            rec.verify = "ok"
            self.ledger.add(rec)
            return done.value
        rec.verify = f"mismatch: {problem}"
        self._pin(rec)
        if self.config.strict:
            raise VerificationError(f"{rec.op} at {rec.site}: the worker's answer differed from NumPy's: {problem}")
        if done.prep.out is not None:
            np.copyto(done.prep.out, want)
            return done.prep.out
        return want

    def _sampled(self) -> bool:
        fraction = self.config.verify
        if fraction <= 0:
            return False
        self._verify_debt += fraction
        if self._verify_debt >= 1.0 - 1e-12:
            self._verify_debt -= 1.0
            return True
        return False

    def _pin(self, rec: Record) -> None:
        self.pinned_checks[_signature(rec)] = rec.site
        self.ledger.add(rec)
        self.ledger.event(f"{rec.op} {rec.dtypes} pinned local: the worker's answer at {rec.site} differed "
                          f"from NumPy's ({rec.verify})")

    def _remote(self, prep: Prepared, rec: Record, link: WorkerLink, wired: "_Wired | None", deadline_s: float,
                call: plan.Call | None = None, decision: plan.Decision | None = None) -> Any:
        chan = link.channel()
        t0 = time.perf_counter()
        header = call_header(link.next_id(), prep)
        if wired is None:
            items, fps, refs = [wire.to_wire(a) for a in prep.arrays], None, ()
        else:
            wired.refs = wired.refs_in(link.mirror)
            header["keep"] = True
            items, fps, refs = wired.items, wired.fps, wired.refs
        reply, arrays, t1 = self._exchange(link, chan, header, items, fps, refs, prep, rec, deadline_s)
        if reply["t"] == "error" and reply.get("kind") == "missing" and wired is not None and wired.refs:
            # the mirror was stale (an eviction it did not hear of, another client): resend by value, once
            link.mirror.discard(reply.get("missing") or ())
            rec.resends += len(wired.refs)
            header["id"] = link.next_id()
            before = chan.last_bytes_sent, chan.last_bytes_received
            reply, arrays, _ = self._exchange(link, chan, header, items, fps, (), prep, rec, deadline_s)
            chan.last_bytes_sent += before[0]  # both round trips were on the socket
            chan.last_bytes_received += before[1]
            wired.refs = []
        t2 = time.perf_counter()
        rec.bytes_sent, rec.bytes_received = chan.last_bytes_sent, chan.last_bytes_received
        if reply["t"] == "error":
            raise WorkerFault(f"worker raised {reply.get('exc')} ({reply.get('kind')}): {reply.get('msg')}"[:300])
        if reply["t"] != "result":
            raise transport.BadReply(f"a call answered with {reply['t']!r}")
        value = self._assemble(prep, arrays)
        if wired is not None:
            rec.resident_hits = len(wired.refs)
            rec.bytes_saved = sum(wired.sizes[i] for i in wired.refs)
            evicted = reply.get("evicted") or ()
            rec.evictions = len(evicted)
            link.mirror.discard(evicted)
            kept = set(reply.get("kept") or ())  # the worker says which inputs it kept
            for i, fp in enumerate(wired.fps):
                if fp in kept:
                    link.mirror.add(fp, wired.sizes[i])
            for meta, arr in zip(reply.get("arrays", ()), arrays):
                if isinstance(meta, dict) and meta.get("fp"):
                    link.mirror.add(meta["fp"], arr.nbytes)
        t3 = time.perf_counter()
        timing = reply.get("timing") if isinstance(reply.get("timing"), dict) else {}
        worker_s = {k: float(v) for k, v in timing.items()
                    if k in ("h2d", "kernel", "d2h", "fingerprint") and isinstance(v, (int, float))}
        worker_fp = worker_s.pop("fingerprint", 0.0)
        rec.phases.update(worker_s)
        if timing.get("oom_retry"):
            self.ledger.event(f"worker ran out of memory on {prep.spec.kernel_id}; it freed its caches and the retry "
                              "succeeded")
        if worker_fp:
            rec.phases["fingerprint"] = rec.phases.get("fingerprint", 0.0) + worker_fp
        # the worker may start before send() returns (zero-copy sends overlap), so send and transfer
        # share what the round trip leaves after the worker's own time: phases never exceed the wall
        on_link = max(t2 - t1 - sum(worker_s.values()) - worker_fp, 0.0)
        send = min(chan.last_send_s, on_link)
        rec.phases.update(encode=t1 - t0, send=send, transfer=on_link - send, decode=t3 - t2)
        if call is not None and decision is not None:
            # the device model learns the kernel's time; the link model everything else of the round
            # trip, with the bytes that crossed it (socket and shared memory)
            self.planner.observed_remote(link.index, call, decision, t3 - t0, worker_s.get("kernel"),
                                         rec.bytes_sent + rec.shm_sent, rec.bytes_received + rec.shm_received)
        return value

    def _exchange(self, link: WorkerLink, chan: transport.Channel, header: dict, items: list, fps: Any,
                  refs: Any, prep: Prepared, rec: Record, deadline_s: float) -> tuple[dict, list, float]:
        """One request and its reply; returns (reply, arrays, when encoding ended). On a same-host
        link the buffers go through shared memory (issue 9, :func:`transport.shm.exchange`)."""
        ex = shmlane.exchange(chan, link.shm(), header, items, fps, refs, prep.results,
                              time.monotonic() + deadline_s, link.watch, link.ledger.event)
        rec.shm_sent += ex.sent
        rec.shm_received += ex.received
        return ex.reply, ex.arrays, ex.encoded

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
            return prep.out[()] if prep.scalar_out and prep.out.ndim == 0 else prep.out
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
        planned: Planned | None = getattr(rec, "plan", None)
        if planned is not None and exc is None:
            self.planner.observed_local(planned.call, planned.decision, seconds, planned.inputs_up)
        self.ledger.add(rec)
        if self.config.strict and exc is None and rec.kind in ("unsupported", "fallback"):
            raise FallbackError(f"{rec.op} at {rec.site} ran locally: {rec.kind}: {rec.reason}")

    # -- end of run ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        for link in self.links:
            link.stop()
        with self._bg_lock:
            if self._bg_queue is not None and self._bg_pid == os.getpid():
                self._bg_queue.put((None, ""))  # the background thread ends after its current job
                self._bg_queue = None


class _Wired:
    """A call's inputs laid out for the wire, with fingerprints for those worth keeping; ``refs``:
    the indices the chosen worker is believed to hold (sent as references)."""

    def __init__(self, arrays: list):
        self.items, self.fps, self.refs = [], [], []
        self.sizes = [a.nbytes for a in arrays]
        self.hashed = 0  # bytes fingerprinted
        for arr in arrays:
            meta, buf = wire.to_wire(arr)
            self.items.append((meta, buf))
            keep = worth_keeping(arr.nbytes)
            self.fps.append(fingerprint(meta, buf) if keep else None)
            self.hashed += arr.nbytes if keep else 0

    def refs_in(self, mirror: Mirror) -> list[int]:
        return [i for i, fp in enumerate(self.fps) if fp is not None and fp in mirror]

    def to_send(self, mirror: Mirror, reuse: Reuse) -> tuple[int, int]:
        """(input bytes a worker with ``mirror`` is priced for, bytes of inputs reused here whose
        upload is priced over their reuse): what it holds costs nothing, what this process keeps
        reusing costs its share (residency.Reuse), the rest in full."""
        held = set(self.refs_in(mirror))
        priced = reused = 0.0
        for i, (fp, size) in enumerate(zip(self.fps, self.sizes)):
            if i in held:
                continue
            share = reuse.share(fp)
            priced += size * share
            reused += size if share < 1.0 else 0
        return int(priced), int(reused)

    def least_to_send(self, mirror: Mirror, reuse: Reuse) -> int:
        """The fewest input bytes a worker with ``mirror`` could ever be priced for with these inputs
        (what ``to_send`` prices once each reused input's share has fallen as far as it goes)."""
        held = set(self.refs_in(mirror))
        return int(sum(size * reuse.least_share(fp) for i, (fp, size) in enumerate(zip(self.fps, self.sizes))
                       if i not in held))


def _dtype_code(prep: Prepared) -> str:
    """The compute dtype as the planner's models key it: "f8", "c16", "i8", ..."""
    dt = prep.params.get("cdtype") if isinstance(prep.params, dict) else None
    dt = np.dtype(dt if dt else (prep.arrays[0].dtype if prep.arrays else "f8"))
    return f"{dt.kind}{dt.itemsize}"


def _signature(rec: Record) -> tuple:
    """What a verification mismatch pins to local: the op with these dtypes and ranks."""
    return rec.op, tuple(rec.dtypes), tuple(len(s) for s in rec.shapes)

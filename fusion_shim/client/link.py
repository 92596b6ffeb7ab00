"""One worker link: its process when embedded, its readiness, one channel per thread.

A link's states: ``starting`` (a cold worker: under ``remote`` the first call waits for it),
``ready``, ``down`` (a fault: probed again in the background, backing off, while calls run locally),
``deferred`` (D40: an embedded CPU worker not started yet), ``shared_cpus`` (D301: a worker on this
host's CPUs that ``auto`` does not use), ``stopped`` (final). D329: only the link's own methods change
its state (``_become``), and its ``ready`` Event follows it. Each thread and each process has its own
channel (``Channel.pid``). An embedded worker that died is restarted up to ``MAX_RESTARTS`` times. A
pool's worker (``endpoint``) is restarted by Ray: after a fault its link asks ``locate`` where it is
now; a new endpoint is a cold worker (its pid differs: the mirror is cleared, inputs are sent again).
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from enum import Enum
from typing import Any

from .. import plan, procinfo, transport
from ..config import Config
from ..ledger import Ledger
from ..plan import cpuwins
from ..protocol import messages
from ..transport import shm as shmlane
from . import embedded, linkprobe, rundir
from .linkkeys import _load_curve, _loopback_tcp, _say_insecure, _say_unauthenticated, _say_unreachable, _unauthenticated
from .residency import Mirror

MAX_RESTARTS = 2  # an embedded worker that died is restarted this many times, then the run stays local
QUIET_TRIES = 4  # D24: a probe on its own thread waits for an idle moment this many checks (about 0.2 s),
HANDOFF_RTT_S = 1e-3  # then runs, unless its link is this close: then the next call that wants it makes it
REPROBE_MAX_S = 5.0  # a faulted worker is probed again after 0.1 s, doubling up to this
NO_LISTENER_S = 1.5  # D35: an address where nothing accepts connections this long is reported down


class LinkState(str, Enum):
    """A link's state (the module's docstring): equal to its name as a string, and so reported."""
    STARTING, READY, DOWN = "starting", "ready", "down"
    DEFERRED, SHARED_CPUS, STOPPED = "deferred", "shared_cpus", "stopped"
    __str__, __format__ = str.__str__, str.__format__  # f-strings and str() give the value too


class WorkerLink:
    """One worker: its process when embedded, its readiness, one channel per thread."""

    def __init__(self, config: Config, ledger: Ledger, planner: plan.Planner, url: str | None = None,
                 index: int = 0, endpoint: Any = None, locate: Any = None):
        self.config = config
        self.ledger = ledger
        self.planner = planner
        self.index = index  # this worker's place in the planner's profile
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
        self._state = LinkState.STARTING
        self.ready = threading.Event()  # set iff the state is READY (_become)
        self.info: dict[str, Any] = {}
        self._offered: tuple[Any, frozenset] = (None, frozenset())  # (info's kernel list, as a set)
        self.cpus_shared = False  # shares_cpus(), as of the last ready
        self.contended = False    # ... and this process's BLAS may run threads beside it (read for every decision)
        self.mirror = Mirror()  # what this worker is believed to hold: a hint
        self.restarts = 0
        self.calls = self.calls_since_restart = 0  # answered here, for the report
        self.bytes_sent = self.bytes_received = 0
        self.pool: dict[str, Any] | None = None  # a pool worker's name, node, device (locate.Endpoint.info)
        self._locate = locate  # index -> locate.Endpoint | None: where Ray has this worker now
        self.ready_after_s: float | None = None
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # spawn, stop and probe never interleave
        self._probing = False
        self._probe_gen = 0
        self._failed_probes = 0  # consecutive; sets the back-off and keeps the events short
        self._curve = endpoint.curve if endpoint is not None else _load_curve(config, self.url, ledger.event)
        self._own_keys = (endpoint is None and not config.server_key and not config.insecure
                          and _loopback_tcp(self.url))
        if endpoint is not None:
            self.pool = {"name": endpoint.name, **endpoint.info}
        self.lane = shmlane.ClientLane(config.shm, ledger.event)  # same-host shared memory
        _links.add(self)
        if self.curve is None and self._tcp() and config.insecure:
            ledger.event(f"connecting to {self.url} WITHOUT AUTHENTICATION (--insecure): the worker must run "
                         "--insecure too; anyone able to listen at that address gets every input")
            _say_insecure(self.url)

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def stopped(self) -> bool:  # after stop(): no restart, no probe (a late thread must not respawn)
        return self._state is LinkState.STOPPED

    def _become(self, state: LinkState) -> bool:
        """The one place the state changes; the ready Event follows it. False: stopped, it stays so."""
        with self._lock:
            if self._state is LinkState.STOPPED:
                return False
            self._state = state
            (self.ready.set if state is LinkState.READY else self.ready.clear)()
            return True

    def defer(self, url: str | None = None, tmpdir: str | None = None) -> None:
        """D40: an embedded worker not started yet, at the address children were told at install
        (its first spawn binds it) in the directory this process made for it, when given."""
        with self._lock:
            self._become(LinkState.DEFERRED)
            self.url = url or self.url
            self.tmpdir = tmpdir or self.tmpdir

    @property
    def curve(self) -> tuple[bytes, bytes, bytes] | None:
        """The CURVE keys for this worker. This user's own (D68) are looked for again at each new
        channel until found: a worker started at the same moment may not have made them yet."""
        if self._curve is None and self._own_keys:
            self._curve = _load_curve(self.config, self.url, None)
        return self._curve

    def _tcp(self) -> bool:
        return (self.url or "").startswith("tcp://")

    def _channel(self, alive: Any = None, lane: Any = None) -> transport.Channel:
        """A new channel to this worker. D34, D35: one started elsewhere whose address refuses
        connections is not waited for, unless it is starting (the embedded one is watched instead).
        D181: a tcp worker without keys to authenticate it gets no connection, unless --insecure.
        Its requests watch ``alive`` and use the shared-memory ``lane`` (:class:`transport.Channel`)."""
        curve = self.curve
        if curve is None and self._tcp() and not self.config.insecure:
            raise _unauthenticated(self.config, self.url or "")
        give_up = None if self.embedded else NO_LISTENER_S
        return transport.Channel(self.url, curve, self.config.worker_uid, give_up, self._worker_coming, alive=alive,
                                 lane=lane)

    def _await_keys(self) -> None:
        """D181: this user's keys for a loopback tcp worker, waited for as a channel waits for a
        listener (D35): a worker starting at the address makes them (D68)."""
        start = time.monotonic()
        while self._own_keys and self.curve is None and self._probe_alive():
            waited = time.monotonic() - start
            if waited >= transport.COMING_MAX_S or (waited >= NO_LISTENER_S and not self._worker_coming()):
                return
            time.sleep(0.1)

    def _worker_coming(self) -> bool:
        """A parent run's embedded worker (deferred, or importing torch), or a process on this host
        started to serve the address: it binds once it has imported torch."""
        url = self.url or ""
        return rundir.is_run_socket(url) or (transport.is_loopback(url) and procinfo.worker_binding(url))

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.lane.start(self.url)
        if self.embedded:
            self._spawn()
        self._probe()

    def shm(self) -> "shmlane.ShmPool | None":
        """The shared-memory pool for this worker, where the lane was negotiated."""
        return self.lane.pool()

    def make_tmpdir(self) -> str:
        """This run's directory for the embedded worker's socket and log (D63)."""
        if self.tmpdir is None:
            self.tmpdir, why = rundir.new_run_dir()
            if why:
                self.ledger.event(f"runtime directory refused: {why}")
        return self.tmpdir

    def _spawn(self) -> None:
        self.make_tmpdir()
        self.url = f"ipc://{self.tmpdir}/worker-{self.restarts}.sock"
        self.proc = embedded.spawn(self.url, self.tmpdir, self.config.device, self.config.policy)
        self._become(LinkState.STARTING)  # a cold worker: under policy remote calls wait for it, as at start
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
            if self._locate is not None and self._state is LinkState.DOWN:
                self._relocate()
            self._await_keys()
            # its own channel, closed at the end: a probe thread must not leave a socket behind
            chan = self._channel(self._probe_alive)
            rid = next(self._ids)
            t = time.monotonic()
            offer = self.lane.offer(self.url)  # shared memory, if the worker can map ours
            try:
                header = chan.request(messages.hello(rid, offer), t + self.config.ready_timeout).header
            finally:
                self.lane.withdraw()
            if header["t"] == "error":
                raise transport.BadReply(f"hello answered with an error: {header.get('kind')}: {header.get('msg')}")
            if header["t"] != "ready":
                raise transport.BadReply(f"hello answered with {header['t']!r}")
            info = {k: header.get(k) for k in ("pid", "device", "torch", "bench", "memory_budget", "max_bytes", "numba",
                                               "kernels", "boot")}
            if info.get("pid") != self.info.get("pid"):
                self.mirror.clear()  # a new worker process holds nothing yet
                if info.get("numba") == "simulator":  # said where the report shows it
                    self.ledger.event("numba kernels run under numba's CUDA SIMULATOR on the worker: tests only, slow")
            self.info = info
            self.cpus_shared = self.shares_cpus()
            self.contended = self.cpus_shared and embedded.parallel_blas()
            aside = self.config.policy == "auto" and self.cpus_shared and (self.pool is not None or self._tcp())
            why = cpuwins.shared_worker_why() if aside else None  # D301: D40's rule, for a pool's or tcp worker
            if why is not None:
                self._become(LinkState.SHARED_CPUS)  # never ready: no call goes there
                self.ledger.event(f"worker at {self.url} ({info.get('device')}) computes on this host's CPUs: "
                                  f"under auto it gets no call: {why}")
                ok = True
                return
            if offer is not None:
                self.lane.answered(header.get("shm"), info.get("pid"))
            if self.ready_after_s is not None:  # back after a fault: the link was measured before
                self.info["link"] = {"rtt_s": self.rtt_s, **self._bandwidth_info()}
                self.planner.worker_ready(self.index, self.info.get("bench"), self.rtt_s or 150e-6,
                                          *(self.bandwidth or (None, None)))
                self._ready(f"worker back at {self.url} (pid {self.info.get('pid')})")
                ok = True
                return
            # D23: the round trip measured before any call is sent; the bandwidth on first need
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
            self._probe_failed(exc)
        except Exception as exc:  # D182: a probe thread that dies would leave the link down for the run
            self._probe_failed(transport.TransportError(f"probe failed: {type(exc).__name__}: {exc}"))
        finally:
            if chan is not None:
                chan.close()
            with self._lock:
                if self._probe_gen == gen:  # a restart may have started a newer probe meanwhile
                    self._probing = False
        if not ok:
            self._reprobe_later()

    def _relocate(self) -> None:
        """A pool worker after a fault: where Ray has it now; a new endpoint is its restart."""
        found = self._locate(self.index)
        if found is None or (found.url == self.url and found.curve == self._curve):
            return
        before = (self.pool or {}).get("pid")
        self.url, self._curve = found.url, found.curve
        self.pool = {"name": found.name, **found.info}
        self.restarts += 1
        self.calls_since_restart = 0
        self.ledger.event(f"pool worker {found.name} restarted by Ray (pid {before} -> {found.info.get('pid')}, "
                          f"node {found.info.get('node')}): now at {self.url}, cold (inputs are sent again)")

    def answered_call(self, sent: int, received: int) -> None:
        """A call this worker answered, with its bytes each way."""
        self.calls += 1
        self.calls_since_restart += 1
        self.bytes_sent += sent
        self.bytes_received += received

    def _probe_failed(self, exc: Exception) -> None:
        if self.stopped:  # after uninstall: nothing to say, nothing to restart
            return
        if not self._failed_probes:  # one event per outage, not one per retry; said before a call sees it down
            self.ledger.event(f"worker not ready: {type(exc).__name__}: {exc}")
            if isinstance(exc, transport.Unauthenticated):
                _say_unauthenticated(self.url, exc)
            elif isinstance(exc, (transport.NoListener, transport.Refused)):
                _say_unreachable(self.url, exc)
        self._become(LinkState.DOWN)
        self._failed_probes += 1
        self._maybe_restart()

    def _bandwidth_info(self) -> dict:
        if self.bandwidth is None:
            return {}
        return {"up_bytes_per_s": self.bandwidth[0], "down_bytes_per_s": self.bandwidth[1]}

    def measure_bandwidth_soon(self, wait: bool = False) -> bool:
        """D23, D24: bulk transfers each way (about 7 MB in all, linkprobe), the first time a call could
        go to this worker; until it is done the planner prices the link with its prior. On a thread of
        its own, or with ``wait`` on the caller's: a probe that shares a busy CPU with the program
        measures the program, not the link, so a call long enough to pay for a few milliseconds has it
        made while the program waits anyway. The thread waits a little (QUIET_TRIES) for the program
        to be idle (its other threads' CPU time, as for calibration probes); still busy, over a link
        within HANDOFF_RTT_S (where the probe is a few milliseconds of copying) it leaves the probe to
        the next call that wants it, on the program's thread. Returns whether the probe was made
        here, now."""
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
        from ..plan import calibrate

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
            # its own socket, closed at the end
            chan = self._channel(self._probe_alive)
            up, down, why, moved = linkprobe.bandwidth(chan, self.next_id, self.rtt_s or 0.0,
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
        if not isinstance(kernels, list):
            return True
        listed = self._offered
        if listed[0] is not kernels:  # D43: a set of the list, made again when a ready replaces it
            try:
                listed = self._offered = (kernels, frozenset(kernels))
            except TypeError:  # a name that cannot be hashed: the list itself, as before
                return kernel_id in kernels
        return kernel_id in listed[1]

    def plan_state(self, missing: int | None, reused: int = 0) -> plan.WorkerState:
        """What the planner sees of this worker for one call; ``missing``: the input bytes it is priced
        for (None: all of them), ``reused``: bytes among them priced over their reuse (_Wired.to_send)."""
        state = self._state._value_  # D351: the member's own attribute (``value`` is a Python property)
        if state == "ready" and self.inflight > 0:
            state = "busy"
        return plan.WorkerState(state, self.inflight, self.backlog_s, missing, self.url or "", self.contended,
                                reused)

    def _ready(self, text: str) -> None:
        with self._lock:
            if not self._become(LinkState.READY):
                return
            self._failed_probes = 0
        self.ledger.event(text)

    def _reprobe_later(self) -> None:
        """A worker that is still there (external, or embedded and alive) is asked again, backing off;
        an embedded one that died is _maybe_restart's business."""
        with self._lock:
            if self.stopped or self._probing or self._state is LinkState.READY:
                return
            # D182: a forked child probes a worker it did not start; one it did is its parent's business
            if self.embedded and (os.getpid() != self.owner or not self.alive()):
                return
        delay = min(0.1 * 2 ** min(self._failed_probes - 1, 8), REPROBE_MAX_S)
        timer = threading.Timer(delay, self._probe)
        timer.daemon = True
        timer.start()

    def _ping(self, chan: transport.Channel) -> float:
        """One round trip, less the worker's health check (real device work)."""
        rid = next(self._ids)
        t = time.perf_counter()
        header = chan.request(messages.hello(rid), time.monotonic() + 5).header
        took = time.perf_counter() - t
        health = header.get("health_s")
        ok = isinstance(health, float) and 0 <= health <= took  # a NaN or an impossible figure: not trusted
        return max(took - health, took / 10) if ok else took

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
        self._become(LinkState.DOWN)
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
            why = self._exit_reason()
            exited = f"embedded worker exited (code {self.proc.returncode}{': ' + why if why else ''})"
            fix = embedded.fatal_fix(why, self.proc.returncode, self.ready_after_s is not None)
            if fix is not None:
                self.restarts = MAX_RESTARTS  # a restart would meet the same error
                self.ledger.event(f"{exited}; not restarted: {fix}; the run stays local")
                sys.stderr.write(f"fusion_shim: the embedded worker cannot start ({why}); computing here: {fix}\n")
                return
            if self.restarts >= MAX_RESTARTS:
                self.ledger.event(f"{exited}; {MAX_RESTARTS} restarts used, the rest of the run stays local")
                return
            self.restarts += 1
            self.ledger.event(f"{exited}; restart {self.restarts}")
            self._drop_channel()
            self._spawn()  # a new URL: every thread's channel() notices and reconnects
            self._probing = False
            self._probe()

    def _exit_reason(self) -> str | None:
        """The last line the embedded worker wrote to its log (its exception, when it died of one)."""
        try:
            with open(os.path.join(self.tmpdir or "", "worker.log"), "rb") as f:
                f.seek(max(os.fstat(f.fileno()).st_size - 4096, 0))
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return None
        return lines[-1].strip()[:200] if lines else None

    def not_ready_why(self) -> str | None:
        """Why this worker is not ready now, for the report (None: it is)."""
        if self._state is LinkState.READY:
            return None
        if self.embedded and self.proc is not None and os.getpid() == self.owner:
            code = self.proc.poll()
            return embedded.boot_phase(self.proc.pid, self.url or "", code, self._exit_reason() if code else None)
        return None if self._state is not LinkState.STARTING else f"no answer yet to the hello sent to {self.url}"

    def wait_ready(self, timeout: float, while_starting: bool = False) -> bool:
        """Wait for readiness up to ``timeout``; False at once when there is no hope (stopped, or an
        embedded worker dead with no restart left), or with ``while_starting`` once the worker is
        no longer a cold one starting up (its first probe failed: calls do not wait on retries)."""
        deadline = time.monotonic() + timeout
        while not self.ready.is_set():
            if self.stopped or (self.embedded and self.restarts >= MAX_RESTARTS and not self.alive()):
                return False
            if while_starting and self._state is not LinkState.STARTING:
                return False
            if not self.ready.wait(min(0.05, max(deadline - time.monotonic(), 0))) and time.monotonic() >= deadline:
                return False
        return True

    # -- channels -------------------------------------------------------------------------------
    def channel(self) -> transport.Channel:
        chan = getattr(self._local, "chan", None)
        if chan is None or chan.pid != os.getpid() or chan.url != self.url:
            # a forked child lands here too: it never touches its parent's socket
            chan = self._channel(self.watch, self.shm)
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
        self._become(LinkState.STOPPED)
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
                from ..worker.stages import remove_leftovers  # what its SIGTERM handler had no time for

                remove_leftovers(self.proc.pid)
        if self.tmpdir and os.getpid() == self.owner:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def queued(self, sign: int, predicted: float | None) -> None:
        """A call of this process sent here (+1) or answered (-1), with its predicted seconds; the caller serialises."""
        self.inflight += sign
        self.backlog_s = max(self.backlog_s + sign * (predicted or 0.0), 0.0) if self.inflight else 0.0

    def _after_fork(self) -> None:
        self._lock = threading.RLock()  # a parent thread may have held it at the fork
        self._probing = False  # the parent's probe thread does not exist here
        if self.url and self._state in (LinkState.STARTING, LinkState.DOWN):
            self._probe()  # D201: the child waits for its parent's worker itself, and offloads as it does

    def _close_shm(self) -> None:
        """Unlink this client's segment names; a worker that outlives it is told to unmap
        them (an embedded one is about to exit; the others would only notice this process gone)."""
        names = self.lane.close()
        if names and not self.embedded and os.getpid() == self.owner:
            try:
                rid = next(self._ids)
                self.channel().request(messages.stats_request(rid, names), time.monotonic() + 0.5)
            except transport.TransportError:
                pass  # it unmaps them when it sees this process gone


_links: "weakref.WeakSet[WorkerLink]" = weakref.WeakSet()


def _links_after_fork() -> None:
    for link in list(_links):
        link._after_fork()


os.register_at_fork(after_in_child=_links_after_fork)

"""The client side of one run: its ledger, its planner, its worker links, and :meth:`Runtime.dispatch`,
the one entry every intercepted call above its op's floor goes through.

The app never waits for a cold worker under ``auto``: the worker is started (or connected) in the
background and calls run locally until it answers ``ready``, at the cost of one size comparison each
(every floor is NEVER until then, plan.Planner.held). Under ``remote`` the first call waits
for readiness, up to ``ready_timeout``, and that wait is its own phase (``wait_ready``) in the report.
Under ``remote`` only a cold worker (starting, or restarted) is waited for; a worker that faulted is
probed again in the background (backing off) while calls run locally, so no call waits on it.

D40: on a host with no GPU (:func:`embedded.gpu_visible`), an embedded worker under ``auto`` would
run torch on the very CPUs the program already has. It starts only on evidence: the program's own
calls of the ops a CPU worker wins here, at the sizes it wins them (:mod:`fusion_shim.plan.cpuwins`,
the only floors below NEVER until then), must have taken long enough here that the worker would
have saved what its start costs. A program whose calls stay below those floors never starts it and
pays one size comparison a call; the report says why it did not start, or on what evidence it did.
``FUSION_SHIM_DEVICE=cpu`` starts it at once.

The runtime never imports the interceptor: the interceptor constructs it with ``publish_floors``,
the callback that carries the planner's floors to the C fast path and each wrapped function.

D113: made when NumPy is imported, the runtime holds only its ledger, its Config and the floor cells
the wrapped functions read (:mod:`fusion_shim.plan.cells`). The planner, the call path (checks,
residency, the wire) and the worker links (ZeroMQ, shared memory) are made on first need, whichever
thread needs them first: the first call above a floor, the workers' start (at install, unless the
embedded worker is deferred; then when it starts), a program that asks for them. Each one's time is
a line of the report's start-up (:meth:`note_startup`); the report itself reads only what was made
(:meth:`made_links`, :meth:`made_planner`).
"""
from __future__ import annotations

import _thread  # D36: threading loads with the first thread the runtime starts
import inspect
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ..catalog import OpSpec
from ..config import Config
from ..ledger import Ledger, Record, call_site
from ..plan.cells import NEVER, floor_cells, starting_floor
from . import GUARD, embedded

if TYPE_CHECKING:  # made on first need (D113): their modules load ZeroMQ, msgpack, xxhash, the planner
    import queue

    from ..plan import Planner
    from ..plan.cpuwins import CpuEvidence
    from ..plan.poolopen import PoolEvidence
    from .call import CallPath
    from .checks import Checks
    from .link import WorkerLink
    from .residency import HashRate, Reuse

    # (smallest floor, {op: its floor}, the operators' floors or None): where the floors are
    # published; for the checker only (D123: typing compiles its string parts at import)
    FloorPublisher = Callable[[int, dict[str, int], "tuple[int, int, int] | None"], None]


class Runtime:
    """Everything one process's shim holds; created by :func:`fusion_shim.install` once NumPy is
    imported. ``export_env``: children of this process reuse its worker (the launcher's)."""

    def __init__(self, config: Config, publish_floors: FloorPublisher | None = None, export_env: bool = False):
        self._config = config
        urls: list[str | None] = [] if config.pool else list(config.workers) or [config.worker]
        # an embedded CPU worker is deferred (D40); under auto every floor stays NEVER until a
        # worker is ready (Planner.held), but those of the ops whose calls are evidence for its start
        deferred = (config.policy == "auto" and urls == [None] and config.device == "auto"
                    and not embedded.gpu_visible())
        # D281: until then calls are counted as made with no worker ready (deferred: by its evidence floors)
        self.ledger = Ledger(trace_io=config.report is not None,
                             unready=config.policy == "auto" and not (deferred or bool(config.pool)))
        self.guard = GUARD  # .busy: the shim's own NumPy calls must not re-enter it
        self.local_only = config.policy == "local"
        self.export_env = export_env
        self._publish = publish_floors
        # None: an embedded worker; a pool's URLs are known once it is opened (_open_pool)
        self._urls = urls
        self.pool: Any = None  # pool.locate.Pool, once opened
        self._endpoints: list = []  # its workers (pool.locate.Endpoint), in the links' order
        self._pool_background = False  # D300: under auto the pool is opened on a thread of its own,
        self._pool_ident: int | None = None  # ... this one
        self._pid = os.getpid()
        # the cells every wrapped function reads, from install on; the planner, once made, keeps them
        self._floor_cells = floor_cells(config.policy)
        self._made = _thread.RLock()  # each lazy part is made once, by whichever thread needs it first
        self._planner: "Planner | None" = None
        self._links: list[WorkerLink] = []  # filled when made; the call path holds this same list
        self._links_made = False
        self._calls: "CallPath | None" = None
        self._started = False
        # D302: under auto a pool is opened on evidence too: the program's calls must pay Ray's cost
        self.pool_deferred = bool(config.pool) and config.policy == "auto"
        self.deferred = deferred or self.pool_deferred
        self._evidence: "CpuEvidence | PoolEvidence | None" = None
        self._evidence_floor = NEVER
        self._cpu_started_s: float | None = None  # when the evidence started the deferred worker
        if self.deferred:
            self._gather_evidence()
        self._deferred_dir: str | None = None  # where the deferred worker will listen (children were told)
        self._deferred_made = False  # whether that directory exists yet (D122)
        # whether `@`, `@=` and `.dot` are intercepted, and why not (note_operators)
        self.operators: dict[str, Any] = {"intercepted": False, "why": "not installed", "fast_path": "wrapt"}
        self.started_wall = time.time()
        self._bg_lock = _thread.allocate_lock()
        self._bg_queue: "queue.SimpleQueue | None" = None
        self._bg_pid = 0

    @property
    def config(self) -> Config:
        """The run's settings, fixed at install (the call path and the checks hold the same)."""
        return self._config

    # -- made on first need (D113) ----------------------------------------------------------------
    @property
    def planner(self) -> "Planner":
        """The decision engine: made on first need, with the floor cells held since install."""
        if self._planner is None:
            with self._made:
                if self._planner is None:
                    if self.config.pool:
                        self._open_pool()
                    t = time.perf_counter()
                    self._planner = self._make_planner(self.config)
                    self.note_startup("planner", time.perf_counter() - t)
        elif self._calls is not None and self._calls.unlearnt:  # D47: what it reads is learnt first
            self._calls.learn()
        return self._planner

    def _open_pool(self) -> None:
        """D154: the pool's workers, found through Ray before the planner is made (it is sized by
        them); a pool that cannot be used leaves the run local, with the reason in one line."""
        from ..pool.locate import Pool

        t = time.perf_counter()
        # D300: under auto nobody waits for Ray's helpers: they run at idle priority, as a deferred worker's start
        idle = embedded.lower_priority if self.pool_deferred else None
        self.pool = Pool(self.config.pool, self.ledger.event, self.config.insecure, idle)
        endpoints, why = self.pool.open()
        self.note_startup("pool", time.perf_counter() - t)
        if why is not None:
            self.ledger.event(f"pool {self.config.pool} not used, every call runs here: {why}")
            self.local_only = True
            return
        self._endpoints = endpoints
        self._urls = [e.url for e in endpoints]
        self.ledger.event(f"pool {self.config.pool}: {len(endpoints)} workers found through Ray: " + ", ".join(
            f"{e.name} on {e.info.get('node')} ({_pool_device(e.info)})" for e in endpoints))

    def _make_planner(self, config: Config) -> "Planner":
        from ..catalog import CATALOG, OPERATORS
        from ..plan import calibrate
        from ..plan.planner import Planner

        cache = None
        if not self.local_only:
            key = calibrate.build_key()
            cache = calibrate.Cache(calibrate.cache_path(key), key)
        return Planner(config.policy, len(self._urls), min_flops=config.min_flops, cache=cache,
                       background=self._background, on_event=self.ledger.event,
                       ops={s.name: s.family for s in (*CATALOG, *OPERATORS)},
                       inputs_may_be_resident=config.residency, worker_busy=self._worker_busy,
                       on_floors=self._publish_floors, floor_cells=self._floor_cells)

    @property
    def links(self) -> "list[WorkerLink]":
        """The worker links (none under policy local), made on first need."""
        if not self._links_made:
            self._make_links()
        return self._links

    @property
    def link(self) -> "WorkerLink | None":
        """The first link (with one worker, the only one)."""
        links = self.links
        return links[0] if links else None

    def made_links(self) -> "list[WorkerLink]":
        """The links made so far, making none: what the report and the exit read."""
        return self._links

    def made_planner(self) -> "Planner | None":
        """The planner if it was made, making none (what the calls left it is learnt first, D47)."""
        if self._calls is not None and self._calls.unlearnt:
            self._calls.learn()
        return self._planner

    def _make_links(self) -> None:
        with self._made:
            if self._links_made or self.local_only:
                return
            planner = self.planner
            if self.local_only:  # the pool was not usable, or the run ended while it was opened
                return
            t = time.perf_counter()
            from .link import WorkerLink

            endpoints = self._endpoints or [None] * len(self._urls)
            locate = self.pool.locate if self.pool is not None else None
            self._links.extend(WorkerLink(self.config, self.ledger, planner, url, i, endpoint, locate)
                               for i, (url, endpoint) in enumerate(zip(self._urls, endpoints)))
            self._links_made = True
            if self.deferred and not self.pool_deferred:
                url = tmpdir = None
                if self._deferred_dir is not None:
                    # the URL children were told at install, which its first spawn binds; the
                    # directory is this process's own (a forked child's link must not remove it)
                    url = f"ipc://{self._deferred_dir}/worker-0.sock"
                    if os.getpid() == self._pid:
                        tmpdir, self._deferred_dir = self._made_deferred_dir(), None
                self._links[0].defer(url, tmpdir)
            self.note_startup("worker links", time.perf_counter() - t)

    def _made_deferred_dir(self) -> str | None:
        """The deferred worker's directory, made now if only named (D122); None where that fails:
        its link makes a fresh one, and children told the named one then find no worker there."""
        if self._deferred_made:
            return self._deferred_dir
        from .rundir import make_named

        try:
            path = make_named(self._deferred_dir)
        except OSError as exc:
            self.ledger.event(f"runtime directory refused: {exc}")
            return None
        self._deferred_made = True
        return path

    def _parts(self) -> "CallPath":
        """The call path and the checks (and residency, the wire), made together on first need."""
        if self._calls is None:
            with self._made:
                if self._calls is None:
                    planner = self.planner
                    t = time.perf_counter()
                    from ..catalog import load_rules
                    from .call import CallPath
                    from .checks import Checks
                    from .residency import HashRate, Reuse

                    load_rules()
                    hash_rate, reuse = HashRate(), Reuse()
                    checks = Checks(self.config, self.ledger, planner, self.guard)
                    self._calls = CallPath(self.config, self.ledger, planner, self._links, checks, hash_rate, reuse)
                    self.note_startup("call path", time.perf_counter() - t)
        return self._calls

    @property
    def calls(self) -> "CallPath":
        return self._parts()

    @property
    def checks(self) -> "Checks":
        return self._parts().checks

    @property
    def hash_rate(self) -> "HashRate":
        return self._parts().hash_rate

    @property
    def reuse(self) -> "Reuse":
        return self._parts().reuse

    def _worker_busy(self) -> bool:
        """Whether a worker computing on this machine's CPUs has a call of ours in flight."""
        return any(link.inflight and link.cpus_shared for link in self._links)

    # -- start and end --------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or connect to) the workers in the background; called once NumPy is imported."""
        if self.local_only or self._started:
            return
        self._started = True
        if self.pool_deferred:
            self.ledger.event(f"pool {self.config.pool}: opened (Ray asked) only once this program's calls have "
                              f"taken long enough here to pay what that costs (D302)")
            return
        if self.deferred:
            self._defer()
            return
        self._start_links()
        if self.export_env and not self.config.pool and self.link is not None and self.link.embedded:
            os.environ["FUSION_SHIM_WORKER"] = self.link.url

    def _open_in_background(self) -> None:
        """D300: the pool opened, its planner and links made and started, off the program's thread:
        none of it is the program's start-up; the report's pool section says what Ray cost."""
        self._pool_ident = _thread.get_ident()
        t = time.perf_counter()
        self._start_links()
        self.ledger.event(f"pool opened off the program's thread in {time.perf_counter() - t:.2f} s")

    def _start_links(self) -> None:
        if self.local_only:
            return
        links = self.links
        if self.pool_deferred and not self.local_only:  # D302: the planner's floors from now on (NEVER until ready)
            floors = self._evidence.floors() if self._evidence is not None else {}
            for op in floors:
                self._floor_cells[op][0] = NEVER
            self.deferred = False
            self._publish_floors(NEVER, list(floors))
        for link in links:  # the floors stay NEVER until one is ready (Planner.held)
            link.start()
        if self.config.policy == "auto" and self.links:  # calibration and floors run there: off the program's calls
            self._background_thread()

    def _gather_evidence(self) -> None:
        """D40: the floors of the ops a CPU worker wins here drop to the sizes it wins them at: their
        calls take the slow path, are computed here and timed; every other floor stays NEVER."""
        if self.pool_deferred:
            from ..catalog import CATALOG, OPERATORS
            from ..plan.poolopen import PoolEvidence

            self._evidence = PoolEvidence(s.name for s in (*CATALOG, *OPERATORS))
        else:
            from ..plan.cpuwins import CpuEvidence

            self._evidence = CpuEvidence()
        floors = self._evidence.floors()
        for op, floor in floors.items():
            self._floor_cells[op][0] = floor
        self._evidence_floor = min(floors.values(), default=NEVER)

    def _defer(self) -> None:
        """D40: the embedded CPU worker starts once the program's calls show it would pay; its link
        is made then (or when something asks for it), in state ``deferred`` until it starts."""
        self.ledger.event("no GPU on this host: the embedded worker would run on this program's own CPUs, "
                          "so it starts only once this program's calls show work a CPU worker wins here, "
                          "enough to pay its start (FUSION_SHIM_DEVICE=cpu starts it now; "
                          "FUSION_SHIM_WORKER connects to another host's)")
        if self.export_env:  # children connect to the worker this process will start, never their own
            from .rundir import new_run_dir, run_dir_name

            # D122: the link's own directory (make_tmpdir), named now for the children, made when it starts
            path = run_dir_name()
            if path is None:
                path, why = new_run_dir()
                self._deferred_made = True
                if why:
                    self.ledger.event(f"runtime directory refused: {why}")
            self._deferred_dir = path
            os.environ["FUSION_SHIM_WORKER"] = f"ipc://{path}/worker-0.sock"

    def _evidence_call(self, spec: OpSpec, args: tuple, kwargs: dict, original: Callable) -> Any:
        """D40: a call above an evidence floor while the worker is deferred: computed here, timed and
        recorded, evidence for the worker's start, which then happens off the program's thread (the
        planner, the call path and the link are made there, not for this call)."""
        rec = Record(spec.name, spec.family, site=call_site(4), thread=_thread.get_ident(),
                     reason="pool not opened yet: timed as evidence for its opening" if self.pool_deferred else
                     "embedded worker deferred (no GPU on this host): timed as evidence for its start")
        t = time.perf_counter()
        rec.start_s = t - self.ledger.started
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            rec.raised = type(exc).__name__
            self.ledger.add(rec)
            raise
        seconds = time.perf_counter() - t
        rec.phases["local"] = rec.wall_s = seconds
        self.ledger.add(rec)
        nbytes = sum(getattr(a, "nbytes", 0) for a in args)
        evidence = self._evidence
        if evidence is not None and evidence.observe(spec.name, nbytes, seconds):
            import threading

            threading.Thread(target=self._start_deferred, name="fusion-shim-start", daemon=True).start()
        return result

    def deferred_why(self) -> str | None:
        """Why the embedded CPU worker has not started, or on what evidence it did (None: never deferred)."""
        evidence = self._evidence
        if evidence is None or self.pool_deferred:
            return None
        started = self._cpu_started_s
        return ("not started: " if started is None else f"started at {started:.2f}s: ") + evidence.describe()

    def pool_opening(self) -> str | None:
        """D302: why the pool was not opened, or on what evidence it was (None: no pool, or not under auto)."""
        evidence = self._evidence
        if not self.pool_deferred or evidence is None:
            return None
        return ("opened: " if evidence.enough else "not opened (Ray never asked): ") + evidence.describe()

    def _start_deferred(self) -> None:
        """The deferred embedded CPU worker: the program's calls have shown it would pay for its start."""
        if self.local_only:
            return
        if self.pool_deferred:
            import threading

            self.ledger.event(f"opening pool {self.config.pool} at {self.ledger.now():.2f}s: "
                              + (self._evidence.describe() if self._evidence is not None else "asked to"))
            # D300: Ray is asked off the program's thread; calls run here until a worker is ready
            self._pool_background = True
            threading.Thread(target=self._open_in_background, name="fusion-shim-pool", daemon=True).start()
            return
        link = self.link  # made here, off the program's thread, unless something needed it before
        if self.local_only or link is None or link.stopped or link.state != "deferred" or os.getpid() != link.owner:
            return  # shut down meanwhile, or a forked child's copy
        self.deferred = False
        self._cpu_started_s = self.ledger.now()
        self.ledger.event(f"starting the embedded worker on this host's CPUs at {self._cpu_started_s:.2f}s: "
                          + (self._evidence.describe() if self._evidence is not None else "asked to"))
        link.start()
        if self.config.policy == "auto":
            self._background_thread()

    def shutdown(self) -> None:
        """Stop the workers this process started and the background thread; wrappers someone kept a
        reference to pass straight through from now on."""
        self.local_only = True
        if self.pool is not None:
            self.pool.close()  # D300: a helper still asking Ray is ended, not waited for
        # no link is being made meanwhile; none is made after (one made while a pool opens sees local_only)
        if self._made.acquire(timeout=0 if self._pool_background else -1):
            try:
                self._links_made = True
            finally:
                self._made.release()
        for link in self._links:
            link.stop()
        if self._deferred_dir is not None and os.getpid() == self._pid:  # told to children, never used
            if self._deferred_made:
                _remove_dir(self._deferred_dir)
            self._deferred_dir = None
        with self._bg_lock:
            if self._bg_queue is not None and self._bg_pid == os.getpid():
                self._bg_queue.put((None, ""))  # the background thread ends after its current job
                self._bg_queue = None

    def after_fork_in_child(self) -> None:
        self.ledger.reset_after_fork()
        # D201: the link's fork hook re-probes a worker still starting, so the child waits as the parent does
        self.ledger.event(f"forked from pid {os.getppid()}: calls go where the parent's go, to the same worker "
                          "over this process's own connection")

    # -- what the interceptor tells the runtime about itself --------------------------------------
    def note_operators(self, intercepted: bool, why: str, fast_path: str) -> None:
        """Whether `@`, `@=` and `.dot` are intercepted, and which fast path the functions have."""
        self.operators = {"intercepted": intercepted, "why": why, "fast_path": fast_path}
        self.ledger.event("operators @, @=, .dot intercepted" if intercepted
                          else f"operators @, @=, .dot not intercepted: {why}")

    def note_startup(self, phase: str, seconds: float) -> None:
        """Time the shim spent starting, on ``phase``: at install, or on a part's first need."""
        if _thread.get_ident() == self._pool_ident:  # D300: the pool's thread, not the program's time
            return
        self.ledger.add_startup(phase, seconds)

    def add_counters(self, read: Callable[[], dict[str, int]], reset: Callable[[], None]) -> None:
        """Fast-path counts kept outside Python (the C paths): read and reset with the ledger's."""
        self.ledger.counters.append((read, reset))

    # -- what the interceptor and the planner read ----------------------------------------------
    @property
    def floor_bytes(self) -> int:
        """The smallest floor of any op (the C fast path compares with it); each op's own is
        ``floor_cell(name)[0]``."""
        if self.deferred:  # D40: the evidence's floors, until the worker is ready (the planner's then)
            return self._evidence_floor
        planner = self._planner
        return starting_floor(self.config.policy) if planner is None else planner.floor_bytes

    def floor_cell(self, name: str) -> list[int]:
        """The op's floor as a one-element list the interceptor reads without a lock or a lookup."""
        return self._floor_cells[name]

    def operator_floors(self) -> tuple[int, int, int]:
        """The own floors of ``@``, ``@=`` and ``.dot`` (catalog.OPERATORS' order)."""
        from ..catalog import OPERATORS

        return tuple(self.floor_cell(spec.name)[0] for spec in OPERATORS)

    def _publish_floors(self, floor_bytes: int, ops: Any = ()) -> None:
        """The planner refreshed floors: the C fast path holds the smallest, each wrapped function
        and each operator its own."""
        planner = self._planner
        if planner is not None and not planner.held:  # D281: from now on the fast path counts calls below a floor
            self.ledger.worker_ready()
        if self.local_only or self._publish is None:
            return
        cells = self._floor_cells
        floors = {name: cells[name][0] for name in ops if name in cells}
        operators = self.operator_floors() if any(name.startswith("numpy.ndarray.") for name in ops) else None
        self._publish(floor_bytes, floors, operators)

    def worker_drift(self, index: int) -> tuple[float, int]:
        """(log of worker ``index``'s measured speed over its self-benchmark, calls behind it)."""
        device = self.planner.profile.workers[index].device
        return device.drift, device.drift_n

    # -- the background thread --------------------------------------------------------------------
    def _background(self, fn: Any, name: str) -> None:
        """Run ``fn`` on the shim's background thread, whose NumPy calls are not intercepted
        (calibration probes, every floor at once)."""
        self._background_thread().put((fn, name))

    def _background_thread(self) -> "queue.SimpleQueue":
        """D26: the background thread's queue. One thread for the run, started with the workers
        (under policy auto; else on first use): starting a thread waits for it to run."""
        with self._bg_lock:
            if self._bg_queue is None or self._bg_pid != os.getpid():  # a forked child starts its own
                import queue  # with the thread: a deferred or local run never starts one
                import threading

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

    # -- one intercepted call -----------------------------------------------------------------------
    def dispatch(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict,
                 original: Callable, check: Callable | None) -> Any:
        """One call above its op's floor: decided, run on a worker or here, recorded. ``original``
        computes it here, in this frame, so that NumPy's own errors reach the program unchanged;
        ``check`` recomputes a sampled answer (None: it cannot be, ``a @= b``)."""
        guard = self.guard
        if self.local_only or getattr(guard, "busy", False):  # the shim's own call: nothing recorded
            return original(*args, **kwargs)
        if self.deferred:
            return self._evidence_call(spec, args, kwargs, original)
        guard.busy = True
        try:
            calls = self._calls if self._calls is not None else self._call_path(spec)
            got = calls.run(spec, sig, args, kwargs)
        finally:
            guard.busy = False
        if got.__class__ is not Record:
            result = self.checks.finish(got, check, sig, args, kwargs)
            if self.ledger.tracing:
                self.ledger.trace_io(got.rec, args, kwargs, result)
            return result
        t = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            self.calls.local_done(got, time.perf_counter() - t, exc)
            raise
        self.calls.local_done(got, time.perf_counter() - t, None)
        if self.ledger.tracing:
            self.ledger.trace_io(got, args, kwargs, result)
        return result

    def _call_path(self, spec: OpSpec) -> "CallPath":
        """The call path, made by the first call; a Ctrl-C while it is made (its modules load then)
        leaves that call's record, so the report at exit still shows the run."""
        try:
            return self.calls
        except KeyboardInterrupt:
            from ..errors import FallbackKind  # here: the enum's making is not paid at NumPy's import

            self.ledger.add(Record(spec.name, spec.family, site=call_site(4), kind="fallback",
                                   reason="interrupted before it ran", raised="KeyboardInterrupt",
                                   thread=_thread.get_ident(), fallback=FallbackKind.INTERRUPTED))
            raise


def _pool_device(info: dict) -> str:
    """A pool worker's device; a GPU Ray accounts for while torch sees none is labelled emulated."""
    device = str(info.get("device"))
    return f"{device}, Ray GPU EMULATED" if info.get("gpu_emulated") else device


def _remove_dir(path: str) -> None:
    """An unused run directory, empty as made: rmdir, without loading shutil at exit; else rmtree."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)

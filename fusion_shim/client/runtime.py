"""The client side of one run: its ledger, its planner, its worker links, and :meth:`Runtime.dispatch`,
the one entry every intercepted call above its op's floor goes through.

The app never waits for a cold worker under ``auto``: the worker is started (or connected) in the
background and calls run locally until it answers ``ready``, at the cost of one size comparison each
(every floor is NEVER until then, plan.Planner.held). Under ``remote`` the first call waits
for readiness, up to ``ready_timeout``, and that wait is its own phase (``wait_ready``) in the report.
Under ``remote`` only a cold worker (starting, or restarted) is waited for; a worker that faulted is
probed again in the background (backing off) while calls run locally, so no call waits on it.

When the workers start (now; on evidence, on a host with no GPU, D40; a pool's through Ray, D154, D302)
is :class:`.starts.WorkerStarts`' decision alone (D338): the runtime makes it at install and hands it the
calls made while the start waits on evidence.

The runtime never imports the interceptor: the interceptor constructs it with ``publish_floors``,
the callback that carries the planner's floors to the C fast path and each wrapped function, and
``stage_runner``, the factory of the run's one stage runner (the stages sit above the client; D347).

D113: made when NumPy is imported, the runtime holds only its ledger, its Config and the floor cells
the wrapped functions read (:mod:`fusion_shim.plan.cells`). The planner, the call path (checks,
residency, the wire) and the worker links (ZeroMQ, shared memory) are made on first need, whichever
thread needs them first: the first call above a floor, the workers' start (at install, unless the
start waits on evidence; then when it starts), a program that asks for them. Each one's time is
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
from ..plan.cells import floor_cells, starting_floor
from . import GUARD
from .starts import WorkerStarts, waits_on_evidence

if TYPE_CHECKING:  # made on first need (D113): their modules load ZeroMQ, msgpack, xxhash, the planner
    import queue

    from ..plan import Planner
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

    def __init__(self, config: Config, publish_floors: FloorPublisher | None = None, export_env: bool = False,
                 stage_runner: "Callable[..., Any] | None" = None):
        self._config = config
        waits = waits_on_evidence(config)
        # D281: under auto, until a worker is ready calls are counted as made with none ready (while the
        # start waits on evidence: by its evidence floors)
        self.ledger = Ledger(trace_io=config.report is not None, unready=config.policy == "auto" and not waits)
        self.guard = GUARD  # .busy: the shim's own NumPy calls must not re-enter it
        self.local_only = config.policy == "local"
        self._publish = publish_floors
        # the cells every wrapped function reads, from install on; the planner, once made, keeps them
        self._floor_cells = floor_cells(config.policy)
        self._made = _thread.RLock()  # each lazy part is made once, by whichever thread needs it first
        self._planner: "Planner | None" = None
        self._links: list[WorkerLink] = []  # filled when made; the call path holds this same list
        self._links_made = False
        self._calls: "CallPath | None" = None
        # (config, ledger, guard, planner, first link) -> the stages' Runner; none given: stages run plain
        self._new_stage_runner = stage_runner
        self._stage_runner: Any = None
        # when and how the workers start, with what that waits for; under auto every floor stays NEVER
        # until a worker is ready (Planner.held), but those of the calls that are evidence for a start
        self.starts = WorkerStarts(config, waits, self.ledger, self._floor_cells, lambda: self.links,
                                   self._background_thread, self._publish_floors, export_env)
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
                    if not self.starts.open_pool():
                        self.local_only = True
                    t = time.perf_counter()
                    self._planner = self._make_planner(self.config)
                    self.note_startup("planner", time.perf_counter() - t)
        elif self._calls is not None and self._calls.unlearnt:  # D47: what it reads is learnt first
            self._calls.learn()
        return self._planner

    def _make_planner(self, config: Config) -> "Planner":
        from ..catalog import CATALOG, OPERATORS
        from ..plan import calibrate
        from ..plan.planner import Planner

        cache = None
        if not self.local_only:
            key = calibrate.build_key()
            cache = calibrate.Cache(calibrate.cache_path(key), key)
        return Planner(config.policy, len(self.starts.urls), min_flops=config.min_flops, cache=cache,
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

            starts = self.starts
            self._links.extend(WorkerLink(self.config, self.ledger, planner, url, i, endpoint, starts.locate)
                               for i, (url, endpoint) in enumerate(starts.targets()))
            self._links_made = True
            starts.links_made(self._links)
            self.note_startup("worker links", time.perf_counter() - t)

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

    def stage_runner(self) -> Any:
        """The run's one stage runner (``fusion_shim.stages.runner.Runner``), made by a stage's first
        call; None where this runtime was given no factory (its stages run as plain calls)."""
        if self._stage_runner is None and self._new_stage_runner is not None:
            with self._made:
                if self._stage_runner is None:
                    self._stage_runner = self._new_stage_runner(self.config, self.ledger, self.guard,
                                                                lambda: self.planner, lambda: self.link)
        return self._stage_runner

    def _worker_busy(self) -> bool:
        """Whether a worker computing on this machine's CPUs has a call of ours in flight."""
        return any(link.inflight and link.cpus_shared for link in self._links)

    # -- start and end --------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or connect to) the workers in the background; called once NumPy is imported."""
        if not self.local_only:
            self.starts.start()

    def shutdown(self) -> None:
        """Stop the workers this process started and the background thread; wrappers someone kept a
        reference to pass straight through from now on."""
        self.local_only = True
        self.starts.stop()
        # no link is being made meanwhile; none is made after (one made while a pool opens sees local_only)
        if self._made.acquire(timeout=0 if self.starts.background_open else -1):
            try:
                self._links_made = True
            finally:
                self._made.release()
        for link in self._links:
            link.stop()
        self.starts.remove_unused_dir()
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
        if self.starts.on_pool_thread():  # D300: the pool's thread, not the program's time
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
        starts = self.starts
        if starts.deferred:  # D40: the evidence's floors, until the worker is ready (the planner's then)
            return starts.evidence_floor
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
        starts = self.starts
        if starts.deferred:  # D40, D302: computed here and timed, evidence for the start
            return starts.evidence_call(spec, args, kwargs, original)
        guard.busy = True
        try:
            calls = self._calls if self._calls is not None else self._call_path(spec)
            got = calls.run(spec, sig, args, kwargs)
        finally:
            guard.busy = False
        if got.__class__ is not Record:
            result = calls.checks.finish(got, check, sig, args, kwargs)  # D351: the call path's, no property
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


"""The client side of one run: its ledger, its planner, its worker links, and :meth:`Runtime.dispatch`,
the one entry every intercepted call above its op's floor goes through.

The app never waits for a cold worker under ``auto``: the worker is started (or connected) in the
background and calls run locally until it answers ``ready``, at the cost of one size comparison each
(every floor is NEVER until then, plan.Planner.held). Under ``remote`` the first call waits
for readiness, up to ``ready_timeout``, and that wait is its own phase (``wait_ready``) in the report.
Under ``remote`` only a cold worker (starting, or restarted) is waited for; a worker that faulted is
probed again in the background (backing off) while calls run locally, so no call waits on it.

D22: on a host with no GPU (:func:`embedded.gpu_visible`), an embedded worker under ``auto`` would
run torch on the very CPUs the program already has. It is started only once the program has run
``CPU_WORKER_AFTER_S``; until then every floor is NEVER (nothing can leave the process) and the
report says why. ``FUSION_SHIM_DEVICE=cpu`` starts it at once.

The runtime never imports the interceptor: the interceptor constructs it with ``publish_floors``,
the callback that carries the planner's floors to the C fast path and each wrapped function.
"""
from __future__ import annotations

import inspect
import os
import queue
import threading
import time
from typing import Any, Callable

from .. import plan
from ..catalog import OpSpec
from ..config import Config
from ..ledger import Ledger, Record
from . import GUARD, embedded
from .call import CallPath
from .checks import Checks
from .link import WorkerLink
from .residency import HashRate, Reuse

CPU_WORKER_AFTER_S = 10.0  # D22: no GPU here: the embedded (CPU) worker starts once the program has run this long

# (smallest floor, {op: its floor}, the operators' floors or None): where the floors are published
FloorPublisher = Callable[[int, "dict[str, int]", "tuple[int, int, int] | None"], None]


class Runtime:
    """Everything one process's shim holds; created by :func:`fusion_shim.install` once NumPy is
    imported. ``export_env``: children of this process reuse its worker (the launcher's)."""

    def __init__(self, config: Config, publish_floors: FloorPublisher | None = None, export_env: bool = False):
        self._config = config
        self.ledger = Ledger()
        self.guard = GUARD  # .busy: the shim's own NumPy calls must not re-enter it
        self.local_only = config.policy == "local"
        self.export_env = export_env
        self._publish = publish_floors
        self._urls: list[str | None] = list(config.workers) or [config.worker]  # None: an embedded worker
        self.links: list[WorkerLink] = []  # filled by start(); the call path holds this same list
        self.link: WorkerLink | None = None  # the first (with one worker, the only one)
        self.planner = self._planner(config)
        # an embedded CPU worker is deferred (D22); under auto every floor stays NEVER until a
        # worker is ready (Planner.held), so until it has started and warmed
        self.deferred = (config.policy == "auto" and self._urls == [None] and config.device == "auto"
                         and not embedded.gpu_visible())
        # whether `@`, `@=` and `.dot` are intercepted, and why not (note_operators)
        self.operators: dict[str, Any] = {"intercepted": False, "why": "not installed", "fast_path": "wrapt"}
        self.started_wall = time.time()
        self.hash_rate = HashRate()
        self.reuse = Reuse()
        self.checks = Checks(config, self.ledger, self.planner, self.guard)
        self.calls = CallPath(config, self.ledger, self.planner, self.links, self.checks, self.hash_rate,
                              self.reuse)
        self._bg_lock = threading.Lock()
        self._bg_queue: "queue.SimpleQueue | None" = None
        self._bg_pid = 0

    @property
    def config(self) -> Config:
        """The run's settings, fixed at install (the call path and the checks hold the same)."""
        return self._config

    def _planner(self, config: Config) -> plan.Planner:
        cache = None
        if not self.local_only:
            from ..plan import calibrate
            key = calibrate.build_key()
            cache = calibrate.Cache(calibrate.cache_path(key), key)
        from ..catalog import CATALOG, OPERATORS
        return plan.Planner(config.policy, len(self._urls), min_flops=config.min_flops, cache=cache,
                            background=self._background, on_event=self.ledger.event,
                            ops={s.name: s.family for s in (*CATALOG, *OPERATORS)},
                            inputs_may_be_resident=config.residency, worker_busy=self._worker_busy,
                            on_floors=self._publish_floors)

    def _worker_busy(self) -> bool:
        """Whether a worker computing on this machine's CPUs has a call of ours in flight."""
        return any(link.inflight and link.cpus_shared for link in self.links)

    # -- start and end --------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or connect to) the workers in the background; called once NumPy is imported."""
        if self.local_only or self.link is not None:
            return
        self.links.extend(WorkerLink(self.config, self.ledger, self.planner, url, i)
                          for i, url in enumerate(self._urls))
        self.link = self.links[0]
        if self.deferred:
            self._defer()
            return
        for link in self.links:  # the floors stay NEVER until one is ready (Planner.held)
            link.start()
        if self.config.policy == "auto":  # calibration and floors run there: started off the program's calls
            self._background_thread()
        if self.export_env and self.link.embedded:
            os.environ["FUSION_SHIM_WORKER"] = self.link.url

    def _defer(self) -> None:
        self.link.state = "deferred"
        self.ledger.event(f"no GPU on this host: the embedded worker would run on this program's own CPUs, "
                          f"so it starts only after {CPU_WORKER_AFTER_S:g} s of run (FUSION_SHIM_DEVICE=cpu "
                          "starts it now; FUSION_SHIM_WORKER connects to another host's)")
        timer = threading.Timer(CPU_WORKER_AFTER_S, self._start_deferred)
        timer.daemon = True
        timer.start()
        if self.export_env:  # children connect to the worker this process will start, never their own
            os.environ["FUSION_SHIM_WORKER"] = self.link.url = f"ipc://{self.link.make_tmpdir()}/worker-0.sock"

    def _start_deferred(self) -> None:
        """The deferred embedded CPU worker: the program has run long enough to pay for its start."""
        link = self.link
        if self.local_only or link is None or link.stopped or link.state != "deferred" or os.getpid() != link.owner:
            return  # shut down meanwhile, or a forked child's copy
        self.deferred = False
        self.ledger.event(f"the program has run {CPU_WORKER_AFTER_S:g} s: starting the embedded worker on this host's CPUs")
        link.start()
        if self.config.policy == "auto":
            self._background_thread()

    def shutdown(self) -> None:
        """Stop the workers this process started and the background thread; wrappers someone kept a
        reference to pass straight through from now on."""
        self.local_only = True
        for link in self.links:
            link.stop()
        with self._bg_lock:
            if self._bg_queue is not None and self._bg_pid == os.getpid():
                self._bg_queue.put((None, ""))  # the background thread ends after its current job
                self._bg_queue = None

    def after_fork_in_child(self) -> None:
        self.ledger.reset_after_fork()
        self.ledger.event(f"forked from pid {self.link.owner if self.link else '?'}; own connection to the worker")

    # -- what the interceptor tells the runtime about itself --------------------------------------
    def note_operators(self, intercepted: bool, why: str, fast_path: str) -> None:
        """Whether `@`, `@=` and `.dot` are intercepted, and which fast path the functions have."""
        self.operators = {"intercepted": intercepted, "why": why, "fast_path": fast_path}
        self.ledger.event("operators @, @=, .dot intercepted" if intercepted
                          else f"operators @, @=, .dot not intercepted: {why}")

    def add_counters(self, read: Callable[[], dict[str, int]], reset: Callable[[], None]) -> None:
        """Fast-path counts kept outside Python (the C paths): read and reset with the ledger's."""
        self.ledger.counters.append((read, reset))

    # -- what the interceptor and the planner read ----------------------------------------------
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
        from ..catalog import OPERATORS

        return tuple(self.floor_cell(spec.name)[0] for spec in OPERATORS)

    def _publish_floors(self, floor_bytes: int, ops: Any = ()) -> None:
        """The planner refreshed floors: the C fast path holds the smallest, each wrapped function
        and each operator its own."""
        if self.local_only or self._publish is None:
            return
        cells = self.planner.floor_cells
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
        guard.busy = True
        try:
            got = self.calls.run(spec, sig, args, kwargs)
        finally:
            guard.busy = False
        if got.__class__ is not Record:
            return self.checks.finish(got, check, sig, args, kwargs)
        t = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            self.calls.local_done(got, time.perf_counter() - t, exc)
            raise
        self.calls.local_done(got, time.perf_counter() - t, None)
        return result

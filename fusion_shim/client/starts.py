"""When and how the workers of a run start: now (at install, in the background), deferred on evidence, or
through Ray (a pool). :class:`WorkerStarts` is the one object that decides it and holds what the decision
needs (D338); the runtime asks it, and hands it the calls made while the start waits.

D40: on a host with no GPU (:func:`embedded.gpu_visible`), an embedded worker under ``auto`` would run
torch on the very CPUs the program already has. It starts only on evidence: the program's own calls of
the ops a CPU worker wins here, at the sizes it wins them (:mod:`fusion_shim.plan.cpuwins`, the only
floors below NEVER until then), must have taken long enough here that the worker would have saved what
its start costs. ``FUSION_SHIM_DEVICE=cpu`` starts it at once. D302: under ``auto`` a pool is opened on
evidence too (:mod:`fusion_shim.plan.poolopen`), off the program's thread (D300); under ``remote`` it is
opened before the planner, by the thread that first needs it (D154).
"""
from __future__ import annotations

import _thread
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ..catalog import OpSpec
from ..config import Config
from ..ledger import Ledger, Record, call_site
from ..plan.cells import NEVER
from . import embedded

if TYPE_CHECKING:
    from ..plan.cpuwins import CpuEvidence
    from ..plan.poolopen import PoolEvidence
    from .link import WorkerLink


def waits_on_evidence(config: Config) -> bool:
    """Whether the start waits on the program's calls: an embedded CPU worker under auto on a host with
    no GPU (D40), a pool under auto (D302). Read once, at install (gpu_visible lists /dev)."""
    if config.policy != "auto":
        return False
    return bool(config.pool) or (not config.workers and config.worker is None and config.device == "auto"
                                 and not embedded.gpu_visible())


class WorkerStarts:
    """The start of one run's workers. ``waits``: :func:`waits_on_evidence` of ``config``;
    ``floor_cells``: the runtime's (the evidence's floors are written there); ``links``: the runtime's links, made on first need; ``background``: starts the runtime's
    background thread; ``publish``: carries floors to the fast path; ``export_env``: children reuse
    this process's worker."""

    def __init__(self, config: Config, waits: bool, ledger: Ledger, floor_cells: dict[str, list[int]],
                 links: Callable[[], "list[WorkerLink]"], background: Callable[[], Any],
                 publish: Callable[..., None], export_env: bool = False):
        self._config = config
        self._ledger = ledger
        self._cells = floor_cells
        self._links = links
        self._background = background
        self._publish = publish
        self._export_env = export_env
        # None: an embedded worker; a pool's URLs are known once it is opened (open_pool)
        self.urls: list[str | None] = [] if config.pool else list(config.workers) or [config.worker]
        self.pool: Any = None  # pool.locate.Pool, once opened
        self.endpoints: list = []  # its workers (pool.locate.Endpoint), in the links' order
        self.background_open = False  # D300: under auto the pool is opened on a thread of its own,
        self._pool_ident: int | None = None  # ... this one
        self._pid = os.getpid()
        self._started = False
        self._ended = False  # shut down, or the pool was not usable: nothing starts from now on
        # D302: under auto a pool is opened on evidence too: the program's calls must pay Ray's cost
        self.pool_deferred = bool(config.pool) and config.policy == "auto"
        # read on every call above a floor: while True, the call is evidence (evidence_call)
        self.deferred = waits
        self._evidence: "CpuEvidence | PoolEvidence | None" = None
        self.evidence_floor = NEVER  # the smallest of the evidence's floors while deferred (D40)
        self._cpu_started_s: float | None = None  # when the evidence started the deferred worker
        if self.deferred:
            self._gather_evidence()
        self._deferred_dir: str | None = None  # where the deferred worker will listen (children were told)
        self._deferred_made = False  # whether that directory exists yet (D122)

    # -- at install ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or connect to) the workers in the background, or wait for evidence; once."""
        if self._ended or self._started:
            return
        self._started = True
        if self.pool_deferred:
            self._ledger.event(f"pool {self._config.pool}: opened (Ray asked) only once this program's calls have "
                               f"taken long enough here to pay what that costs (D302)")
            return
        if self.deferred:
            self._defer()
            return
        links = self._start_links()
        if self._export_env and not self._config.pool and links and links[0].embedded:
            os.environ["FUSION_SHIM_WORKER"] = links[0].url

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
            self._cells[op][0] = floor
        self.evidence_floor = min(floors.values(), default=NEVER)

    def _defer(self) -> None:
        """D40: the embedded CPU worker starts once the program's calls show it would pay; its link
        is made then (or when something asks for it), in state ``deferred`` until it starts."""
        self._ledger.event("no GPU on this host: the embedded worker would run on this program's own CPUs, "
                           "so it starts only once this program's calls show work a CPU worker wins here, "
                           "enough to pay its start (FUSION_SHIM_DEVICE=cpu starts it now; "
                           "FUSION_SHIM_WORKER connects to another host's)")
        if self._export_env:  # children connect to the worker this process will start, never their own
            from .rundir import new_run_dir, run_dir_name

            # D122: the link's own directory (make_tmpdir), named now for the children, made when it starts
            path = run_dir_name()
            if path is None:
                path, why = new_run_dir()
                self._deferred_made = True
                if why:
                    self._ledger.event(f"runtime directory refused: {why}")
            self._deferred_dir = path
            os.environ["FUSION_SHIM_WORKER"] = f"ipc://{path}/worker-0.sock"

    # -- the pool (D154) ----------------------------------------------------------------------------
    def open_pool(self) -> bool:
        """D154: the pool's workers, found through Ray before the planner is made (it is sized by
        them); False: a pool that cannot be used leaves the run local, with the reason in one line."""
        if not self._config.pool:
            return True
        from ..pool.locate import Pool

        t = time.perf_counter()
        # D300: under auto nobody waits for Ray's helpers: they run at idle priority, as a deferred worker's start
        idle = embedded.lower_priority if self.pool_deferred else None
        self.pool = Pool(self._config.pool, self._ledger.event, self._config.insecure, idle)
        endpoints, why = self.pool.open()
        if not self.on_pool_thread():
            self._ledger.add_startup("pool", time.perf_counter() - t)
        if why is not None:
            self._ledger.event(f"pool {self._config.pool} not used, every call runs here: {why}")
            self._ended = True
            return False
        self.endpoints = endpoints
        self.urls = [e.url for e in endpoints]
        self._ledger.event(f"pool {self._config.pool}: {len(endpoints)} workers found through Ray: " + ", ".join(
            f"{e.name} on {e.info.get('node')} ({_pool_device(e.info)})" for e in endpoints))
        return True

    def targets(self) -> list[tuple[str | None, Any]]:
        """(URL, pool endpoint or None) of each worker, in the links' order."""
        return list(zip(self.urls, self.endpoints or [None] * len(self.urls)))

    @property
    def locate(self) -> Callable | None:
        """The pool's way to find a worker again after a restart (None: no pool)."""
        return self.pool.locate if self.pool is not None else None

    def on_pool_thread(self) -> bool:
        """D300: whether this is the thread the pool opens on (its time is not the program's start-up)."""
        return _thread.get_ident() == self._pool_ident

    def _open_in_background(self) -> None:
        """D300: the pool opened, its planner and links made and started, off the program's thread:
        none of it is the program's start-up; the report's pool section says what Ray cost."""
        self._pool_ident = _thread.get_ident()
        t = time.perf_counter()
        self._start_links()
        self._ledger.event(f"pool opened off the program's thread in {time.perf_counter() - t:.2f} s")

    # -- the links ------------------------------------------------------------------------------------
    def links_made(self, links: "list[WorkerLink]") -> None:
        """The runtime made the links: a deferred embedded worker's waits, at the URL children were told."""
        if not self.deferred or self.pool_deferred or not links:
            return
        url = tmpdir = None
        if self._deferred_dir is not None:
            # the URL children were told at install, which its first spawn binds; the
            # directory is this process's own (a forked child's link must not remove it)
            url = f"ipc://{self._deferred_dir}/worker-0.sock"
            if os.getpid() == self._pid:
                tmpdir, self._deferred_dir = self._made_deferred_dir(), None
        links[0].defer(url, tmpdir)

    def _made_deferred_dir(self) -> str | None:
        """The deferred worker's directory, made now if only named (D122); None where that fails:
        its link makes a fresh one, and children told the named one then find no worker there."""
        if self._deferred_made:
            return self._deferred_dir
        from .rundir import make_named

        try:
            path = make_named(self._deferred_dir)
        except OSError as exc:
            self._ledger.event(f"runtime directory refused: {exc}")
            return None
        self._deferred_made = True
        return path

    def _start_links(self) -> "list[WorkerLink]":
        if self._ended:
            return []
        links = self._links()
        if self.pool_deferred and not self._ended:  # D302: the planner's floors from now on (NEVER until ready)
            floors = self._evidence.floors() if self._evidence is not None else {}
            for op in floors:
                self._cells[op][0] = NEVER
            self.deferred = False
            self._publish(NEVER, list(floors))
        for link in links:  # the floors stay NEVER until one is ready (Planner.held)
            link.start()
        if self._config.policy == "auto" and links:  # calibration and floors run there: off the program's calls
            self._background()
        return links

    # -- while the start waits on evidence ------------------------------------------------------------
    def evidence_call(self, spec: OpSpec, args: tuple, kwargs: dict, original: Callable) -> Any:
        """D40: a call above an evidence floor while the worker is deferred: computed here, timed and
        recorded, evidence for the worker's start, which then happens off the program's thread (the
        planner, the call path and the link are made there, not for this call)."""
        rec = Record(spec.name, spec.family, site=call_site(4), thread=_thread.get_ident(),
                     reason="pool not opened yet: timed as evidence for its opening" if self.pool_deferred else
                     "embedded worker deferred (no GPU on this host): timed as evidence for its start")
        t = time.perf_counter()
        rec.start_s = t - self._ledger.started
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            rec.raised = type(exc).__name__
            self._ledger.add(rec)
            raise
        seconds = time.perf_counter() - t
        rec.phases["local"] = rec.wall_s = seconds
        self._ledger.add(rec)
        nbytes = sum(getattr(a, "nbytes", 0) for a in args)
        evidence = self._evidence
        if evidence is not None and evidence.observe(spec.name, nbytes, seconds):
            import threading

            threading.Thread(target=self._start_deferred, name="fusion-shim-start", daemon=True).start()
        return result

    def _start_deferred(self) -> None:
        """The program's calls have shown the deferred start would pay: the pool is opened, or the
        embedded CPU worker started."""
        if self._ended:
            return
        if self.pool_deferred:
            import threading

            self._ledger.event(f"opening pool {self._config.pool} at {self._ledger.now():.2f}s: "
                               + (self._evidence.describe() if self._evidence is not None else "asked to"))
            # D300: Ray is asked off the program's thread; calls run here until a worker is ready
            self.background_open = True
            threading.Thread(target=self._open_in_background, name="fusion-shim-pool", daemon=True).start()
            return
        links = self._links()  # made here, off the program's thread, unless something needed them before
        link = links[0] if links else None
        if self._ended or link is None or link.stopped or link.state != "deferred" or os.getpid() != link.owner:
            return  # shut down meanwhile, or a forked child's copy
        self.deferred = False
        self._cpu_started_s = self._ledger.now()
        self._ledger.event(f"starting the embedded worker on this host's CPUs at {self._cpu_started_s:.2f}s: "
                           + (self._evidence.describe() if self._evidence is not None else "asked to"))
        link.start()
        if self._config.policy == "auto":
            self._background()

    # -- what the report reads --------------------------------------------------------------------------
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

    # -- at the end ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Nothing starts from now on; a helper still asking Ray is ended, not waited for (D300)."""
        self._ended = True
        if self.pool is not None:
            self.pool.close()

    def remove_unused_dir(self) -> None:
        """The deferred worker's directory, told to children and never used (after the links stopped)."""
        if self._deferred_dir is not None and os.getpid() == self._pid:
            if self._deferred_made:
                _remove_dir(self._deferred_dir)
            self._deferred_dir = None


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

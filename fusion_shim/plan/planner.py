"""The planner's state between calls: the profile, the exploration budget, calibration on
first use, and the per-op floors the interceptor reads.

The runtime owns one Planner. It calls :meth:`Planner.decide` on the application's thread (a few
microseconds: dictionary reads and arithmetic), :meth:`observed_local` / :meth:`observed_remote`
after each call it recorded, and :meth:`worker_ready` / :meth:`worker_down` from its link threads.
A stage call is decided by its ``stages`` (:class:`.stages.StageDecider`, D347).
Work that takes milliseconds (calibration probes, recomputing every op's floor) runs only on the
background thread the runtime provides (``background``), never on the application's critical
path; one op's floor after its first measurements here is recomputed inline (D98).

Exploration budget: ``EXPLORE_FRACTION`` of the intercepted time recorded so far, minus what
explored calls cost over the prediction for the place not taken. An exploration on a worker that
does not share the client's CPUs is abandoned (computed here, the late reply dropped) once it has
taken the local prediction plus what is left of the budget (:meth:`Planner.explore_deadline`, D94);
on one that does, it is waited for (the runtime decides).

Floors from evidence (D95, D96): when ``HOPELESS_CALLS`` of an op's calls could not have won on any
ready worker under the floor's own optimistic test (inputs free where residency may keep them, the
device Z_FLOOR sigmas fast), the op's floor rises just past the largest of them, as far as every
dtype its calls were priced on a worker in has shown; calls of that size then cost one comparison.
Any refresh from the models (a worker ready or back, a link measured, a calibration, a worker's
first measurements of an op) drops these raises and evidence is gathered again. The price: a call
of the op with fewer input bytes but more work than the hopeless ones stays local unseen.
"""
from __future__ import annotations

import functools
import math
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Sequence

from . import calibrate
from .cells import FLOOR_BYTES, floor_cells as new_floor_cells, starting_floor
from .model import FAMILIES, Profile
from .policy import FLOOR_DTYPES, NEVER, Call, Decision, WorkerState, could_win, decide, family_of, floors_by_dtype
from .stages import StageDecider

EXPLORE_FRACTION = 0.02
OWN_SAMPLES_ENOUGH = 2   # a (family, dtype) with this many measured calls of its own is not probed
PROBE_DEFER_S = 0.5      # a probe waits this long first: the program's own calls may measure it meanwhile
FLOORS_AFTER_SAMPLES = 2  # the floors are recomputed after each of an op's first local measurements
MAX_SEEDED_OPS = 64  # of a worker's self-benchmarked ops, at most this many are read
HOPELESS_CALLS = 2  # an op's calls that could not win anywhere, even optimistically, before its floor rises past them
# D97: residency_decides looks at a kept call's inputs only where the look costs about one slow path
LOOK_MAX_S = 5e-3
LOOK_MAX_BYTES = 8 << 20
LOOK_CALLS = 4


def _never_raises(method: Callable) -> Callable:
    """Learning runs on the program's thread after its call: a bug here is reported, never raised."""
    @functools.wraps(method)
    def safe(self: "Planner", *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:
            self.on_event(f"planner error in {method.__name__}: {type(exc).__name__}: {exc}")
    return safe


class Planner:
    def __init__(self, policy: str, workers: int = 1, *, min_flops: float = 0.0,
                 cache: calibrate.Cache | None = None,
                 background: Callable[[Callable[[], None], str], None] | None = None,
                 on_event: Callable[[str], None] | None = None,
                 explore_fraction: float = EXPLORE_FRACTION, profile: Profile | None = None,
                 ops: dict[str, str] | None = None, inputs_may_be_resident: bool = False,
                 worker_busy: Callable[[], bool] | None = None,
                 on_floors: Callable[[int, Any], None] | None = None,
                 floor_cells: "dict[str, list[int]] | None" = None):
        self.policy = policy
        self.ops = dict(ops) if ops else None  # name -> family: the ops whose floors are derived
        self.profile = profile or Profile(workers)
        self.stages = StageDecider(policy, self.profile)  # D347: the run's stage calls are decided here too
        self.min_flops = min_flops
        self.cache = cache
        self.background = background
        self.on_event = on_event or (lambda text: None)
        self.explore_fraction = explore_fraction
        self.lock = threading.Lock()
        self.intercepted_s = 0.0
        self.explore_spent_s = 0.0
        self.explored = 0
        self.explorations_abandoned = 0  # explorations on a worker that ran out of their deadline
        self.ready: set[int] = set()
        self.curves_from: dict[tuple[str, str], str] = {}  # (family, dtype) -> "cache" | "measured"
        self._wanted: set[tuple[str, str]] = set()
        self._queue: list[tuple[str, str]] = []
        self._probed: set[tuple[str, str]] = set()  # probed, queued, or read from the cache
        # (op, dtype) -> its calls that could not win anywhere, since the last refresh
        self._hopeless: dict[tuple[str, str], int] = {}
        self._hopeless_past: dict[str, dict[str, int]] = {}  # op -> dtype -> past its hopeless calls, since then
        self._dtypes: dict[str, set[str]] = defaultdict(set)  # op -> the dtypes its calls were priced on a worker in
        self._looked: dict[str, int] = {}    # op -> its local calls whose inputs were looked at, since then
        self.raised: dict[str, int] = {}     # op -> the floor the evidence gave it (reported)
        self.raises = 0
        # set under auto until a worker is first ready (the runtime also holds it while it defers an
        # embedded CPU worker): D90: every floor is NEVER, so that nothing reaches the slow path
        # while nothing can leave the process
        self.held = policy == "auto"
        self._computed: set[str] = set()  # ops whose floor the models have produced (floor_bytes: their minimum)
        self._model_floors: dict[str, dict[str, int]] = {}  # op -> dtype -> the models' floor (the op's: the least)
        self._calibrating = False
        # one cell per op, read by the interceptor's fast path without a lock: [floor in bytes]; the
        # runtime's, which the interceptor has held since before this planner was made
        self.floor_cells: dict[str, list[int]] = new_floor_cells(policy) if floor_cells is None else floor_cells
        self.floor_bytes = starting_floor(policy)
        # where residency can keep inputs on a worker: the floors then assume inputs may already be
        # there, so only the result's way back is certain
        self.inputs_may_be_resident = inputs_may_be_resident
        # D91: whether a worker computing on the client's CPUs has a call of ours in flight (no
        # calibration probe then)
        self.worker_busy: Callable[[], bool] = worker_busy or (lambda: False)
        # called after each refresh with the smallest floor and the ops refreshed: the C fast path
        # holds the smallest, and each op's own
        self.on_floors: Callable[[int, Any], None] | None = on_floors

    # -- on the application's thread ------------------------------------------------------------
    def decide(self, call: Call, workers: Sequence[WorkerState], priced: Decision | None = None) -> Decision:
        """Where ``call`` runs on ``workers`` as the runtime found them; what a decision leaves
        (the dtype's evidence, a calibration probe) follows this answer alone. ``priced``: what
        :meth:`price` answered for these same workers, not priced again."""
        try:
            d = priced if priced is not None else self._price(call, workers, True)
            key = (call.family, call.dtype)
            if d.remote_s is not None:  # a dtype a worker was priced for: its calls may be evidence
                self._dtypes[call.op].add(call.dtype)
            if (d.where == "local" and d.remote_s is not None and d.local_s is not None
                    and d.remote_s < d.local_s and key not in self._probed):
                self._probe(key)  # a worker predicted faster, not by the margin: calibration can decide it
            return d
        except Exception as exc:  # a planner bug costs a local call and a line in the report, never the program
            self.on_event(f"planner error, {call.op} computed here: {type(exc).__name__}: {exc}")
            return Decision("local", f"planner error: {type(exc).__name__}")

    def price(self, call: Call, workers: Sequence[WorkerState], explore: bool = True) -> Decision | None:
        """What :meth:`decide` would answer for ``workers``, leaving nothing behind: how the runtime
        judges what else is worth finding out for a call before its one decision (D310).
        ``explore`` False: with no exploration budget. None where pricing raised (decide says why)."""
        try:
            return self._price(call, workers, explore)
        except Exception:
            return None

    def _price(self, call: Call, workers: Sequence[WorkerState], explore: bool) -> Decision:
        key = (call.family, call.dtype)
        if key not in self._wanted and self.policy != "local":
            self._want(key)  # a cached local curve is read on first use: it is part of what is priced
        if call.family != "products" and ("products", call.dtype) not in self._wanted and self.policy != "local":
            self._want(("products", call.dtype))  # D348: this host's GEMM curve reads the ops a worker timed
        # D350: without exploring, below any budget: a zero one still lets a free exploration through
        budget = self.explore_fraction * self.intercepted_s - self.explore_spent_s if explore else -math.inf
        return decide(self.policy, call, self.profile, workers, budget, self.min_flops)

    def link_could_matter(self, call: Call, workers: Sequence[WorkerState]) -> bool:
        """Whether measuring the links could change where ``call`` goes: with every link free (its
        bytes moved in no time) a worker would get it or explore it. Where even that keeps it here,
        a link's bulk probe is spent for nothing (D93)."""
        try:
            budget = self.explore_fraction * self.intercepted_s - self.explore_spent_s
            return decide(self.policy, call, self.profile, workers, budget, self.min_flops,
                          link_free=True).where == "worker"
        except Exception:  # as decide(): never the program's problem; the probe is then made
            return True

    @_never_raises
    def observed_local(self, call: Call, decision: Decision | None, seconds: float,
                       inputs_up: int | None = None) -> None:
        """A call computed here, timed (NumPy's own time). ``inputs_up``: the fewest input bytes it
        could be priced for on a worker, where residency looked at them (:meth:`residency_decides`)."""
        with self.lock:
            self.intercepted_s += seconds
            if decision is not None and decision.explore and decision.remote_s is not None:
                self.explore_spent_s += max(seconds - decision.remote_s, 0.0)
                self.explored += 1
            first = self.profile.local.samples(call.op, call.dtype) < FLOORS_AFTER_SAMPLES
            msg = self.profile.local.observe(call.op, call.family, call.dtype, call.flops, seconds)
        if msg:
            self._reset(msg, call.family, call.dtype, local=True)
        if first:  # the first measurements of an op here can move its floor a long way
            self._refresh_floor(call.op, call.family, call.dtype)
        if (decision is not None and decision.where == "local" and not decision.explore
                and decision.remote_s is not None):
            self._evidence(call, inputs_up)

    @_never_raises
    def measured_local(self, call: Call, seconds: float) -> None:
        """NumPy's time for a call that also ran on the worker (a verification check): it teaches
        the local model, and is not time the program spent."""
        with self.lock:
            msg = self.profile.local.observe(call.op, call.family, call.dtype, call.flops, seconds)
        if msg:
            self._reset(msg, call.family, call.dtype, local=True)

    @_never_raises
    def observed_remote(self, worker: int, call: Call, decision: Decision, seconds: float,
                        kernel_s: float | None, up: int, down: int) -> None:
        """A call answered by ``worker``: ``seconds`` from encoding to decoding, ``kernel_s`` the
        worker's own compute time, ``up``/``down`` the bytes that crossed the link."""
        msgs = []
        with self.lock:
            self.intercepted_s += seconds
            if decision.explore and decision.local_s is not None:
                self.explore_spent_s += max(seconds - decision.local_s, 0.0)
                self.explored += 1
            model = self.profile.workers[worker]
            # counted only where a floor was raised: only then does a first measurement matter
            first = bool(self.raised) and model.device.samples(call.op, call.dtype) < FLOORS_AFTER_SAMPLES
            if kernel_s is not None and kernel_s > 0:
                msgs.append(model.device.observe(call.op, call.family, call.dtype, call.flops, kernel_s))
                msgs.append(model.link.observe(up, down, max(seconds - kernel_s, 1e-6)))
        for msg in msgs:
            if msg:
                self._reset(msg, call.family, call.dtype, local=False)
        if first and self.raised and self.background is not None:
            # the worker's first measurements of an op can move its family's curve: floors raised on
            # the old one are evidence no more
            self.background(self.refresh_floors, "fusion-shim-floors")

    def explore_deadline(self, decision: Decision) -> float:
        """How long an exploration on a worker may take before it is abandoned and computed here: the
        local prediction plus what is left of the budget: its predicted price was checked, its
        cost is bounded (D94)."""
        with self.lock:
            left = self.explore_fraction * self.intercepted_s - self.explore_spent_s
        return (decision.local_s or 0.0) + max(left, 0.0)

    @_never_raises
    def abandoned(self, worker: int, call: Call, seconds: float) -> None:
        """An exploration ran out of :meth:`explore_deadline` after ``seconds`` and is computed here:
        all of that wait is its cost, and the op takes at least that long there."""
        with self.lock:
            self.intercepted_s += seconds
            self.explore_spent_s += seconds
            self.explored += 1
            self.explorations_abandoned += 1
        self.timed_out(worker, call, seconds)

    @_never_raises
    def timed_out(self, worker: int, call: Call, seconds: float) -> None:
        """A call on ``worker`` ran out of its deadline after ``seconds``: it takes at least that long
        there, so the next prediction for it moves up (call deadlines follow predictions)."""
        with self.lock:
            self.profile.workers[worker].device.observe(call.op, call.family, call.dtype, call.flops, seconds,
                                                        force=True)

    # -- from the links' threads -----------------------------------------------------------------
    @_never_raises
    def worker_ready(self, worker: int, bench: Any, rtt: float, up_bps: float | None = None,
                     down_bps: float | None = None) -> None:
        """The worker answered ``ready``: its self-benchmark, the round trip measured at connect and,
        when already known, the bandwidth each way (else the prior's, until :meth:`link_measured`)."""
        model = self.profile.workers[worker]
        with self.lock:
            if up_bps and down_bps:
                model.link.set_measured(rtt, up_bps, down_bps)
            else:
                model.link.rtt = rtt
            if isinstance(bench, dict):
                points = bench.get("points")
                if isinstance(points, dict):
                    for key, pts in points.items():
                        family, _, dtype = str(key).partition("/")
                        if family in FAMILIES and isinstance(pts, list):
                            model.device.set_curve(family, dtype, [tuple(map(float, p)) for p in pts
                                                                   if isinstance(p, (list, tuple)) and len(p) == 2])
                            model.benchmarked = True
                self._seed_ops(model, bench.get("ops"))
                for op, dtype in list(model.device.op_curves):  # D348: its op-to-GEMM ratios, for this host's priors
                    self.profile.local.set_kin(op, dtype, model.device.gemm_offsets(op, dtype))
                if not model.benchmarked:  # an older worker: one float64 rate per family
                    for family in FAMILIES:
                        rate = bench.get(family)
                        if isinstance(rate, (int, float)) and rate > 0:
                            model.device.set_curve(family, "f8", [(1e8, 1e8 / (rate * 1e9))])
                            model.benchmarked = True
            self.ready.add(worker)
            self.held = False
        busy = bench.get("others_busy") if isinstance(bench, dict) else None
        if isinstance(busy, list) and busy and all(isinstance(b, (int, float)) for b in busy) and (
                bench.get("contended") or len(busy) > 1):
            shares = ", ".join(f"{b:.0%}" for b in busy[:5])
            self.on_event(f"worker {worker}'s self-benchmark ran beside other processes (they used {shares} of its "
                          + ("CPUs in each try: its rates may read slow until its calls correct them)"
                             if bench.get("contended") else "CPUs; taken again, each point's best time kept)"))
        cached = bench.get("cached_s") if isinstance(bench, dict) else None
        if isinstance(cached, (int, float)) and 0 <= cached < float("inf"):
            self.on_event(f"worker {worker}'s self-benchmark was reused from its host's cache (taken "
                          f"{cached / 60:.0f} min ago; `fusion-shim worker --fresh-bench` takes it again)")
        failed = bench.get("ops_failed") if isinstance(bench, dict) else None
        if isinstance(failed, dict) and failed:  # said outside the lock, as every event
            self.on_event(f"worker {worker}'s self-benchmark could not time "
                          + "; ".join(f"{str(op).removeprefix('numpy.')} ({str(why)[:120]})"
                                      for op, why in list(failed.items())[:MAX_SEEDED_OPS])
                          + ": their calls are priced off their family's curve")
        self.refresh_floors()

    def _seed_ops(self, model: Any, ops: Any) -> None:
        """The worker's own timings of single ops (its ``bench["ops"]``: "numpy.linalg.svd/f8" ->
        [[flops, seconds], ...]) become that op's curve on its device. Caller holds the lock."""
        if not isinstance(ops, dict):
            return
        for key, pts in list(ops.items())[:MAX_SEEDED_OPS]:
            op, _, dtype = str(key).rpartition("/")
            if not op or (self.ops is not None and op not in self.ops) or not isinstance(pts, list):
                continue
            model.device.set_op_curve(op, dtype, [(float(p[0]), float(p[1])) for p in pts[:4]
                                                  if isinstance(p, (list, tuple)) and len(p) == 2
                                                  and all(isinstance(v, (int, float)) for v in p)
                                                  and 0 < p[0] < 1e18 and 0 < p[1] < 1e4])

    @_never_raises
    def link_measured(self, worker: int, up_bps: float, down_bps: float) -> None:
        link = self.profile.workers[worker].link
        with self.lock:
            link.set_measured(link.rtt, up_bps, down_bps)
        self.refresh_floors()

    @_never_raises
    def worker_down(self, worker: int) -> None:
        with self.lock:
            self.ready.discard(worker)

    # -- calibration on first use, in the background ----------------------------------------------
    # D92: a cached curve is read at first use; a probe runs only where it can change a decision (a
    # ready worker predicted faster, not by the margin, and no calls of the program's own measured it)
    def _want(self, key: tuple[str, str]) -> None:
        with self.lock:
            if key in self._wanted:
                return
            self._wanted.add(key)
        if key[1] not in calibrate.FLOAT_DTYPES:
            return  # integer products are not calibrated: they learn from their own calls
        points = self.cache.get(*key) if self.cache is not None else None
        if points is not None:
            with self.lock:
                self.profile.local.set_curve(key[0], key[1], points)
                self.curves_from[key] = "cache"
            self.on_event(f"local {key[0]} {key[1]} calibration read from the cache")
            with self.lock:
                self._probed.add(key)

    def _probe(self, key: tuple[str, str]) -> None:
        with self.lock:
            if key in self._probed or key[1] not in calibrate.FLOAT_DTYPES:
                return
            self._probed.add(key)
            self._queue.append(key)
            if self._calibrating or self.background is None:
                return
            self._calibrating = True
        self.background(self._calibrate_queue, "fusion-shim-calibrate")

    def calibrate_now(self, keys: Sequence[tuple[str, str]]) -> None:
        """Probe ``keys`` on this thread, whatever the cache holds (the CLI, a forced refresh)."""
        with self.lock:
            for key in keys:
                self._wanted.add(key)
                self._probed.add(key)
                self._queue.append(key)
            self._calibrating = True
        self._calibrate_queue(force=True)

    def _calibrate_queue(self, force: bool = False) -> None:
        try:
            if not force:
                # D92: a program that keeps calling the family measures it for free meanwhile
                time.sleep(PROBE_DEFER_S)
            measured = False
            while True:
                with self.lock:
                    if not self._queue:
                        self._calibrating = False
                        break
                    family, dtype = self._queue.pop(0)
                    own = sum(self.profile.local.samples(op, dtype) for (op, dt) in list(self.profile.local.buckets)
                              if dt == dtype and family_of(op) == family)
                if own >= OWN_SAMPLES_ENOUGH and not force:
                    self.on_event(f"local {family} {dtype}: learnt from {own} of the program's own calls, no probe")
                    continue
                try:
                    points = calibrate.probe(family, dtype, self._others_busy)
                except calibrate.Contended as exc:  # nothing cached: the program's own calls teach it
                    self.on_event(f"local {family} {dtype} not calibrated: {exc}; it learns from the "
                                  "program's own calls")
                    continue
                source = "measured"
                if self.cache is not None:
                    self.cache.put(family, dtype, points)
                with self.lock:
                    self.profile.local.set_curve(family, dtype, points)
                    self.curves_from[(family, dtype)] = source
                self.on_event(f"local {family} {dtype} calibrated ({source}): " + ", ".join(
                    f"{f / s / 1e9:.3g} GFLOP/s at {f:.2g} flops" for f, s in points))
                measured = True
            if measured:  # else the program's own calls have refreshed what they changed
                self.refresh_floors()
        except BaseException:
            with self.lock:
                self._calibrating = False
            raise

    def _reset(self, msg: str, family: str, dtype: str, local: bool) -> None:
        self.on_event(msg)
        if local and self.cache is not None and self.curves_from.get((family, dtype)) == "cache":
            self.cache.drop(family, dtype)  # the cached curve may be what is wrong: measure next run

    # -- the floors ---------------------------------------------------------------------------------
    def _refresh_floor(self, op: str, family: str, dtype: str) -> None:
        """One op's floor, after one of its first measurements here, in ``dtype``: that dtype's bound
        alone is recomputed, inline (D98). Nothing before a worker is ready: its readiness
        refreshes every floor."""
        if self.policy != "auto" or self.held or dtype not in FLOOR_DTYPES:
            return  # (a floor is the least over FLOOR_DTYPES: another dtype's measurement moves none)
        with self.lock:
            ready = sorted(self.ready)
        if not ready:
            return
        known = self._model_floors.get(op)
        fresh = floors_by_dtype(self.profile, ready, inputs_free=self.inputs_may_be_resident, ops={op: family},
                                dtypes=None if known is None else (dtype,))[op]
        by = self._model_floors[op] = fresh if known is None else {**known, **fresh}
        self.floor_cells[op][0] = max(min(by.values(), default=NEVER), self.raised.get(op, 0))
        self._computed.add(op)
        self._set_floor_bytes(self._lowest_floor(), (op,))

    def residency_decides(self, call: Call, decision: Decision) -> bool:
        """Whether to look at the inputs (fingerprints) of a call that stays here, for the evidence
        about its op's floor: where they are decides it (the floor's optimistic test passes with them
        on a worker, and fails sending them all), the call is short enough that the slow path matters
        and its inputs small enough to hash cheaply (LOOK_MAX_S, LOOK_MAX_BYTES), and the op has not
        been looked at LOOK_CALLS times since the last refresh."""
        if (self.policy != "auto" or not self.inputs_may_be_resident or decision.local_s is None
                or decision.local_s > LOOK_MAX_S or call.bytes_in > LOOK_MAX_BYTES):
            return False
        with self.lock:
            ready = sorted(self.ready)
            if not ready or self._looked.get(call.op, 0) >= LOOK_CALLS:
                return False
        if not could_win(self.profile, ready, call, 0) or could_win(self.profile, ready, call):
            return False
        with self.lock:
            self._looked[call.op] = self._looked.get(call.op, 0) + 1
        return True

    def _evidence(self, call: Call, inputs_up: int | None = None) -> None:
        """A call decided local: if it could not have won anywhere even optimistically, and it is
        the op's HOPELESS_CALLS-th such since the last refresh, the op's floor rises past it. Its
        inputs are priced as the runtime found them (``inputs_up``: none for those a worker holds,
        the smallest share of their upload for those reused here, the rest in full); where it did
        not look, as the floor has them: possibly all resident (D97)."""
        if self.policy != "auto":
            return
        with self.lock:
            ready = sorted(self.ready)
        if inputs_up is None and self.inputs_may_be_resident:
            inputs_up = 0
        if not ready or could_win(self.profile, ready, call, inputs_up):
            return
        with self.lock:
            key = (call.op, call.dtype)
            n = self._hopeless[key] = self._hopeless.get(key, 0) + 1
            cell = self.floor_cells[call.op]
            if n < HOPELESS_CALLS or cell[0] > call.bytes_in:
                return
            past = self._hopeless_past.setdefault(call.op, {})
            past[call.dtype] = max(past.get(call.dtype, 0), call.bytes_in + 1)
            # D96: one floor per op: it rises only as far as every dtype a worker was priced for has shown hopeless
            value = min(past.get(dtype, 0) for dtype in self._dtypes[call.op] | {call.dtype})
            if value <= cell[0]:
                return
            first = call.op not in self.raised
            cell[0] = self.raised[call.op] = value
            self.raises += 1
            self._computed.add(call.op)
            low = self._lowest_floor()
        self._set_floor_bytes(low, (call.op,))
        if first:
            self.on_event(f"floor of {call.op} raised to {_size(value)}: {n} of its {call.dtype} calls could not "
                          "have won on any worker, even at its most optimistic")

    def _others_busy(self) -> float:
        """For a calibration probe: CPUs' worth of other work of this program, a call computing on a
        same-host worker counted as a whole busy CPU (calibrate.best_time never times beside it)."""
        return 1.0 + calibrate.BUSY_SHARE if self.worker_busy() else calibrate.others_busy()

    def _lowest_floor(self) -> int:
        """The smallest floor of the ops the models or the evidence have set (the C fast path's)."""
        return min((self.floor_cells[o][0] for o in list(self._computed)), default=NEVER)

    def _set_floor_bytes(self, low: int, ops: Any) -> None:
        self.floor_bytes = low
        if self.on_floors is not None:
            self.on_floors(low, ops)

    def refresh_floors(self) -> None:
        """Recompute every op's floor from the models (about 10 ms: call it off the app's thread)."""
        if self.policy != "auto":
            return
        with self.lock:
            ready = sorted(self.ready)
            self._hopeless.clear()
            self._hopeless_past.clear()
            self._looked.clear()
            self.raised.clear()
        if self.held:  # no worker ready yet: nothing can leave the process
            self._model_floors.clear()
            new = {op: NEVER for op in (self.ops or self.floor_cells)}
        else:
            by = floors_by_dtype(self.profile, ready or None, inputs_free=self.inputs_may_be_resident, ops=self.ops)
            self._model_floors.update(by)
            new = {op: min(d.values(), default=NEVER) for op, d in by.items()}
        for op, value in new.items():
            self.floor_cells[op][0] = value
        self._computed.update(new)
        self._set_floor_bytes(self._lowest_floor(), tuple(new))

    def describe_floors(self) -> str:
        parts = []
        for op, (v,) in sorted(self.floor_cells.items()):
            parts.append(f"{op.removeprefix('numpy.')} {'never' if v >= NEVER else _size(v)}")
        return ", ".join(parts)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


__all__ = ["Planner", "EXPLORE_FRACTION", "FLOOR_BYTES", "family_of"]

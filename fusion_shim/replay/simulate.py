"""A recorded run's calls priced on a modelled device and link: all-local, all-remote, ``auto`` and
the oracle. Every figure here is SIMULATED.

``auto`` is the real planner (:class:`fusion_shim.plan.Planner`): made as the runtime makes it, told
the modelled worker is ready with the self-benchmark that worker would report (timed through the
device model) and the link its connect-time probe would measure, then driven through the recorded
calls in order: each call that its op's floor lets through is decided by ``Planner.decide`` and the
simulated time of the place it chose is fed back (``observed_local`` / ``observed_remote``), as the
call path does. It never reads the models otherwise. Calls under the floor stay here unseen, as on the
interceptor's fast path.

Residency follows the recorded buffer tokens (``ledger.Buffers``): an input the simulated worker
holds (uploaded earlier, or a result it computed) is not sent again; inputs under RESIDENT_MIN never
are kept. An input reused by earlier calls is priced by its share of one upload once it recurs at a
site that passed it before (as residency.Reuse, D349).
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from ..plan import Call, Planner, WorkerState
from ..plan.model import REPRESENTATIVE
from .hardware import Device, Link, op_class

RESIDENT_MIN = 256 * 1024  # protocol.fingerprint's: smaller buffers are sent by value every time
REUSE_CAP = 3              # residency.Reuse's
STRATEGIES = ("local", "remote", "auto", "oracle")
NOISE_RUNS = 8             # noisy replays behind the band shown (seeds 1..NOISE_RUNS)


@dataclass
class Step:
    """One recorded call as the replay sees it."""
    index: int
    site: str
    op: str
    call: Call | None          # None: no planner view recorded (unsupported): always here
    local_s: float
    gap_s: float               # the program's own time before it (not intercepted)
    inputs: list[tuple[int, int]]   # (token, bytes)
    results: list[tuple[int, int]]
    scale: float               # calls of its site per call kept (the sample)
    decide_s: float = 0.0      # the shim's own time for a call it decides to compute here (D317)


@dataclass
class Outcome:
    where: list[str] = field(default_factory=list)   # "local" | "worker" per step
    seconds: list[float] = field(default_factory=list)
    up: int = 0
    down: int = 0
    reasons: list[str] = field(default_factory=list)

    def total(self, steps: list[Step]) -> float:
        return sum(s * st.scale for s, st in zip(self.seconds, steps))


BENCH_DTYPES = ("f4", "f8", "c8", "c16")  # the dtypes Device.bench times


def warm_key(call: Call) -> tuple[str, str]:
    return op_class(call.op, call.family), call.dtype


class WorkerSim:
    """What the modelled worker holds (LRU by bytes) and what this process has reused."""

    def __init__(self, capacity: float):
        self.held: OrderedDict[int, int] = OrderedDict()
        self.capacity = capacity
        self.seen: dict[int, int] = defaultdict(int)
        self.sites: dict[int, set[str]] = defaultdict(set)  # D349: the call sites that passed each input
        # (op class, dtype) the worker has run: its handles and workspaces exist. D291: its self-benchmark
        # ran every class in the dtypes it times, so a warm worker pays warm-up only outside them
        self.warm: set[tuple[str, str]] = {(cls, dt) for cls in ("gemm", "fft", "factor") for dt in BENCH_DTYPES}
        self.warm |= {("spectral", "f8")}

    def priced_up(self, step: Step) -> tuple[int, int]:
        """(input bytes the planner is told it would send, reused bytes): residency.Wired.to_send."""
        priced = reused = 0.0
        for tok, size in step.inputs:
            if size >= RESIDENT_MIN and tok in self.held:
                continue
            looped = step.site in self.sites.get(tok, ())
            share = 1.0 if size < RESIDENT_MIN or not looped else 1.0 / (min(self.seen[tok], REUSE_CAP) + 1)
            priced += size * share
            reused += size if share < 1.0 else 0
        return int(priced), int(reused)

    def up(self, step: Step) -> int:
        return sum(size for tok, size in step.inputs if not (size >= RESIDENT_MIN and tok in self.held))

    def note(self, step: Step) -> None:
        for tok, size in step.inputs:
            if size >= RESIDENT_MIN:
                self.seen[tok] += 1
                self.sites[tok].add(step.site)

    def ran(self, step: Step) -> None:
        if step.call is not None:
            self.warm.add(warm_key(step.call))
        for tok, size in (*step.inputs, *step.results):
            if size >= RESIDENT_MIN:
                self.held[tok] = size
                self.held.move_to_end(tok)
        while self.held and sum(self.held.values()) > self.capacity:
            self.held.popitem(last=False)


def steps_of(report: dict[str, Any]) -> tuple[list[Step], dict[str, Any]]:
    """The recorded calls, in order, each scaled by its site's calls over its kept ones (D238)."""
    records = [r for r in report.get("records") or [] if not str(r.get("op", "")).startswith("stage ")]
    if records and all(r.get("flops") is None for r in records):
        raise ValueError("this report was recorded before calls kept their work and sizes: "
                         "record it again with this version's --report")
    records.sort(key=lambda r: r.get("start_s") or 0.0)
    kept = defaultdict(int)
    for r in records:
        kept[(r.get("site"), r.get("op"))] += 1
    sites = report.get("sites") or {}
    rates = _local_rates(records)
    steps, unpriced, end = [], 0, 0.0
    for i, r in enumerate(records):
        local_s = _local_time(r, rates)
        if local_s is None:
            unpriced += 1
            continue
        call = None
        if r.get("flops") is not None and r.get("kind") != "unsupported":
            call = Call(r["op"], r["family"], r.get("cdtype") or "f8", float(r["flops"]), int(r.get("bytes_in") or 0),
                        int(r.get("bytes_out") or 0))
        total = (sites.get(f"{r.get('site')} {r.get('op')}") or {}).get("calls") or kept[(r.get("site"), r.get("op"))]
        start = r.get("start_s") or 0.0
        steps.append(Step(i, r.get("site", "?"), r["op"], call, local_s, max(start - end, 0.0),
                          _sized(r.get("inputs"), r.get("shapes"), r.get("dtypes")),
                          _results(r.get("results"), call), total / kept[(r.get("site"), r.get("op"))],
                          _decide_time(r)))
        end = start + (r.get("wall_s") or 0.0)
    smoothed = _smooth_local(steps)
    changed, aliased = _match_recorded_residency(steps, records)
    sample = {**(report.get("sample") or {}), "records": len(records), "unpriced": unpriced,
              "scaled_sites": sum(1 for s in steps if s.scale > 1.0), "local_smoothed": smoothed,
              "inputs_changed": changed, "inputs_aliased": aliased}
    return steps, sample


def _match_recorded_residency(steps: list[Step], records: list[dict]) -> tuple[int, int]:
    """D318: a buffer token names one live array, not its contents. An array written in place
    between two calls (``X /= s``) keeps its token, yet the recorded worker, which matches contents,
    was sent it again; a view (``H.T``) gets a token of its own, yet the worker held its contents.
    A recorded worker call's ``bytes_saved`` (the input bytes it found held) tells them apart: inputs
    already seen that it did not hold changed, and from then on carry a new token; an input never
    seen that it held anyway is the most recent seen buffer of its size, and takes that token. The
    replay then sends what the recorded run sent. Calls computed here say nothing of either.
    Returns (inputs changed, inputs matched to a held buffer)."""
    last: dict[int, int] = {}     # token seen -> its size, most recently used last
    version: dict[int, int] = {}  # recorded token -> the token of its current contents
    fresh, changed, aliased = -(1 << 40), 0, 0
    for st in steps:
        r = records[st.index]
        saved = r.get("bytes_saved") if r.get("kind") == "worker" else None
        inputs = [(version.get(tok, tok), size) for tok, size in st.inputs]
        if isinstance(saved, int):
            for i, (tok, size) in enumerate(inputs):
                if size >= RESIDENT_MIN and tok in last:
                    if size <= saved:
                        saved -= size  # held: the same contents
                    else:
                        fresh, changed = fresh - 1, changed + 1
                        version[st.inputs[i][0]] = fresh
                        inputs[i] = (fresh, size)
            mine = {tok for tok, _ in inputs}
            for i, (tok, size) in enumerate(inputs):
                if size >= RESIDENT_MIN and tok not in last and size <= saved:
                    same = [t for t, n in last.items() if n == size and t not in mine]
                    if same:
                        saved, aliased = saved - size, aliased + 1
                        version[st.inputs[i][0]] = same[-1]
                        inputs[i] = (same[-1], size)
        st.inputs = inputs
        for tok, size in (*st.inputs, *st.results):
            if size >= RESIDENT_MIN:
                last.pop(tok, None)
                last[tok] = size
    return changed, aliased


SMOOTH_MIN = 3  # calls of one site, op and size before their local times are taken as their median


def _smooth_local(steps: list[Step]) -> int:
    """D292: the local time of each call of a (site, op, work, bytes) group of at least SMOOTH_MIN
    calls is the group's median: the recording host's load spikes are no property of the program,
    and an oracle that kept them would move the calls they hit, which nothing can foresee.
    Returns how many calls changed."""
    groups: dict[tuple, list[Step]] = defaultdict(list)
    for st in steps:
        if st.call is not None:
            groups[(st.site, st.op, st.call.flops, st.call.bytes_in)].append(st)
    changed = 0
    for group in groups.values():
        if len(group) >= SMOOTH_MIN:
            mid = sorted(st.local_s for st in group)[len(group) // 2]
            for st in group:
                changed += st.local_s != mid
                st.local_s = mid
    return changed


def _sized(tokens: Any, shapes: Any, dtypes: Any) -> list[tuple[int, int]]:
    if not tokens or not shapes or len(tokens) != len(shapes):
        return [(-(1 + i), _nbytes(s, d)) for i, (s, d) in enumerate(zip(shapes or [], dtypes or []))]
    return [(int(t), _nbytes(s, d)) for t, s, d in zip(tokens, shapes, dtypes or [])]


def _results(tokens: Any, call: Call | None) -> list[tuple[int, int]]:
    if not tokens or call is None:
        return []
    return [(int(t), call.bytes_out // len(tokens)) for t in tokens]


def _nbytes(shape: Any, dtype: Any) -> int:
    try:
        size = int(str(dtype).lstrip("<>|=")[1:] or 8)
    except ValueError:
        size = 8
    return int(math.prod(shape)) * size


def _decide_time(r: dict) -> float:
    """D317: what a call decided here cost beyond computing it (fingerprinting its inputs, the
    decision, the record): a call recorded here, its wall less its phases; one recorded on the
    worker, its fingerprint, the part of that it also paid."""
    ph = r.get("phases") or {}
    if r.get("kind") == "local" and "local" in ph:
        other = sum(ph.get(k, 0.0) for k in ("local", "wait_ready", "link_probe", "verify"))
        return max((r.get("wall_s") or 0.0) - other, 0.0)
    return float(ph.get("fingerprint") or 0.0) if r.get("kind") == "worker" else 0.0


def _local_rates(records: list[dict]) -> dict[tuple, float]:
    """Measured local flop/s per (op, dtype): pricing calls the recorded run sent to its worker."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        s = (r.get("phases") or {}).get("local") or r.get("local_measured_s")
        if s and r.get("flops"):
            acc[(r["op"], r.get("cdtype"))].append(r["flops"] / s)
    return {k: sorted(v)[len(v) // 2] for k, v in acc.items()}


def _local_time(r: dict, rates: dict[tuple, float]) -> float | None:
    measured = (r.get("phases") or {}).get("local") or r.get("local_measured_s")
    if measured:
        return float(measured)
    rate = rates.get((r.get("op"), r.get("cdtype")))
    if rate and r.get("flops"):
        return r["flops"] / rate
    return r.get("predicted_local_s")


class Jitter:
    """Run-to-run noise: a lognormal factor on each kernel and each transfer (``Device.noise``,
    ``Link.noise``); seed None: none, the central figures."""

    def __init__(self, seed: int | None, dev: Device, link: Link):
        self.rng = random.Random(seed) if seed is not None else None
        self.dev, self.link = dev.noise, link.noise

    def kernel(self) -> float:
        return self.rng.lognormvariate(0.0, self.dev) if self.rng and self.dev else 1.0

    def transfer(self) -> float:
        return self.rng.lognormvariate(0.0, self.link) if self.rng and self.link else 1.0


NO_NOISE = Jitter(None, Device("none", {}, 1.0, 1.0, 0.0, 0.0), Link("none", 0.0, 1.0, 1.0, 0.0))


def remote_s(step: Step, dev: Device, link: Link, up: int, sim: WorkerSim | None = None,
             jitter: Jitter = NO_NOISE) -> tuple[float, float]:
    """(seconds from send to answer, the device's share); a class and dtype new to ``sim`` pays its warm-up."""
    c = step.call
    kernel = dev.compute_s(c.op, c.family, c.dtype, c.flops, c.bytes_in + c.bytes_out) * jitter.kernel()
    if sim is not None and warm_key(c) not in sim.warm:
        kernel += dev.first_call_s
    return link.transfer_s(up, c.bytes_out) * jitter.transfer() + kernel, kernel


def run_fixed(steps: list[Step], dev: Device, link: Link, where: str, cold: bool = False,
              jitter: Jitter = NO_NOISE) -> Outcome:
    """Every call here, or every call it can on the worker (a cold one waited for, as policy remote does)."""
    out, sim = Outcome(), WorkerSim(dev.memory / 2)
    clock, ready_at = 0.0, dev.cold_start_s if cold else 0.0
    for st in steps:
        clock += st.gap_s
        if where == "local" or st.call is None:
            seconds, place = st.local_s, "local"
        else:
            up = sim.up(st)
            seconds = remote_s(st, dev, link, up, sim, jitter)[0] + max(ready_at - clock, 0.0)
            place = "worker"
            sim.note(st)
            sim.ran(st)
            out.up += int(up * st.scale)
            out.down += int(st.call.bytes_out * st.scale)
        out.where.append(place)
        out.seconds.append(seconds)
        clock += seconds
    return out


def run_oracle(steps: list[Step], remote: Outcome) -> Outcome:
    """D241: each call at its faster place, the worker holding what it holds under all-remote (a bound:
    an upload all-remote paid once is free to a later call here)."""
    out = Outcome()
    for st, there, place in zip(steps, remote.seconds, remote.where):
        if place == "worker" and there < st.local_s:
            out.where.append("worker")
            out.seconds.append(there)
        else:
            out.where.append("local")
            out.seconds.append(st.local_s)
    return out


class RecordedCalibration:
    """D290: the calibration cache of the recording host, read off the recording: per (family, dtype),
    the measured local (flops, seconds) of the family's representative ops (the ops a calibration
    probe times), the median per size. What ``fusion-shim calibrate`` there would have given the
    planner; a (family, dtype) no such call measured has none, as on a host never calibrated."""

    MAX_POINTS = 6

    def __init__(self, steps: list[Step]):
        by: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for st in steps:
            c = st.call
            if c is not None and REPRESENTATIVE.get(c.op) == c.family and c.flops > 0 and st.local_s > 0:
                by[(c.family, c.dtype)][c.flops].append(st.local_s)
        self.points: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for key, sizes in by.items():
            pts = [(f, sorted(v)[len(v) // 2]) for f, v in sorted(sizes.items())]
            step = max(len(pts) // self.MAX_POINTS, 1)
            self.points[key] = sorted(set(pts[::step][:self.MAX_POINTS - 1] + [pts[-1]]))

    def get(self, family: str, dtype: str) -> list[tuple[float, float]] | None:
        return self.points.get((family, dtype))


def make_planner(ops: dict[str, str], calibration: RecordedCalibration | None = None) -> Planner:
    """The planner as the runtime makes it under auto for one worker, its calibration cache the
    recording host's (D290); D242: no background thread, so nothing in it reads a clock."""
    return Planner("auto", 1, ops=ops, inputs_may_be_resident=True, cache=calibration)  # type: ignore[arg-type]


def run_auto(steps: list[Step], dev: Device, link: Link, cold: bool = False,
             planner: Planner | None = None, on_decision: Callable[[Call, Any], None] | None = None,
             jitter: Jitter = NO_NOISE) -> Outcome:
    """The real planner driven through the calls on a simulated clock (see the module's docstring)."""
    ops = {st.call.op: st.call.family for st in steps if st.call is not None}
    planner = planner or make_planner(ops, RecordedCalibration(steps))
    ready_at = dev.cold_start_s if cold else 0.0
    clock, told = 0.0, False
    out, sim = Outcome(), WorkerSim(dev.memory / 2)
    for st in steps:
        clock += st.gap_s
        if not told and clock >= ready_at:
            planner.worker_ready(0, dev.bench(), *link.probe())
            told = True
        call = st.call
        if call is None or call.bytes_in < planner.floor_cells[call.op][0]:
            out.where.append("local")  # the interceptor's fast path: nothing decided, nothing learnt
            out.seconds.append(st.local_s)
            out.reasons.append("below the floor" if call is not None else "not offloadable")
            clock += st.local_s
            continue
        priced, reused = sim.priced_up(st)
        # D317: a worker on the recording host's CPUs is contended, as the runtime's link says of it
        state = WorkerState("ready" if told else "starting", bytes_in=priced, reused=reused,
                            contended=dev.shares_cpus)
        d = planner.decide(call, [state])
        sim.note(st)
        if on_decision is not None:
            on_decision(call, d)
        out.reasons.append(d.reason)
        if d.where == "worker":
            up = sim.up(st)
            seconds, kernel = remote_s(st, dev, link, up, sim, jitter)
            sim.ran(st)
            planner.observed_remote(0, call, d, seconds, kernel, up, call.bytes_out)
            out.up += int(up * st.scale)
            out.down += int(call.bytes_out * st.scale)
        else:
            planner.observed_local(call, d, st.local_s)
            seconds = st.local_s + st.decide_s
        out.where.append(d.where)
        out.seconds.append(seconds)
        clock += seconds
    return out


def compare(report: dict[str, Any], dev: Device, link: Link, cold: bool = False) -> dict[str, Any]:
    """The four strategies' SIMULATED totals, per site, what moves and the assumptions."""
    steps, sample = steps_of(report)
    runs = run_all(steps, dev, link, cold)
    intercepted = sum((r.get("wall_s") or 0.0) for r in report.get("records") or [])
    other_s = max((report.get("wall_s") or 0.0) - intercepted, 0.0)
    sites: dict[str, dict[str, Any]] = {}
    for i, st in enumerate(steps):
        s = sites.setdefault(f"{st.site} {st.op}", {"calls": 0, **{k: 0.0 for k in STRATEGIES}, "auto_worker": 0,
                                                      "oracle_worker": 0})
        s["calls"] += st.scale
        for k, run in runs.items():
            s[k] += run.seconds[i] * st.scale
        s["auto_worker"] += (runs["auto"].where[i] == "worker") * st.scale
        s["oracle_worker"] += (runs["oracle"].where[i] == "worker") * st.scale
    return {
        "label": "SIMULATED",
        "device": dev.name, "device_source": dev.source, "link": link.name, "link_source": link.source,
        "program": report.get("argv"), "recorded_policy": report.get("policy"),
        "totals_s": {k: run.total(steps) for k, run in runs.items()},
        "band_s": noise_band(steps, dev, link, cold),
        "break_even": break_even(steps, dev, link),
        "other_s": other_s,
        "wall_s": {k: other_s + run.total(steps) for k, run in runs.items()},
        "bytes": {k: {"up": run.up, "down": run.down} for k, run in runs.items() if k != "oracle"},
        "moved": {k: sum(st.scale for st, w in zip(steps, run.where) if w == "worker") for k, run in runs.items()},
        "calls": sum(st.scale for st in steps),
        "sites": sites,
        "auto_decisions": [{"site": st.site, "op": st.op, "where": w, "reason": why}
                           for st, w, why in zip(steps, runs["auto"].where, runs["auto"].reasons)][:200],
        "sample": sample,
        "assumptions": assumptions(dev, link, cold, report, sample),
    }


def run_all(steps: list[Step], dev: Device, link: Link, cold: bool = False,
            jitter: Jitter = NO_NOISE) -> dict[str, Outcome]:
    remote = run_fixed(steps, dev, link, "remote", cold, jitter)
    return {"local": run_fixed(steps, dev, link, "local"), "remote": remote,
            "auto": run_auto(steps, dev, link, cold, jitter=jitter), "oracle": run_oracle(steps, remote)}


def noise_band(steps: list[Step], dev: Device, link: Link, cold: bool = False,
               runs: int = NOISE_RUNS) -> dict[str, list[float]]:
    """[lowest, highest] total of each strategy over ``runs`` replays with run-to-run noise drawn."""
    if not (dev.noise or link.noise):
        return {}
    totals: dict[str, list[float]] = defaultdict(list)
    for seed in range(1, runs + 1):
        for k, run in run_all(steps, dev, link, cold, Jitter(seed, dev, link)).items():
            totals[k].append(run.total(steps))
    return {k: [min(v), max(v)] for k, v in totals.items()}


def break_even(steps: list[Step], dev: Device, link: Link) -> dict[str, dict[str, Any]]:
    """Per (op, dtype): the input size from which the modelled worker (a cold upload, the link, the
    kernel) beats this host, the op's largest recorded call scaled in each dimension (flops by the
    cube for products and decompositions, the square otherwise; bytes by the square); this host's time
    from the op's recorded (flops, seconds), log-log, held beyond them."""
    points: dict[tuple, list] = defaultdict(list)
    largest: dict[tuple, Call] = {}
    for st in steps:
        if st.call is None or st.local_s <= 0 or st.call.flops <= 0:
            continue
        key = (st.op, st.call.dtype)
        points[key].append((st.call.flops, st.local_s))
        if key not in largest or st.call.flops > largest[key].flops:
            largest[key] = st.call
    out = {}
    for (op, dtype), c in sorted(largest.items()):
        p = 2 if c.family == "fft" else 3
        found = None
        for i in range(-48, 49):  # 1/64x .. 64x in each dimension, 2^(1/8) apart
            f = 2.0 ** (i / 8)
            flops, b_in, b_out = c.flops * f ** p, c.bytes_in * f * f, c.bytes_out * f * f
            here = flops / _rate(points[(op, dtype)], flops)
            there = link.transfer_s(b_in, b_out) + dev.compute_s(op, c.family, dtype, flops, b_in + b_out)
            if there < here:
                found = (b_in, flops, i == -48)
                break
        key = f"{op}/{dtype}"
        if found is None:
            out[key] = {"bytes_in": None, "flops": None, "note": "not within 64x the largest recorded call"}
        else:
            out[key] = {"bytes_in": found[0], "flops": found[1],
                        "note": "at or below 1/64 the largest recorded call" if found[2] else ""}
    return out


def _rate(points: list, flops: float) -> float:
    pts = sorted((math.log(f), math.log(f / s)) for f, s in points)
    lx = math.log(flops)
    if lx <= pts[0][0]:
        return math.exp(pts[0][1])
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if lx <= x1 and x1 > x0:
            return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))
    return math.exp(max(y for _, y in pts))


def assumptions(dev: Device, link: Link, cold: bool, report: dict[str, Any],
                sample: dict[str, Any] | None = None) -> list[str]:
    sample = sample or {}
    below = sum((o.get("below_floor") or 0) for o in (report.get("ops") or {}).values())
    return [
        f"device {dev.name}: " + ("its measured self-benchmark curves" if dev.curves else
                                  "datasheet peaks x ASSUMED per-family efficiency curves (docs/replay.md)")
        + (f"; the ops its recorded calls ran, their kernels as measured ({len(dev.kernels)})" if dev.kernels else "")
        + ("; on the recording host's CPUs: decided as contended" if dev.shares_cpus else ""),
        f"link {link.name}: round trip {link.rtt_s * 1e6:.0f} us, {link.up_bps / 1e9:.3g}/{link.down_bps / 1e9:.3g} "
        f"GB/s up/down, {link.per_call_s * 1e6:.0f} us per call",
        "local times: as measured in the recorded run; calls it sent to its worker: the median measured local "
        "rate of their op, else the planner's prediction; each call of a site, op and size seen "
        f"{SMOOTH_MIN}+ times: their median ({sample.get('local_smoothed', 0)} calls changed)",
        "worker " + (f"cold: ready {dev.cold_start_s:.3g} s into the program (auto computes here until then)"
                     if cold else "warm from the start (--cold counts its start)"),
        "the worker keeps inputs and results from 256 KiB up, within half its memory, least recently used "
        "out first; identity by buffer address while the array lives, a new one where the recorded worker was "
        f"sent an input again ({sample.get('inputs_changed', 0)} changed in place), a held one where it held an "
        f"input never seen ({sample.get('inputs_aliased', 0)} views)",
        "a call auto keeps here also pays the shim's own time the recorded call took beyond computing",
        f"calls the recorded run kept under its size floor ({below}) are not replayed (they stay here)",
        "the program's own time between calls is as recorded; no overlap of calls",
        f"the first call of an op class and dtype the worker's self-benchmark did not run adds "
        f"{dev.first_call_s:.3g} s (handles, workspaces)",
        (f"noise band: {NOISE_RUNS} replays, each kernel x lognormal({dev.noise:.2g}) and each transfer x "
         f"lognormal({link.noise:.2g}); the totals shown are without noise" if dev.noise or link.noise else
         "no run-to-run noise modelled for this device and link"),
        "break-even: the op's largest recorded call scaled in each dimension, a cold upload each time",
    ]

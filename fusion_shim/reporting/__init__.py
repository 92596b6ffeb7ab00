"""The end-of-run report: a summary on stderr, JSON with ``--report PATH``, a Chrome-trace timeline
with ``--trace PATH`` (:mod:`fusion_shim.reporting.trace`), and re-pricing of a saved run under another
link or device (:mod:`fusion_shim.reporting.whatif`).

JSON schema ``fusion_shim.report/1`` (a map):

- ``schema``: ``"fusion_shim.report/1"``; ``pid``; ``argv``; ``policy``; ``verify`` (the fraction of
  worker answers checked); ``wall_s`` (seconds from install to the report; a notebook cell's: the cell's own);
- ``worker``: ``url``, ``embedded``, ``state``, ``ready_after_s`` (null if never), ``restarts``,
  ``info`` (the worker's ``ready`` reply: pid, device, torch version, self-benchmark in GFLOP/s);
  ``cpu_start`` where an embedded worker was deferred on a host without a GPU: why it did not
  start, or on what evidence it did (D40);
- ``ops``: per op: ``family``, ``calls`` (recorded calls), ``worker``, ``local`` (decided local),
  ``unsupported`` (arguments the row cannot offload), ``fallback`` (meant for the worker, computed
  here after a fault or while it was not ready), ``raised`` (NumPy raised the program's own
  error here, e.g. LinAlgError: raised as NumPy raises it, never a fallback), ``below_floor`` (kept
  local by the size floor, counted only), ``no_worker`` (under auto, made before any worker was
  ready: computed here at one comparison each, counted only, not ``below_floor``; D281), ``repeated`` (worker calls sent from the template of an earlier call with the
  same layout, D45), ``verified`` and ``mismatches`` (checked answers), ``bytes_sent`` and
  ``bytes_received`` (counted at the socket, headers included), ``shm_sent`` and ``shm_received``
  (buffer bytes that went through shared memory instead), ``resident_hits``, ``bytes_saved``,
  ``resends``, ``evictions`` (residency), ``wall_s``, ``phases`` (seconds per
  phase, see ``ledger.PHASES``; ``verify`` is the checks' own time, outside ``wall_s``), ``reasons``
  (``"KIND: text"`` -> calls: each distinct reason, the details), ``fallbacks_by_kind`` (D324: its
  ``fallback`` calls by ``errors.FallbackKind`` value, ``"unclassified"`` for one without; absent in
  older reports);
- ``operators``: ``intercepted`` (bool: whether ``a @ b``, ``a @= b`` and ``a.dot(b)`` on ndarrays go
  through the shim; their ops are ``numpy.ndarray.__matmul__``, ``__imatmul__``, ``dot``), ``why``
  (the reason they are not: no C extension, ``FUSION_SHIM_NATIVE=0``, policy local, or an unexpected
  NumPy), ``fast_path`` (``"C"`` or ``"wrapt"``: where the floor check of wrapped functions runs);
- ``sites``: per call site and op (``"file:line op"``: one line may call several): ``site``, ``op``,
  ``calls``, ``wall_s``, ``worker``, ``verify_s``;
- ``summary``: what the table shows, computed (see :func:`summarize`); ``fallbacks_by_kind`` the ops'
  summed (D324); its ``vs_plain`` is the
  run against running plainly, every part the shim added, measured or ESTIMATED
  (:mod:`fusion_shim.reporting.bottom`, D120), ``bottom_line`` the same in plain words;
- ``events``: worker lifecycle and pins, ``{"t_s", "what"}``;
- ``startup``: seconds the shim spent starting, per phase: ``bootstrap`` (the ``.pth`` hook),
  ``launcher`` (``python -m fusion_shim`` up to the program), ``interception`` (at NumPy's import:
  the runtime, the catalog, the wrappers), and each part made on first need (``planner``, ``call
  path``, ``worker links``), wherever that happened (a call, a worker's start, the background);
- ``planner`` (policies auto and remote, once the run needed its planner): ``explored_calls``, ``explore_spent_s`` (what they
  cost over the prediction for the place not taken), ``explorations_abandoned`` (explorations on a
  worker that ran out of their deadline and were computed here), ``intercepted_s``,
  ``explore_fraction`` (the budget), ``model_resets``, ``floors_bytes`` (per op: input bytes below which it stays on the fast
  path), ``floors_raised_bytes`` (the ops whose floor was raised by calls that could not win, and
  to what) and ``floor_raises``, ``calibration`` (per family/dtype: "cache" or "measured"),
  ``workers`` (url, state, measured link: ``rtt_s``, ``up_bytes_per_s``, ``down_bytes_per_s``;
  ``speed_vs_benchmark``: its real calls' speed over what its self-benchmark said, from the first
  call of ``speed_vs_benchmark_calls`` ops and sizes, which every prediction off its curves follows);
- ``pool`` (a run with ``--pool``, :mod:`.pool`): its ``url`` and ``workers``, each with its
  ``name``, ``node``, ``device`` (``gpu_emulated``: a GPU Ray accounts for, no CUDA device behind
  it), ``url``, ``state``, ``calls``, ``bytes_sent``, ``bytes_received``, ``resident_bytes``,
  ``restarts`` (by Ray) and ``calls_since_restart``;
- ``records``: one map per call (``ledger.Record``; ``fallback``: a fallback's kind, D323): at most
  ``ledger.MAX_PER_SITE`` per site and ``ledger.MAX_RECORDS`` in all; ``records_dropped`` counts the
  rest (they are in the aggregates).
"""
from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence, TextIO

# Imported at exit (intercept): nothing loaded here may run exec() or eval() on source text (a
# dataclass, a namedtuple, statistics), which would make CPython exit with status 1 after an
# unhandled Ctrl-C instead of by SIGINT. config and ledger, plain classes (D36), are loaded by then.
from ..config import Config
from ..ledger import PHASES, Ledger
from .bottom import added_time, detail, machine_wait_s, plain_words, worker_cpu_s
from .layout import bottom_words

if TYPE_CHECKING:  # D123: the views are for the checker; a Protocol class costs its making at exit
    from typing import Protocol

    from ..plan import Planner

    class WorkerView(Protocol):
        """What the report reads of one worker link (client.link.WorkerLink)."""
        url: str | None
        embedded: bool
        state: str
        ready_after_s: float | None
        restarts: int
        info: dict[str, Any]
        index: int
        pool: dict[str, Any] | None  # a pool worker's name, node, device (report.pool reads these four too)
        calls: int
        calls_since_restart: int
        bytes_sent: int
        bytes_received: int

        def not_ready_why(self) -> str | None:
            """Why the worker is not ready now (None: it is)."""

    class StartsView(Protocol):
        """What the report reads of when the workers start (client.starts.WorkerStarts)."""
        deferred: bool  # the start waits on evidence (no GPU here): before it starts, it may have no link
        pool: Any  # pool.locate.Pool, once opened (its ``ray``: what Ray cost)

        def deferred_why(self) -> str | None:
            """Why a deferred embedded worker has not started, or on what evidence it did (None: never deferred)."""

        def pool_opening(self) -> str | None:
            """D302: why the pool was not opened, or on what evidence it was (None: not deferred)."""

    class RunView(Protocol):
        """What the report reads of a run (client.runtime.Runtime); it reads only what the run made."""
        config: Config
        ledger: Ledger
        operators: dict[str, Any]
        starts: StartsView

        def made_links(self) -> Sequence[WorkerView]:
            """The worker links made so far."""

        def made_planner(self) -> "Planner | None":
            """The planner, if the run has needed it."""

        def worker_drift(self, index: int) -> tuple[float, int]:
            """(log of the worker's measured speed over its self-benchmark, calls behind it)."""


SCHEMA = "fusion_shim.report/1"
WORKER_PHASES = ("fingerprint", "encode", "send", "transfer", "h2d", "kernel", "d2h", "decode")


def build(rt: RunView, ledger: Ledger | None = None) -> dict[str, Any]:
    """The report of ``rt``, from its ledger or from ``ledger`` (a notebook cell's share of it)."""
    snap = (ledger or rt.ledger).snapshot()
    links = rt.made_links()
    link = links[0] if links else None
    worker = None if link is None else {
        "url": link.url, "embedded": link.embedded, "state": link.state,
        "ready_after_s": link.ready_after_s, "restarts": link.restarts, "info": link.info,
        "not_ready": link.not_ready_why(),  # D286: where a worker that is not ready is in its start
    }
    if link is None and rt.starts.deferred and not rt.config.pool:
        worker = _deferred_worker()
    why = rt.starts.deferred_why()
    if worker is not None and why is not None:
        worker["cpu_start"] = why
    if worker is not None and worker.get("embedded"):  # D276: its load on this host, evidence for vs_plain
        worker["cpu_s"] = worker_cpu_s(worker)
    report = {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "policy": rt.config.policy,
        "verify": rt.config.verify,
        "wall_s": (ledger or rt.ledger).now(),  # a cell's share: the cell's own time
        "machine_wait_s": machine_wait_s(),  # D278
        "operators": dict(rt.operators),
        "worker": worker,
        **snap,
    }
    planner = rt.made_planner()
    if planner is not None and rt.config.policy != "local":
        report["planner"] = planner_section(rt)
    if rt.config.pool:  # D118: the pool's and the stages' modules load only for a run that has them
        from .pool import pool_section

        report["pool"] = pool_section(rt.config.pool, links, rt.starts.pool, rt.starts.pool_opening)
    if "fusion_shim.stages" in sys.modules:  # a stage's records come from that package alone
        from .stages import stages_section

        stages = stages_section(rt, report["records"])
        if stages is not None:
            report["stages"] = stages
    report["summary"] = summarize(report)
    return report


def _deferred_worker() -> dict[str, Any]:
    """The embedded worker that has not started (D40), before its link is made."""
    return {"url": None, "embedded": True, "state": "deferred", "ready_after_s": None, "restarts": 0, "info": {}}


def planner_section(rt: RunView) -> dict[str, Any]:
    """What the decision engine did: exploration and its cost, model resets, the floors,
    every worker with its measured link."""
    p = rt.made_planner()
    return {
        "explored_calls": p.explored, "explore_spent_s": p.explore_spent_s, "intercepted_s": p.intercepted_s,
        "explorations_abandoned": p.explorations_abandoned,
        "explore_fraction": p.explore_fraction,
        "model_resets": p.profile.local.resets + sum(w.device.resets + w.link.resets for w in p.profile.workers),
        "floors_bytes": {op: cell[0] for op, cell in sorted(p.floor_cells.items())},
        "floors_raised_bytes": dict(sorted(p.raised.items())), "floor_raises": p.raises,
        "calibration": {f"{f}/{d}": src for (f, d), src in p.curves_from.items()},
        "workers": [_worker_entry(rt, link) for link in rt.made_links()],
    }


def _worker_entry(rt: RunView, link: WorkerView) -> dict[str, Any]:
    drift, calls = rt.worker_drift(link.index)
    return {"url": link.url, "state": link.state, "link": link.info.get("link"),
            "speed_vs_benchmark": math.exp(drift), "speed_vs_benchmark_calls": calls}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The numbers under the table: time by place and by phase, bytes, checks, what the shim added
    against running plainly (D120), prediction error. Worker and local times exclude the checks' time."""
    ops, records = report["ops"], report["records"]
    by_phase = {p: sum(o["phases"].get(p, 0.0) for o in ops.values()) for p in (*PHASES, "verify")}
    added = added_time(records, by_phase, report.get("startup") or {}, report.get("wall_s"), report.get("sites"),
                       report.get("worker"), report.get("machine_wait_s"))
    considered = sum(o["calls"] + o.get("below_floor", 0) + o.get("no_worker", 0) for o in ops.values())
    offloaded = sum(o["worker"] for o in ops.values())
    return {
        "time_on_worker_path_s": sum(by_phase[p] for p in WORKER_PHASES),
        "time_computed_here_s": by_phase["local"],
        "time_waiting_for_cold_worker_s": by_phase["wait_ready"],
        "time_checking_s": by_phase["verify"],
        "time_by_phase_s": by_phase,
        "calls": {k: sum(o.get(k, 0) for o in ops.values())
                  for k in ("worker", "local", "unsupported", "fallback", "raised", "below_floor", "no_worker",
                            "verified", "mismatches", "repeated")},
        "fallbacks_by_kind": fallbacks_by_kind(ops),
        "residency": {k: sum(o.get(k, 0) for o in ops.values())
                      for k in ("resident_hits", "bytes_saved", "resends", "evictions")},
        "bytes_sent": sum(o["bytes_sent"] for o in ops.values()),
        "bytes_received": sum(o["bytes_received"] for o in ops.values()),
        "shm_sent": sum(o.get("shm_sent", 0) for o in ops.values()),
        "shm_received": sum(o.get("shm_received", 0) for o in ops.values()),
        "vs_plain": added,  # D120, D276: everything the shim added, by part, and the interval it lies in
        "bottom_line": bottom_words(plain_words(offloaded, considered, added, report["policy"]), report.get("worker")),
        "prediction_error": prediction_error(records),
        "top_sites": sorted(({"site": k.rpartition(" ")[0], **v} for k, v in report.get("sites", {}).items()),
                            key=lambda s: -s["wall_s"])[:8],
    }


def fallbacks_by_kind(ops: dict[str, Any]) -> dict[str, int]:
    """D324: the run's fallbacks by kind, the commonest first (a report older than the kinds: none)."""
    total: dict[str, int] = {}
    for o in ops.values():
        for kind, count in (o.get("fallbacks_by_kind") or {}).items():
            total[kind] = total.get(kind, 0) + count
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def prediction_error(records: list[dict]) -> dict[str, dict[str, float]]:
    """Median |log(predicted / actual)| per family and place, over the calls that had a prediction."""
    errors: dict[str, list[float]] = {}
    for r in records:
        if r["kind"] == "worker" and r.get("predicted_remote_s") and r["wall_s"] > 0:
            errors.setdefault(f"{r['family']}/worker", []).append(abs(math.log(r["predicted_remote_s"] / r["wall_s"])))
        local = r["phases"].get("local")
        if r["kind"] == "local" and r.get("predicted_local_s") and local:
            errors.setdefault(f"{r['family']}/local", []).append(abs(math.log(r["predicted_local_s"] / local)))
    return {k: {"median_abs_log_ratio": _median(v), "calls": len(v)} for k, v in sorted(errors.items())}


def _median(xs: list[float]) -> float:
    """statistics.median's value (statistics itself builds namedtuples at import: see above)."""
    s, mid = sorted(xs), len(xs) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def write_json(report: dict[str, Any], path: str) -> None:
    import json  # here: the report is built at exit, and written only with --report

    _replace_with(path, lambda f: json.dump(report, f, indent=1, default=str))


def _replace_with(path: str, dump: Any) -> None:
    """``dump(file)`` into a temporary beside ``path``, then renamed over it; no temporary left on failure."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            dump(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}MB" if n else "-"


def _ms(s: float | None) -> str:
    if not s:
        return "-"
    return f"{s * 1e3:.1f}ms" if s < 10 else f"{s:.1f}s"


def format_table(report: dict[str, Any], full: bool = False) -> str:
    """The summary printed at exit, in 100 columns (:mod:`.layout`, D280); ``full``: who ran where,
    the wide per-op table, the totals, the planner, every event and the floors."""
    sm = report.get("summary")
    if not sm or "vs_plain" not in sm:  # a report saved before D120
        sm = summarize(report)
    if not full:
        from .layout import compact

        return compact(report, sm)
    lines = [_title(report)]
    if report["ops"]:
        lines.append(f"  {bottom_words(sm['bottom_line'], report.get('worker'))}")
    if report.get("startup"):
        lines.append(_startup_line(report["startup"]))
    operators = report.get("operators") or {}
    if operators and not operators.get("intercepted"):
        lines.append(f"  operators @, @=, .dot: not intercepted ({operators.get('why')}), not counted")
    if report["policy"] == "local" and report["ops"]:
        lines.append("  policy local: every call computed here, counted under <floor (what auto or remote "
                     "would consider)")
    ops = report["ops"]
    if not ops:
        lines.append("  no intercepted calls")
        lines += _pool_lines(report.get("pool"), report["events"])
        return "\n".join(lines)
    w = report.get("worker")
    if any(o.get("no_worker") for o in ops.values()):  # D281: every floor is NEVER until a worker is ready
        lines.append("  calls made while no worker was ready ran here at one comparison each (no-wkr)")
    checks = any(o.get("verified") for o in ops.values())
    lines += _op_table(ops, checks)
    lines += _totals(sm, checks, w is not None and w.get("ready_after_s") is not None)
    lines += _planner_lines(report.get("planner"))
    lines += _pool_lines(report.get("pool"), report["events"])
    lines += _stage_lines(report.get("stages"))
    lines += _sites_and_reasons(sm, ops)
    if w is not None and w.get("cpu_start"):
        lines.append(f"  embedded worker (no GPU on this host) {w['cpu_start']}")
    lines += _event_lines(report["events"], None)
    from .layout import floor_lines

    lines += floor_lines(report.get("planner"))
    return "\n".join(lines)


def _pool_lines(section: dict[str, Any] | None, events: list[dict]) -> list[str]:
    if not section:  # D118: report.pool loads for a run with a pool alone
        return []
    from .pool import pool_lines

    return pool_lines(section, events)


def _stage_lines(section: dict[str, Any] | None) -> list[str]:
    if not section:  # D118: report.stages loads for a run that called a stage alone
        return []
    from .stages import stage_lines

    return stage_lines(section)


EVENTS_OF_A_KIND = 3  # the table shows this many events of one kind; the JSON keeps them all


def _event_lines(events: list[dict], limit: int | None = EVENTS_OF_A_KIND) -> list[str]:
    """The events in order, but at most ``limit`` of a kind (same text but for its numbers): the
    rest of a kind counted on one line after its last shown; ``limit`` None: every event."""
    from .layout import events as event_lines

    return event_lines(events, limit, fit=False)


STARTUP_AT_START = ("bootstrap", "launcher", "interception")  # before or at NumPy's import; the rest on first need


def _startup_line(startup: dict[str, float]) -> str:
    """The shim's own start-up, apart from every call: what ran at start, what on first need."""
    first = [f"{p} {_ms(startup[p])}" for p in STARTUP_AT_START if startup.get(p)]
    later = [f"{p} {_ms(s)}" for p, s in startup.items() if p not in STARTUP_AT_START and s]
    parts = ", ".join(first) + (f"; on first need: {', '.join(later)}" if later else "")
    return f"  shim start-up: {_ms(sum(startup.values()))} ({parts})"


def _title(report: dict[str, Any]) -> str:
    w = report.get("worker")
    if w is None:
        where = "no worker"
    else:
        info = w.get("info") or {}
        ready = (f"ready after {w['ready_after_s']:.2f}s" if w.get("ready_after_s") is not None
                 else f"never ready ({w.get('state')}" + (f": {w['not_ready']}" if w.get("not_ready") else "") + ")")
        where = f"worker {w['url']} ({info.get('device', '?')}, {ready})"
        if w.get("state") == "deferred":
            where = "embedded worker deferred (no GPU on this host)"
    return (f"fusion_shim report · pid {report['pid']} · policy {report['policy']} · {where} · "
            f"wall {report['wall_s']:.2f}s")


def _op_table(ops: dict[str, Any], checks: bool) -> list[str]:
    """One row per op: its calls by outcome, its bytes and its time per phase (phases seen only)."""
    phases = [p for p in PHASES if any(o["phases"].get(p) for o in ops.values())]
    head = ["op", "calls", "worker", "local", "unsup", "fallbk", "raised", "<floor", "no-wkr", *(["checked"] if checks else []),
            "sent", "recv", *phases]
    rows = []
    for name, o in ops.items():
        # calls: every intercepted one, those the size floor kept here included; sent/recv: bytes
        # moved, through the socket or shared memory
        rows.append([name.removeprefix("numpy."), str(o["calls"] + o.get("below_floor", 0) + o.get("no_worker", 0)),
                     str(o["worker"]), str(o["local"]), str(o["unsupported"]), str(o["fallback"]),
                     str(o.get("raised", 0)), str(o.get("below_floor", 0)), str(o.get("no_worker", 0)),
                     *([f"{o.get('verified', 0)}/{o.get('mismatches', 0)}!" if o.get("mismatches")
                        else str(o.get("verified", 0))] if checks else []),
                     _mb(o["bytes_sent"] + o.get("shm_sent", 0)), _mb(o["bytes_received"] + o.get("shm_received", 0)),
                     *(_ms(o["phases"].get(p)) for p in phases)])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]

    def fmt(r: list[str]) -> str:
        return "  " + "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))

    return [fmt(head), *(fmt(r) for r in rows)]


def _totals(sm: dict[str, Any], checks: bool, warmed: bool = True) -> list[str]:
    """Time by place, bytes by lane, residency, checks and the estimate against all-local; the wait
    is for a cold worker where one became ready (``warmed``), else for a worker never ready."""
    c = sm["calls"]
    repeated = f", {c['repeated']} sent from an earlier call's template" if c.get("repeated") else ""
    lines = [f"  time in intercepted calls: worker path {_ms(sm['time_on_worker_path_s'])} ({c['worker']} calls"
             f"{repeated}), "
             f"computed here {_ms(sm['time_computed_here_s'])} "
             f"({c['local'] + c['unsupported'] + c['fallback'] + c.get('raised', 0)} calls, "
             f"{c['below_floor']} more below the floor, {c.get('no_worker', 0)} with no worker ready)",
             f"  waiting for {'a cold worker' if warmed else 'a worker never ready'}: "
             f"{_ms(sm['time_waiting_for_cold_worker_s'])}",
             f"  bytes moved: sent {_mb(sm['bytes_sent'])}, received {_mb(sm['bytes_received'])}"]
    if sm.get("shm_sent") or sm.get("shm_received"):  # the same-host lane
        lines.append(f"  through shared memory: sent {_mb(sm['shm_sent'])}, received {_mb(sm['shm_received'])}")
    res = sm.get("residency") or {}
    if res.get("resident_hits") or res.get("resends") or res.get("evictions"):
        lines.append(f"  resident on the worker: {res['resident_hits']} inputs sent by reference "
                     f"({_mb(res['bytes_saved'])} not moved), {res['resends']} resent, "
                     f"{res['evictions']} evicted")
    if checks:
        lines.append(f"  checked: {c['verified']} answers ({c['mismatches']} mismatches), "
                     f"{_ms(sm['time_checking_s'])} of local recompute kept out of the totals above")
    lines.append(detail(sm["vs_plain"]))
    return lines


def _planner_lines(pl: dict[str, Any] | None) -> list[str]:
    """Exploration and its cost, model resets, and each worker whose calls left its benchmark behind."""
    lines = []
    if pl and (pl["explored_calls"] or pl["model_resets"]):
        share = pl["explore_spent_s"] / pl["intercepted_s"] if pl["intercepted_s"] else 0.0
        lines.append(f"  planner: {pl['explored_calls']} calls explored the place predicted slower, costing "
                     f"{_ms(pl['explore_spent_s'])} ({share:.1%} of intercepted time"
                     + (f"; {pl['explorations_abandoned']} abandoned at their deadline and computed here"
                        if pl.get("explorations_abandoned") else "")
                     + f"); {pl['model_resets']} model resets")
    for w in (pl or {}).get("workers", []):
        if w.get("speed_vs_benchmark_calls") and abs(math.log(w["speed_vs_benchmark"])) > math.log(1.25):
            lines.append(f"  worker {w['url']}: its calls ran at {w['speed_vs_benchmark']:.2g}x the speed of its "
                         f"self-benchmark (first calls of {w['speed_vs_benchmark_calls']} ops and sizes)")
    return lines


def _sites_and_reasons(sm: dict[str, Any], ops: dict[str, Any]) -> list[str]:
    """Prediction error, the costliest call sites, and the commonest reasons a call ran here."""
    lines = []
    if sm["prediction_error"]:
        lines.append("  prediction error, median |log(predicted/actual)|: " + ", ".join(
            f"{k} {v['median_abs_log_ratio']:.2f} (n={v['calls']})" for k, v in sm["prediction_error"].items()))
    if sm["top_sites"]:
        lines.append("  top call sites by time:")
        for s in sm["top_sites"][:5]:
            lines.append(f"    {_ms(s['wall_s']):>9}  {s['calls']:>5} calls ({s['worker']} on the worker)  "
                         f"{s['op'].removeprefix('numpy.')}  {s['site']}")
    reasons = [(n, r, k) for n, o in ops.items() for r, k in o["reasons"].items()]
    by_kind = fallbacks_by_kind(ops)
    if by_kind:
        lines.append("  fallbacks by kind: " + ", ".join(f"{kind} {count}" for kind, count in by_kind.items()))
    if reasons:
        lines.append("  ran here instead of on the worker:")
        for name, reason, count in sorted(reasons, key=lambda x: -x[2])[:12]:
            lines.append(f"    {name.removeprefix('numpy.')} x{count}: {reason}")
    return lines


def at_exit(rt: RunView, stream: TextIO | None = None) -> None:
    """Write the report's files, then the table on stderr; D188: a file that cannot be written is named
    with its reason after the table, which then appears even under ``quiet``."""
    report = build(rt)
    failed = []
    if rt.config.report:
        failed += _written(write_json, report, rt.config.report, "report")
    if rt.config.trace:
        from .trace import write_trace

        failed += _written(write_trace, report, rt.config.trace, "trace")
    operators = report["operators"]
    # a program that only uses `@` must still learn that it was not intercepted
    unexpected = not operators["intercepted"] and operators["why"] not in ("policy local", "FUSION_SHIM_NATIVE=0")
    out = stream or sys.stderr
    if failed or (not rt.config.quiet and (report["ops"] or rt.config.report or unexpected)):
        print(format_table(report), file=out)
    for line in failed:
        print(line, file=out)


def _written(write: Any, report: dict[str, Any], path: str, what: str) -> list[str]:
    """``write(report, path)``; nothing, or the line that says why the file is missing."""
    try:
        write(report, path)
    except OSError as exc:
        return [f"fusion_shim: {what} not written to {os.path.abspath(path)}: {exc.strerror or exc}"]
    return []


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        import json

        report = json.load(f)
    if report.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} file (schema {report.get('schema')!r})")
    return report


def render(path: str) -> str:
    return format_table(load(path))

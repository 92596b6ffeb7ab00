"""The report's bottom line (D120, D275): the run against running plainly, counting everything the
shim added to the program's time, as a point and an interval built from this run's measurements.

Added time, in seconds (positive: the shim made the run slower):

- ``waiting_for_worker_s`` (measured): calls held for a cold worker (``wait_ready``);
- ``calls_run_here_s`` (measured): what calls computed here spent besides NumPy's own time (the
  decision, hashing, link probes, an exploration abandoned at its deadline, the slow path);
- ``worker_calls_s``: each worker call's time (its wait apart) less NumPy's price for it: measured
  where a check ran NumPy (``local_measured_s``), else ESTIMATED from the planner's prediction;
- ``checks_s`` (measured): the sampled checks' local recompute;
- ``startup_s`` (measured): the shim's own start-up.

The interval (``low_s``, ``high_s``, D276): a measured part is exact; a prediction is priced with
the local model's error measured in this run (calls of its family, else of any family, that also
ran NumPy here), the median ratio as the point and the extreme ratios as the bounds; a prediction
whose model was never measured, and a call without one, may have cost NumPy anything from nothing
up; a same-host embedded worker's CPU time may have slowed the program's own computation by up to
that much (its ``cpu_s``). The interval is then widened both ways by the time this run waited
for a CPU (D278): the machine's load moves a plain run as much; the verdict is the shim's alone. No saving beyond the run's own wall time is ever claimed (D277). Records
are a sample (D238): each kept call stands for its site's calls of its kind.
Imported at exit: nothing here may exec() source text (see ``report/__init__``).
"""
from __future__ import annotations

import math
import os
from typing import Any

NOT_COUNTED = ("below-floor calls (one comparison each)",
               "the interpreter's start and exit around the shim",
               # D322: these run after the figures are taken, so they cannot be in them
               "making and writing this report, and stopping the worker after it")
PARTS = {  # key: what the plain-words line calls it when it is the largest cost
    "waiting_for_worker_s": "waiting {s} for the worker to warm",
    "calls_run_here_s": "{s} deciding and preparing calls that then ran here",
    "worker_calls_s": "{s} in the worker's calls over NumPy's time for them",
    "checks_s": "{s} checking the worker's answers",
    "startup_s": "{s} of the shim's own start-up",
}
MIN_ERROR_SAMPLES = 3  # D276: fewer ratios than this say nothing of a model's spread
AS_FAST_S = 0.1        # an interval within this of zero either way: "about as fast"


def model_error(records: list[dict]) -> dict[str, list[float]]:
    """log(NumPy's measured time / the local model's prediction), per family and pooled under ``*``,
    over the calls that had both: calls run here, and worker calls a check also ran here."""
    out: dict[str, list[float]] = {}
    for r in records:
        pred = r.get("predicted_local_s")
        actual = r.get("local_measured_s") if r["kind"] == "worker" else r["phases"].get("local")
        if pred and actual and pred > 0 and actual > 0:
            x = math.log(actual / pred)
            out.setdefault(r.get("family", "?"), []).append(x)
            out.setdefault("*", []).append(x)
    return out


def _weights(records: list[dict], sites: dict[str, dict] | None) -> list[float]:
    """How many calls each kept record stands for: its site's calls of its kind over those kept (D238)."""
    if not sites:
        return [1.0] * len(records)
    kept: dict[tuple[str, bool], int] = {}
    for r in records:
        key = (f"{r.get('site')} {r.get('op')}", r["kind"] == "worker")
        kept[key] = kept.get(key, 0) + 1
    out = []
    for r in records:
        key = (f"{r.get('site')} {r.get('op')}", r["kind"] == "worker")
        site = sites.get(key[0])
        if site is None:
            out.append(1.0)
            continue
        total = site["worker"] if key[1] else site["calls"] - site["worker"]
        out.append(max(total, kept[key]) / kept[key])
    return out


def added_time(records: list[dict], by_phase: dict[str, float], startup: dict[str, float],
               wall_s: float | None = None, sites: dict[str, dict] | None = None,
               worker: dict | None = None, machine_wait_s: float | None = None) -> dict[str, Any]:
    """What the shim added to the run, by part, with the measured and estimated totals, and the
    interval the evidence allows (D276), widened by the time this run waited for a CPU (D278), no
    saving beyond ``wall_s`` (D277)."""
    errors = model_error(records)
    # D276: (smallest, median, largest) log ratio of NumPy's time to the prediction, per family
    spread = {f: (min(v), _median(v), max(v), len(v)) for f, v in errors.items() if len(v) >= MIN_ERROR_SAMPLES}
    here_s = worker_measured = worker_estimated = 0.0
    low = high = no_price = 0.0  # the worker calls' share of the interval; no_price: each priced at 0
    unbounded_below = False
    n_measured = n_estimated = n_unpriced = n_unmodelled = 0
    used: dict[str, dict[str, float]] = {}
    for r, w in zip(records, _weights(records, sites)):
        if r["kind"] != "worker":
            here_s += w * (r["wall_s"] - r["phases"].get("local", 0.0) - r["phases"].get("wait_ready", 0.0))
            continue
        spent = r["wall_s"] - r["phases"].get("wait_ready", 0.0)
        pred = r.get("predicted_local_s")
        if r.get("local_measured_s") is not None:
            d = w * (spent - r["local_measured_s"])
            worker_measured += d
            low += d
            high += d
            no_price += d
            n_measured += 1
            continue
        no_price += w * spent
        fam = r.get("family", "?")
        err = spread.get(fam) or spread.get("*")
        if pred and err is not None:
            lo, mid, hi, n = err
            worker_estimated += w * (spent - pred * math.exp(mid))
            low += w * (spent - pred * math.exp(hi))
            high += w * (spent - pred * math.exp(lo))
            used[fam if fam in spread else "*"] = {"calls": n, "low": math.exp(lo), "median": math.exp(mid),
                                                   "high": math.exp(hi)}
            n_estimated += 1
        elif pred:  # the model's error never measured: NumPy may have taken anything from 0 up
            worker_estimated += w * (spent - pred)
            unbounded_below = True
            high += w * spent
            n_estimated += 1
            n_unmodelled += 1
        else:
            unbounded_below = True
            high += w * spent
            n_unpriced += 1
    parts = {
        "waiting_for_worker_s": by_phase.get("wait_ready", 0.0),
        "calls_run_here_s": here_s,
        "worker_calls_s": worker_measured + worker_estimated,
        "checks_s": by_phase.get("verify", 0.0),
        "startup_s": sum(startup.values()),
    }
    total = sum(parts.values())
    fixed = total - parts["worker_calls_s"]
    load = same_host_load_s(worker, wall_s, by_phase, startup, records, parts)
    shim_low, shim_high = (-math.inf if unbounded_below else fixed + low), fixed + high + load
    wait = max(0.0, min(machine_wait_s or 0.0, wall_s if wall_s is not None else math.inf))
    low_s, high_s = shim_low - wait, shim_high + wait  # D278: a plain run on this machine now may differ as much
    capped = wall_s is not None and low_s < -wall_s
    if capped:
        low_s = -wall_s  # D277: a run cannot have saved more than its own length
        if high_s < low_s:  # the model's bounds claim the impossible: they price nothing
            shim_high = fixed + no_price + load
            high_s = shim_high + wait
        shim_low = max(shim_low, low_s)
    point = min(max(total, low_s), high_s)
    return {
        "added_s": point, "measured_s": total - worker_estimated, "estimated_s": worker_estimated,
        "parts_s": parts, "worker_calls_measured": n_measured, "worker_calls_estimated": n_estimated,
        "calls_unpriced": n_unpriced, "not_counted": list(NOT_COUNTED),
        "low_s": low_s, "high_s": high_s, "capped_at_wall": capped, "wall_s": wall_s,
        "shim_low_s": shim_low, "shim_high_s": shim_high,
        "evidence": {"model_error": used, "model_unmeasured_calls": n_unmodelled,
                     "same_host_load_up_to_s": load, "machine_wait_s": wait, "uncapped_point_s": total},
        "verdict": verdict(shim_low, shim_high),
    }


def same_host_load_s(worker: dict | None, wall_s: float | None, by_phase: dict[str, float],
                     startup: dict[str, float], records: list[dict], parts: dict[str, float]) -> float:
    """The most a same-host embedded worker's CPU time can have slowed the program's own computation:
    that CPU time, at most the run's time outside the worker's calls (D276)."""
    cpu = (worker or {}).get("cpu_s")
    if not cpu or not (worker or {}).get("embedded") or wall_s is None:
        return 0.0
    on_worker = sum(r["wall_s"] for r in records if r["kind"] == "worker")
    return max(0.0, min(cpu, wall_s - on_worker))


def verdict(low_s: float, high_s: float) -> str:
    if -AS_FAST_S <= low_s and high_s <= AS_FAST_S:
        return "about as fast"
    if low_s > 0:
        return "slower"
    if high_s < 0:
        return "faster"
    return "cannot tell"


def machine_wait_s() -> float | None:
    """Seconds this process's main thread was ready to run but waited for a CPU (Linux schedstat's
    run_delay), else None: how much a busy machine moved this run's wall time (D278)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def worker_cpu_s(worker: dict | None) -> float | None:
    """An embedded worker's CPU seconds so far (Linux /proc), else None: the evidence of its load here."""
    pid = ((worker or {}).get("info") or {}).get("pid")
    if not (worker or {}).get("embedded") or not pid:
        return None
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def plain_words(offloaded: int, considered: int, added: dict[str, Any], policy: str) -> str:
    """One line: how many calls left, and how much slower or faster than plain (or that it cannot
    tell), with the interval, mostly why."""
    head = f"offloaded {offloaded} of {considered} calls"
    if policy == "local":
        return f"{head} (policy local: what would have been considered)"
    if "low_s" not in added:  # a report saved before D276
        return f"{head}; about {_signed(added['added_s'])} against running plainly"
    total, parts, low, high = added["added_s"], added["parts_s"], added["low_s"], added["high_s"]
    between = _signed(low) if low == high else f"between {_bound(low)} and {_bound(high)}"
    v = added["verdict"]
    wait = (added.get("evidence") or {}).get("machine_wait_s") or 0.0
    busy = f"; {_s(wait)} waiting for a CPU" if wait >= AS_FAST_S else ""
    if v == "about as fast":
        return f"{head}; about as fast as running plainly ({between}{busy})"
    if v == "cannot tell":
        return (f"{head}; cannot tell against running plainly ({between}{busy})"
                f"{_why_unsure(added)}")
    line = f"{head}; about {_s(abs(total))} {v} than running plainly ({between}"
    line += ", ESTIMATED" if added["estimated_s"] and abs(added["estimated_s"]) >= 0.5 * abs(total) else ""
    line += busy + ")"
    key = max(parts, key=lambda k: parts[k] if total > 0 else -parts[k])
    if total > 0 and parts[key] > 0:
        line += ", mostly " + PARTS[key].format(s=_s(parts[key]))
    elif total < 0 and key == "worker_calls_s":
        line += f", the worker's calls {_s(-parts[key])} faster than NumPy here"
    return line


def _why_unsure(added: dict[str, Any]) -> str:
    ev = added.get("evidence") or {}
    n = ev.get("model_unmeasured_calls", 0) + added.get("calls_unpriced", 0)
    if n:
        return f": NumPy's time for {n} worker calls was never measured (--verify measures some)"
    if ev.get("same_host_load_up_to_s"):
        return f": a worker on this host's CPUs may have cost up to {_s(ev['same_host_load_up_to_s'])}"
    return ""


def detail(added: dict[str, Any]) -> str:
    """The parts behind the plain-words line, each labelled."""
    p = added["parts_s"]
    worker = (f"worker calls {_signed(p['worker_calls_s'])} ({added['worker_calls_measured']} measured, "
              f"{added['worker_calls_estimated']} ESTIMATED from predictions"
              + (f", {added['calls_unpriced']} without a local price" if added["calls_unpriced"] else "")
              + ")")
    line = (f"  against all-local: {_signed(added['added_s'])} in all ({_signed(added['measured_s'])} measured, "
            f"{_signed(added['estimated_s'])} ESTIMATED): cold-worker wait {_signed(p['waiting_for_worker_s'])}, "
            f"calls run here {_signed(p['calls_run_here_s'])}, {worker}, checks {_signed(p['checks_s'])}, "
            f"start-up {_signed(p['startup_s'])}")
    ev = added.get("evidence")
    if ev is not None:
        errs = ", ".join(f"{f} x{e['low']:.2f}..x{e['high']:.2f} over {e['calls']} calls"
                         for f, e in sorted(ev["model_error"].items()))
        line += (f"; interval {_bound(added['low_s'])} .. {_bound(added['high_s'])}"
                 + (f" (local model's measured error: {errs})" if errs else "")
                 + (f", same-host worker load up to {_signed(ev['same_host_load_up_to_s'])}"
                    if ev["same_host_load_up_to_s"] else "")
                 + (f", waited for a CPU {_s(ev['machine_wait_s'])}" if ev.get("machine_wait_s") else "")
                 + (", the saving capped at the run's own time" if added.get("capped_at_wall") else ""))
    return line + f"; not counted: {'; '.join(added['not_counted'])}"


def _median(xs: list[float]) -> float:
    s, mid = sorted(xs), len(xs) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _bound(seconds: float) -> str:
    if seconds == -math.inf:
        return "any saving"
    return _signed(seconds)


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) < 1 else f"{seconds:.1f} s"


def _signed(seconds: float) -> str:
    return "0" if not seconds else ("+" if seconds > 0 else "-") + _s(abs(seconds))

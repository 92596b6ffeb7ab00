"""The report's bottom line (D120): the run against running plainly, counting everything the shim
added to the program's time, each part labelled measured or estimated.

Added time, in seconds (positive: the shim made the run slower):

- ``waiting_for_worker_s`` (measured): calls held for a cold worker (``wait_ready``);
- ``calls_run_here_s`` (measured): what calls computed here spent besides NumPy's own time (the
  decision, hashing, link probes, an exploration abandoned at its deadline, the slow path);
- ``worker_calls_s``: each worker call's time (its wait apart) less NumPy's price for it: measured
  where a check ran NumPy (``local_measured_s``), else ESTIMATED from the planner's prediction;
  calls with neither are counted in ``calls_unpriced`` and left out;
- ``checks_s`` (measured): the sampled checks' local recompute;
- ``startup_s`` (measured): the shim's own start-up.

Not counted, and said so: the one comparison each below-floor call costs, and a same-host
worker's load on the program's own computation (its warm-up shares the CPUs).
Imported at exit: nothing here may exec() source text (see ``report/__init__``).
"""
from __future__ import annotations

from typing import Any

NOT_COUNTED = ("below-floor calls (one comparison each)",
               "a same-host worker's load on the program's own computation")
PARTS = {  # key: what the plain-words line calls it when it is the largest cost
    "waiting_for_worker_s": "waiting {s} for the worker to warm",
    "calls_run_here_s": "{s} deciding and preparing calls that then ran here",
    "worker_calls_s": "{s} in the worker's calls over NumPy's time for them",
    "checks_s": "{s} checking the worker's answers",
    "startup_s": "{s} of the shim's own start-up",
}


def added_time(records: list[dict], by_phase: dict[str, float], startup: dict[str, float]) -> dict[str, Any]:
    """What the shim added to the run, by part, with the measured and estimated totals."""
    here = [r for r in records if r["kind"] != "worker"]
    worker_measured = worker_estimated = 0.0
    n_measured = n_estimated = n_unpriced = 0
    for r in records:
        if r["kind"] != "worker":
            continue
        spent = r["wall_s"] - r["phases"].get("wait_ready", 0.0)
        if r.get("local_measured_s") is not None:
            worker_measured += spent - r["local_measured_s"]
            n_measured += 1
        elif r.get("predicted_local_s"):
            worker_estimated += spent - r["predicted_local_s"]
            n_estimated += 1
        else:
            n_unpriced += 1
    parts = {
        "waiting_for_worker_s": by_phase.get("wait_ready", 0.0),
        "calls_run_here_s": sum(r["wall_s"] - r["phases"].get("local", 0.0) - r["phases"].get("wait_ready", 0.0)
                                for r in here),
        "worker_calls_s": worker_measured + worker_estimated,
        "checks_s": by_phase.get("verify", 0.0),
        "startup_s": sum(startup.values()),
    }
    total = sum(parts.values())
    return {
        "added_s": total, "measured_s": total - worker_estimated, "estimated_s": worker_estimated,
        "parts_s": parts, "worker_calls_measured": n_measured, "worker_calls_estimated": n_estimated,
        "calls_unpriced": n_unpriced, "not_counted": list(NOT_COUNTED),
    }


def plain_words(offloaded: int, considered: int, added: dict[str, Any], policy: str) -> str:
    """One line: how many calls left, and how much slower or faster than plain, mostly why."""
    head = f"offloaded {offloaded} of {considered} calls"
    if policy == "local":
        return f"{head} (policy local: what would have been considered)"
    total, parts = added["added_s"], added["parts_s"]
    if abs(total) < 0.0005:
        return f"{head}; about as fast as running plainly"
    way = "slower" if total > 0 else "faster"
    line = f"{head}; about {_s(abs(total))} {way} than running plainly"
    if added["estimated_s"] and abs(added["estimated_s"]) >= 0.5 * abs(total):
        line += " (ESTIMATED)"
    # the part that moved the total most in its own direction
    key = max(parts, key=lambda k: parts[k] if total > 0 else -parts[k])
    if total > 0 and parts[key] > 0:
        line += ", mostly " + PARTS[key].format(s=_s(parts[key]))
    elif total < 0 and key == "worker_calls_s":
        line += f", the worker's calls {_s(-parts[key])} faster than NumPy here"
    return line


def detail(added: dict[str, Any]) -> str:
    """The parts behind the plain-words line, each labelled."""
    p = added["parts_s"]
    worker = (f"worker calls {_signed(p['worker_calls_s'])} ({added['worker_calls_measured']} measured, "
              f"{added['worker_calls_estimated']} ESTIMATED from predictions"
              + (f", {added['calls_unpriced']} without a local price, left out" if added["calls_unpriced"] else "")
              + ")")
    return (f"  against all-local: {_signed(added['added_s'])} in all ({_signed(added['measured_s'])} measured, "
            f"{_signed(added['estimated_s'])} ESTIMATED): cold-worker wait {_signed(p['waiting_for_worker_s'])}, "
            f"calls run here {_signed(p['calls_run_here_s'])}, {worker}, checks {_signed(p['checks_s'])}, "
            f"start-up {_signed(p['startup_s'])}; not counted: {'; '.join(added['not_counted'])}")


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) < 1 else f"{seconds:.1f} s"


def _signed(seconds: float) -> str:
    return "0" if not seconds else ("+" if seconds > 0 else "-") + _s(abs(seconds))

"""The report's stages (docs/stages.md): one row per stage, its calls by place, bytes each way, its
time here and there, predicted against measured, the intercepted calls seen inside it while it ran
here, what it raised, and why it was pinned here. Read from the ledger's records and the run's stage
decisions (its planner's ``stages``, D347)."""
from __future__ import annotations

from typing import Any

PREFIX = "stage "


def stages_section(rt: Any, records: list[dict]) -> dict[str, Any] | None:
    """None for a run that called no stage."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        if not r["op"].startswith(PREFIX):
            continue
        row = rows.setdefault(r["op"][len(PREFIX):], {
            "calls": 0, "worker": 0, "local": 0, "fallback": 0, "bytes_sent": 0, "bytes_received": 0,
            "here_s": 0.0, "there_s": 0.0, "predicted_there_s": 0.0, "predicted_n": 0, "inner": {}, "pinned": None, "raised": {}})
        row["calls"] += 1
        if r.get("raised"):  # the stage's own exception, here or on the worker
            row["raised"][r["raised"]] = row["raised"].get(r["raised"], 0) + 1
        row[r["kind"] if r["kind"] in ("worker", "fallback") else "local"] += 1
        row["bytes_sent"] += r["bytes_sent"]
        row["bytes_received"] += r["bytes_received"]
        row["there_s" if r["kind"] == "worker" else "here_s"] += r["wall_s"]
        if r["kind"] == "worker" and r.get("predicted_remote_s") is not None:
            row["predicted_there_s"] += r["predicted_remote_s"]
            row["predicted_n"] += 1
    if not rows:
        return None
    planner = rt.made_planner()
    if planner is not None:  # always, once a stage was recorded: its decisions are the planner's
        decider = planner.stages
        for key, stats in decider.stats.items():
            row = rows.get(key[0])
            for op, (n, nbytes) in (stats.inner.items() if row is not None else ()):
                got = row["inner"].setdefault(op, [0, 0])
                got[0] += n
                got[1] += nbytes
        for name, why in decider.pinned.items():
            if name in rows:
                rows[name]["pinned"] = why
    return rows


def stage_lines(section: dict[str, Any] | None) -> list[str]:
    if not section:
        return []
    lines = ["  stages:                         calls  worker  here  fallbk    sent    recv   here_s  there_s  "
             "predicted there"]
    for name, s in section.items():
        predicted = f"{s['predicted_there_s'] / s['predicted_n']:.3g}s/call" if s["predicted_n"] else "-"
        lines.append(f"    {name[-28:]:<28} {s['calls']:>6} {s['worker']:>7} {s['local']:>5} {s['fallback']:>7} "
                     f"{s['bytes_sent'] / 1e6:>6.1f}M {s['bytes_received'] / 1e6:>6.1f}M {s['here_s']:>8.3f} "
                     f"{s['there_s']:>8.3f}  {predicted}")
        for op, (n, nbytes) in sorted(s["inner"].items()):
            lines.append(f"      inside, while run here: {op} x{n} ({nbytes / 1e6:.1f} MB in)")
        if s.get("raised"):
            lines.append("      raised: " + ", ".join(f"{name} x{n}" for name, n in sorted(s["raised"].items())))
        if s["pinned"]:
            lines.append(f"      pinned here: {s['pinned']}")
    return lines

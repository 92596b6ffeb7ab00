"""The planner where the worker is faster: recorded programs replayed over devices x links (SIMULATED).

    python benchmarks/bench_decision_matrix.py [--quick] [--out benchmarks/results/decision-matrix.md]

Each recording of benchmarks/recordings/ (the workloads of benchmarks/workloads/ and the examples,
recorded by ``benchmarks/recordings/record.py``) is replayed (fusion_shim/replay: the real planner on a
simulated clock, fed the modelled times) on each device of ``DEVICES`` over each link of ``LINKS``,
the worker warm. Per cell, on the program's SIMULATED wall time (the program's own time between calls
plus the calls):

- ``auto`` <= 1.05 x min(all-local, all-remote) and <= 1.15 x the oracle;
- where the worker cannot help (the oracle moves no call), ``auto`` <= 1.02 x all-local.

The oracle is the replay's (D241): each call at its faster place with uploads paid as under all-remote,
the definition of the live suite's oracle (benchmarks/workloads/run.py). ``--quick`` replays three
recordings over two devices and two links. Exit status 1 when a cell misses a bound.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from fusion_shim.replay import hardware, simulate  # noqa: E402

DEVICES = ("h200", "l4", "rtx5090")
LINKS = ("pcie5", "10gbe", "1gbe", "wan")
QUICK = {"recordings": ("workload-matmul_large", "workload-decompositions", "example-power_chain"),
         "devices": ("h200", "l4"), "links": ("pcie5", "wan")}
BOUND_MIN, BOUND_ORACLE, BOUND_LOCAL = 1.05, 1.15, 1.02
RECORDINGS = os.path.join(HERE, "recordings")


def cell(report: dict, device: str, link: str) -> dict:
    dev, ln = hardware.device(device, report), hardware.link(link, report)
    steps, _ = simulate.steps_of(report)
    runs = simulate.run_all(steps, dev, ln)
    intercepted = sum((r.get("wall_s") or 0.0) for r in report.get("records") or [])
    other = max((report.get("wall_s") or 0.0) - intercepted, 0.0)
    wall = {k: other + run.total(steps) for k, run in runs.items()}
    helps = any(w == "worker" for w in runs["oracle"].where)
    to_min = wall["auto"] / min(wall["local"], wall["remote"])
    to_oracle = wall["auto"] / wall["oracle"]
    to_local = wall["auto"] / wall["local"]
    misses = []
    if to_min > BOUND_MIN:
        misses.append(f"auto/min {to_min:.3f}")
    if to_oracle > BOUND_ORACLE:
        misses.append(f"auto/oracle {to_oracle:.3f}")
    if not helps and to_local > BOUND_LOCAL:
        misses.append(f"auto/local {to_local:.3f}")
    return {"wall_s": wall, "to_min": to_min, "to_oracle": to_oracle, "to_local": to_local, "worker_helps": helps,
            "moved": {k: sum(st.scale for st, w in zip(steps, run.where) if w == "worker") for k, run in runs.items()},
            "misses": misses}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "decision-matrix.md"))
    args = ap.parse_args()
    names = sorted(f[:-5] for f in os.listdir(RECORDINGS) if f.endswith(".json"))
    devices, links = DEVICES, LINKS
    if args.quick:
        names, devices, links = [n for n in names if n in QUICK["recordings"]], QUICK["devices"], QUICK["links"]
    t0 = time.perf_counter()
    rows, cells = [], {}
    for name in names:
        with open(os.path.join(RECORDINGS, f"{name}.json")) as f:
            report = json.load(f)
        for device in devices:
            for link in links:
                c = cells[(name, device, link)] = cell(report, device, link)
                w = c["wall_s"]
                rows.append(f"| {name} | {device} | {link} | {w['local'] * 1e3:.1f} | {w['remote'] * 1e3:.1f} | "
                            f"{w['auto'] * 1e3:.1f} | {w['oracle'] * 1e3:.1f} | {c['moved']['auto']:.0f}/"
                            f"{c['moved']['oracle']:.0f} | {c['to_min']:.3f} | {c['to_oracle']:.3f} | "
                            f"{'; '.join(c['misses']) or 'ok'} |")
    ok = sum(1 for c in cells.values() if not c["misses"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    head = [
        "# Decision matrix (SIMULATED)", "",
        f"Command: `python benchmarks/bench_decision_matrix.py{' --quick' if args.quick else ''}`; "
        f"{datetime.date.today().isoformat()}; commit {commit}; {platform.node() and 'this host'}, "
        f"{time.perf_counter() - t0:.1f} s.", "",
        "Every figure is SIMULATED: recordings of benchmarks/recordings/ replayed with fusion_shim/replay "
        "(the real planner on a simulated clock; models and sources in docs/replay.md), worker warm. "
        f"Bounds on the program's wall time: auto <= {BOUND_MIN} x min(all-local, all-remote), <= "
        f"{BOUND_ORACLE} x the oracle (D241's), <= {BOUND_LOCAL} x all-local where the oracle moves nothing.", "",
        f"**{ok} of {len(cells)} cells within bounds.**", "",
        "| recording | device | link | all-local ms | all-remote ms | auto ms | oracle ms | moved auto/oracle "
        "| auto/min | auto/oracle | bounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0 if ok == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())

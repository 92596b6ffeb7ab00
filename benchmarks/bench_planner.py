"""The decision engine against its baselines, measured in the same run (issue 5).

    python -m pytest benchmarks/bench_planner.py --benchmark-only -s                 # every condition
    python -m pytest benchmarks/bench_planner.py --benchmark-only -s -k cold-cpu     # one

Each test runs the workload suite (benchmarks/workloads/run.py: six programs, each (workload, mode)
in a fresh process with an empty calibration cache) under one link condition and asserts the
issue's targets on the best of ``REPS`` interleaved rounds of local and auto:

- every link condition (loopback and the emulated links) and the two without a GPU: auto <= 1.05 x
  min(all-local, all-remote) and <= 1.15 x the oracle;
- ``cold-cpu`` (this machine's default: no GPU, the embedded worker deferred) and ``cpu-worker``
  (the embedded CPU worker started at install all the same; remote never helps): auto <= 1.03 x
  all-local, from a cold start;
- ``slow-client`` (client on one core and one BLAS thread, worker on loopback with both), the issue's
  "condition where the worker is really faster than the client": auto offloads and beats all-local on
  the workloads where the oracle says the worker pays. Its ratios to min(all-local, all-remote) and to
  the oracle are printed and kept in the JSON, not asserted: the issue bounds those on the workloads
  under each link condition, and this condition's link is loopback, asserted on its own.

The emulated conditions (``10g-0.1ms``, ``1g-1ms``, ``100m-10ms``) are EMULATED links
(benchmarks/linkemu.py: network namespace, veth, tbf, a delaying proxy) and need root; they are
skipped where the harness cannot run. The figures (and the JSON of every run) go to
``benchmarks/results/planner-<condition>.json``; ``run.py table`` renders them for RESULTS.md.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "workloads"))

import linkemu  # noqa: E402
import run as suite  # noqa: E402  (benchmarks/workloads/run.py)

REPS = int(os.environ.get("FS_BENCH_REPS", "3"))
RESULTS = HERE / "results"


@pytest.mark.parametrize("condition", suite.CONDITIONS)
def test_planner(benchmark, condition):
    if condition not in suite.LOCAL_HOST and linkemu.available():
        pytest.skip(f"link emulation unavailable: {linkemu.available()}")
    workloads = list(suite.WORKLOADS)
    out: dict = {}

    def once() -> None:
        cond = suite.run_condition(condition, workloads, REPS, lambda s: print(s, flush=True))
        cond["summary"] = suite.summarize(cond)
        out.update(cond)

    benchmark.pedantic(once, rounds=1, iterations=1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"planner-{condition}.json").write_text(json.dumps(
        {"started": time.strftime("%Y-%m-%d %H:%M"), "host": os.uname().nodename, "cpus": os.cpu_count(),
         "reps": REPS, "repeat": suite.REPEAT,
         "load_before": os.getloadavg(), "conditions": [out]}, indent=1))
    rows = out["summary"]
    benchmark.extra_info.update({r["workload"]: {k: r[k] for k in ("auto_vs_best", "auto_vs_oracle", "auto_vs_local",
                                                                    "auto_worker_calls")} for r in rows})
    print(suite.table({"started": "this run", "host": os.uname().nodename, "cpus": os.cpu_count(), "reps": REPS,
                       "repeat": suite.REPEAT,
                       "load_before": os.getloadavg(), "conditions": [out]}))
    over = []
    if condition != "slow-client":
        over += [(r["workload"], round(r["auto_vs_best"], 3)) for r in rows if r["auto_vs_best"] > 1.05]
        over += [(r["workload"], "oracle", round(r["auto_vs_oracle"], 3)) for r in rows if r["auto_vs_oracle"] > 1.15]
    if condition in suite.LOCAL_HOST:
        over += [(r["workload"], "local", round(r["auto_vs_local"], 3)) for r in rows if r["auto_vs_local"] > 1.03]
    assert not over, f"auto over its bounds on {condition}: {over}"
    if condition == "slow-client":
        pays = [r for r in rows if r["oracle_remote_calls"]]
        assert pays and any(r["auto_worker_calls"] and r["auto_vs_local"] < 1.0 for r in pays), rows

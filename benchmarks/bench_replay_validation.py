"""The replay against reality (docs/replay.md, "Validation"): runs recorded here, replayed with the CPU
worker's model (``--device cpu-worker``) over the measured loopback link, against the wall time each
run measured. Target: within 20%.

    python -m pytest benchmarks/bench_replay_validation.py --benchmark-only -s -n 0

Each workload (an example of ``examples/`` and its argument) runs ``FS_BENCH_ROUNDS`` times (default 3)
under ``--policy remote`` and under ``--policy auto`` against one warm ``fusion-shim worker --device
cpu`` on an ipc socket, alternately; each run's report is replayed and its own policy's SIMULATED
wall (the replay's ``wall_s``) compared with the report's measured ``wall_s``. The table printed is
what RESULTS.md holds; the median error per workload and policy is asserted.

``FS_BENCH_WORKLOADS``: a comma-separated list of ``example:arg`` (default ``power_chain:1536``; all of
them: ``power_chain:1536,fft_filter:1024,mlp_numpy:4096,lstsq_fit:1024,pca_spectral:1024``), to keep
one invocation short on a loaded host. ``FS_BENCH_WORKER_DEVICE`` (default ``cpu``) is the worker's
``--device``; ``FS_BENCH_REPLAY_DEVICE`` and ``FS_BENCH_REPLAY_LINK`` (default ``cpu-worker`` and
``loopback``) the replay's: ``benchmarks/gpu/replay.py`` calls these functions with a GPU's model.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = [tuple(w.split(":", 1)) for w in os.environ.get("FS_BENCH_WORKLOADS", "power_chain:1536").split(",")]
ROUNDS = int(os.environ.get("FS_BENCH_ROUNDS", "3"))
BOUND = 0.20
WORKER_DEVICE = os.environ.get("FS_BENCH_WORKER_DEVICE", "cpu")
REPLAY_DEVICE = os.environ.get("FS_BENCH_REPLAY_DEVICE", "cpu-worker")
REPLAY_LINK = os.environ.get("FS_BENCH_REPLAY_LINK", "loopback")


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}


def _worker(url: str, device: str = WORKER_DEVICE, parent_pid: int | None = None) -> subprocess.Popen:
    tie = ["--parent-pid", str(parent_pid)] if parent_pid else []  # the worker exits with that process
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", device, *tie],
                            stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # bound, then warm: the first client's hello waits for the warm-up
        if "binding" in line or time.monotonic() > deadline:
            break
    return proc


def _run(url: str, policy: str, report: Path, example: str = "power_chain", arg: str = "1536",
         timeout: float = 600) -> float:
    done = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", policy, "--worker", url, "--quiet",
                           "--report", str(report), str(ROOT / "examples" / f"{example}.py"), arg],
                          capture_output=True, text=True, env=_env(), timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(report.read_text())["wall_s"]


def _replayed(report: Path, policy: str, device: str = REPLAY_DEVICE, link: str = REPLAY_LINK,
              timeout: float = 600) -> float:
    done = subprocess.run([sys.executable, "-m", "fusion_shim", "replay", str(report), "--device", device,
                           "--link", link, "--json"], capture_output=True, text=True, env=_env(), timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["wall_s"][policy]


def test_replay_predicts_measured_runs_on_the_cpu_worker(benchmark):
    work = Path(tempfile.mkdtemp(prefix="fs-rv-", dir="/tmp"))
    url = f"ipc://{work}/w.sock"
    proc = _worker(url)
    rows: dict[tuple[str, str], list] = {}
    try:
        _run(url, "remote", work / "warm.json")  # the worker's warm-up and the host's calibration, once

        def rounds():
            for example, arg in WORKLOADS:
                for i in range(ROUNDS):
                    for policy in ("remote", "auto"):
                        report = work / f"{example}-{policy}-{i}.json"
                        measured = _run(url, policy, report, example, arg)
                        rows.setdefault((f"{example} {arg}", policy), []).append((measured, _replayed(report, policy)))

        benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"\nreplay validation (worker {WORKER_DEVICE}, replayed on {REPLAY_DEVICE} over {REPLAY_LINK}; "
          f"SIMULATED against measured; reports in {work}):")
    print("| workload | policy | measured wall (s) | SIMULATED wall (s) | ratio |")
    print("|---|---|---|---|---|")
    errors = {}
    for (workload, policy), got in rows.items():
        errs = [sim / meas - 1 for meas, sim in got]
        errors[f"{workload} {policy}"] = statistics.median(errs)
        for meas, sim in got:
            print(f"| {workload} | {policy} | {meas:.2f} | {sim:.2f} | {sim / meas:.2f} |")
    print("median error:", {k: f"{e:+.0%}" for k, e in errors.items()})
    benchmark.extra_info.update({f"{k}_median_error": e for k, e in errors.items()})
    for key, e in errors.items():
        assert abs(e) <= BOUND, f"{key}: the replay is {e:+.0%} off the measured runs"

"""A worker's resident memory after runs of a program end: back near its idle size once the grace
has passed (D195: a principal's data goes a grace after its last connection closed; D197: the freed
heap goes back to the system). Under 3 minutes:

    python -m pytest benchmarks/bench_run_end_memory.py --benchmark-only -s

One ``fusion-shim worker --device cpu`` on an ipc socket; ``RUNS`` runs, one after another, of a
program under ``--policy remote`` whose matrices stay resident on the worker (new data each run, so
nothing is a hit from the run before). On ipc every run of this user is one principal, so a run that
starts within the grace keeps the last one's data: the worker's VmRSS is read idle, after each run
ends, and after the grace (``GRACE_S`` and a margin) that follows the last.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fusion_shim.worker.connections import GRACE_S

MIB = 1 << 20
RUNS = 5
SIZE = 1200          # 11 MiB a matrix; each run keeps some 90 MiB on the worker
NEAR_IDLE_MIB = 64   # "back near its idle size"
PROGRAM = """\
import sys
import numpy as np
rng = np.random.default_rng(int(sys.argv[1]))
a, b = rng.standard_normal(({n}, {n})), rng.standard_normal(({n}, {n}))
total = 0.0
for _ in range(3):  # the same inputs again: the worker keeps them resident and is sent references
    c = a @ b
    d = c @ a
    total += float(d[0, 0]) + float((b @ c)[1, 1])
print(f"{{total:.6e}}")
""".format(n=SIZE)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:")) / MIB


def _runs() -> dict:
    d = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    url = f"ipc://{d}/w.sock"
    prog = d / "prog.py"
    prog.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                              env=env, stderr=subprocess.DEVNULL)
    out: dict = {"runs": RUNS, "grace_s": GRACE_S, "after_run_mib": [], "run_s": []}
    try:
        deadline = time.monotonic() + 120
        while not (d / "w.sock").exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the worker did not bind"
            time.sleep(0.05)
        cmd = [sys.executable, "-m", "fusion_shim", "--policy", "remote", "--worker", url, "--quiet", str(prog)]
        warm = subprocess.run([*cmd, "0"], capture_output=True, text=True, env=env, timeout=300)
        assert warm.returncode == 0, warm.stderr[-2000:]
        time.sleep(GRACE_S + 5)  # the warm-up run's data gone: what is left is the worker's own
        out["idle_mib"] = _rss_mib(worker.pid)
        for run in range(1, RUNS + 1):
            t = time.perf_counter()
            shim = subprocess.run([*cmd, str(run)], capture_output=True, text=True, env=env, timeout=300)
            out["run_s"].append(round(time.perf_counter() - t, 2))
            assert shim.returncode == 0, shim.stderr[-2000:]
            plain = subprocess.run([sys.executable, str(prog), str(run)], capture_output=True, text=True, env=env,
                                   timeout=300)
            assert float(shim.stdout) == float(plain.stdout) or abs(float(shim.stdout) - float(plain.stdout)) <= \
                1e-9 * abs(float(plain.stdout)), (shim.stdout, plain.stdout)
            out["after_run_mib"].append(_rss_mib(worker.pid))
        ended = time.monotonic()
        while time.monotonic() - ended < GRACE_S + 30:  # the grace, then the idle loop's trim: read every second
            time.sleep(1.0)
            out["after_grace_mib"] = _rss_mib(worker.pid)
            if time.monotonic() - ended > GRACE_S + 2 and out["after_grace_mib"] - out["idle_mib"] <= NEAR_IDLE_MIB:
                break
        out["after_grace_s"] = round(time.monotonic() - ended, 1)
        out["alive"] = worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(30)
        shutil.rmtree(d, ignore_errors=True)
    return out


def test_a_workers_memory_after_runs_end_returns_near_its_idle_size(benchmark):
    got = benchmark.pedantic(_runs, rounds=1, iterations=1)
    benchmark.extra_info.update(got)
    print("\nrun-end memory:", {k: (round(v) if isinstance(v, float) else
                                    [round(x) for x in v] if k == "after_run_mib" else v) for k, v in got.items()})
    assert got["alive"]
    assert max(got["after_run_mib"]) - got["idle_mib"] > 32  # the runs did leave data on the worker
    assert got["after_grace_mib"] - got["idle_mib"] <= NEAR_IDLE_MIB

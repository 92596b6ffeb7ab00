"""A pool that takes no call costs the program nothing: ``auto`` with ``--pool`` against plain ``python``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_pool_idle.py [--pairs 5] [--calls 55]

A Ray head on loopback (token authentication, a token of the run's own, a short temp dir under /tmp)
with a pool of one CPU worker on this host, warmed; then a program of ``--calls`` 400x400 products and
some pure-Python work (about 3 s), run plainly, as ``python -m fusion_shim --policy auto --pool`` and as
``--policy auto`` without a pool (the shim's own start-up, which a pool adds to), in rounds that
alternate the order, each a fresh process. The pool's worker shares this host's
CPUs, so ``auto`` must send it nothing (D301) and must not load Ray in the program (D300): each shim run
checks both, and prints what its report says Ray cost (in helper processes). Target: the median of
the per-pair ratios of wall and of CPU time within noise of 1 (each pair printed). The head is stopped by
its process group at the end, its temp dir removed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.pool.clusters import start_head, stop_head, token_env  # noqa: E402

PROGRAM = """\
import sys
import numpy as np
a = np.random.default_rng(0).standard_normal((400, 400))
total = 0.0
for i in range(int(sys.argv[1])):
    total += float((a @ a)[0, 0])
    total += sum(j * j for j in range(400_000)) * 1e-12
print(f"{total:.6e}", "ray" in sys.modules)
"""
POOL = "idle"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and the children it reaped, its stdout): the CPU time
    holds on a machine that other work keeps busy, where the wall time swings by 2x."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, out.stdout


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=55)
    opts = ap.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    auth = token_env(directory)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSION_SHIM", "RAY_"))}
    env.update(auth, PYTHONPATH=str(ROOT))
    prog = directory / "prog.py"
    prog.write_text(PROGRAM)
    head = None
    try:
        head, address = start_head(directory, auth)
        up = subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "up", "--ray", address, "--workers", "1",
                             "--device", "cpu", "--name", POOL], capture_output=True, text=True, env=env, timeout=300)
        assert up.returncode == 0, up.stderr[-2000:]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # warmed: a cold worker would be ignored for another reason
            status = subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "status", "--ray", address, "--name",
                                     POOL], capture_output=True, text=True, env=env, timeout=120).stdout
            if " ready " in status:
                break
            time.sleep(2)
        print(f"load before: {os.getloadavg()}")
        plain_cmd = [sys.executable, str(prog), str(opts.calls)]
        report = directory / "r.json"
        shim_cmd = [sys.executable, "-m", "fusion_shim", "--policy", "auto", "--pool", f"ray://{address}/{POOL}",
                    "--quiet", "--report", str(report), str(prog), str(opts.calls)]
        # the shim under auto without a pool: its own start-up, which the pool's cost is on top of
        bare_cmd = [sys.executable, "-m", "fusion_shim", "--policy", "auto", "--quiet", str(prog), str(opts.calls)]
        plain_s, shim_s, bare_s, plain_cpu, shim_cpu, bare_cpu = [], [], [], [], [], []
        for i in range(opts.pairs):
            order = [(plain_cmd, plain_s, plain_cpu), (shim_cmd, shim_s, shim_cpu), (bare_cmd, bare_s, bare_cpu)]
            for cmd, into, cpu_into in (order if i % 2 == 0 else order[::-1]):
                seconds, cpu, out = timed(cmd, env)
                into.append(seconds)
                cpu_into.append(cpu)
                if cmd is shim_cmd:
                    assert out.split()[-1] == "False", "the program loaded Ray"
                    rep = json.loads(report.read_text())
                    workers = rep["pool"]["workers"]
                    assert sum(w["calls"] for w in workers) == 0, workers
                    ray = {k: round(v, 2) for k, v in rep["pool"]["ray"].items()}
                    print(f"  pair {i}: shim {seconds:.2f} s (CPU {cpu:.2f} s), pool workers "
                          f"{[w['state'] for w in workers]}, Ray {ray}")
                else:
                    print(f"  pair {i}: {'plain' if cmd is plain_cmd else 'auto, no pool'} {seconds:.2f} s "
                          f"(CPU {cpu:.2f} s)")
        print(f"load after: {os.getloadavg()}")
        for what, plain, shim, bare in (("wall", plain_s, shim_s, bare_s), ("CPU", plain_cpu, shim_cpu, bare_cpu)):
            ratios = [a / b for a, b in zip(shim, plain)]
            bare_ratios = [a / b for a, b in zip(bare, plain)]
            print(f"{what}: median plain {statistics.median(plain):.3f} s, auto+pool {statistics.median(shim):.3f} s, "
                  f"auto without a pool {statistics.median(bare):.3f} s; median ratio to plain: auto+pool "
                  f"{statistics.median(ratios):.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)}), auto without "
                  f"a pool {statistics.median(bare_ratios):.3f}")
    finally:
        if head is not None:
            subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "down", "--ray", address, "--name", POOL],
                           capture_output=True, env=env, timeout=120)
            stop_head(head)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The GPU workload runner (issue 9): four NumPy programs, each timed as plain NumPy on this machine's
CPUs, through the shim with ``--policy remote``, and with ``--policy auto``, end to end.

    python benchmarks/gpu/workloads.py --device cuda:0 --out workloads.json [--quick] [--only NAME,...]
    python benchmarks/gpu/workloads.py child NAME [--quick]      # one program (what the runner starts)

Each program is an ordinary NumPy script (``child``): it makes its data, then times its *body*
(everything after the data exists: every transfer, every hash, every kernel, every result back) and
prints one JSON line with the body's seconds and a checksum. "local" runs it with plain ``python``
(NumPy alone, no shim installed); "remote" and "auto" run it under ``python -m fusion_shim`` against
one worker the runner starts on ``--device`` over ``ipc://`` (a warm worker, as a deployed GPU
service would be; its start is reported apart). Same-host, so buffers go through shared memory.

Programs (full size; ``--quick`` shrinks them to a CPU dry run of a few seconds):

- ``power``: resident power iteration, 8192x8192 float32, 200 steps of ``A @ v``;
- ``matmul_chain``: float64 4096x4096, six chained products (each result feeds the next);
- ``fft``: 4096x4096 complex128, three rounds of fft2 -> low-pass mask -> ifft2;
- ``decomp``: float64 3072x3072 symmetric positive definite: eigh, cholesky, solve.

Targets (the issue's, checked in the JSON, never asserted here): power >= 20x faster than NumPy end
to end, matmul_chain >= 5x, and auto never slower than NumPy (reported strictly and with a 10%
allowance for noise, both). Results are also compared: each checksum against NumPy's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
NAMES = ("power", "matmul_chain", "fft", "decomp")
TARGETS = {"power": 20.0, "matmul_chain": 5.0}
SIZES = {  # full, quick (the quick arrays reach the shared-memory lane's 256 KiB, D39)
    "power": ((8192, 200), (256, 10)),
    "matmul_chain": ((4096, 6), (192, 3)),
    "fft": ((4096, 3), (128, 2)),
    "decomp": ((3072, 1), (192, 1)),
}


# --- the programs --------------------------------------------------------------------------------------

def program(name: str, quick: bool) -> dict:
    import numpy as np

    n, steps = SIZES[name][1 if quick else 0]
    rng = np.random.default_rng(0)
    if name == "power":
        a = rng.standard_normal((n, n), dtype=np.float32)
        a = a + a.T  # symmetric: a real dominant eigenvalue
        v = np.ones(n, np.float32)
        t = time.perf_counter()
        for _ in range(steps):
            w = np.matmul(a, v)
            v = w / np.linalg.norm(w)
        lam = float(np.dot(v, np.matmul(a, v)))
        body = time.perf_counter() - t
        return {"body_s": body, "checksum": abs(lam), "ops": steps + 1}
    if name == "matmul_chain":
        a = rng.standard_normal((n, n)) / np.sqrt(n)
        b = rng.standard_normal((n, n)) / np.sqrt(n)
        t = time.perf_counter()
        c = a
        for k in range(steps):
            c = np.matmul(c, b if k % 2 else a)
        body = time.perf_counter() - t
        return {"body_s": body, "checksum": float(np.linalg.norm(c)), "ops": steps}
    if name == "fft":
        x = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
        f = np.fft.fftfreq(n)
        mask = (np.abs(f)[:, None] < 0.25) & (np.abs(f)[None, :] < 0.25)
        t = time.perf_counter()
        for _ in range(steps):
            x = np.fft.ifft2(np.fft.fft2(x) * mask)
        body = time.perf_counter() - t
        return {"body_s": body, "checksum": float(np.abs(x).sum()), "ops": 2 * steps}
    if name == "decomp":
        x = rng.standard_normal((n, n))
        s = np.matmul(x, x.T) / n + np.eye(n)
        rhs = rng.standard_normal((n, 8))
        t = time.perf_counter()
        w, _ = np.linalg.eigh(s)
        chol = np.linalg.cholesky(s)
        sol = np.linalg.solve(s, rhs)
        body = time.perf_counter() - t
        return {"body_s": body, "checksum": float(w.sum() + np.abs(chol).sum() + np.abs(sol).sum()), "ops": 3}
    raise SystemExit(f"unknown workload {name!r}; valid: {', '.join(NAMES)}")


# --- the runner ----------------------------------------------------------------------------------------

def _env(device: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("NUMBA_ENABLE_CUDASIM", "0" if device.startswith("cuda") else "1")
    return env


def start_worker(device: str, tmp: str) -> tuple[subprocess.Popen, str, dict, float]:
    from fusion_shim.protocol import messages
    from fusion_shim.transport import Channel

    url = f"ipc://{tmp}/worker.sock"
    log = open(os.path.join(tmp, "worker.log"), "ab")
    t = time.perf_counter()
    # --parent-pid: the worker exits with this runner, even one killed at run.sh's time limit
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", device,
                             "--parent-pid", str(os.getpid())], env=_env(device), stdout=log, stderr=log)
    chan = Channel(url, alive=lambda: proc.poll() is None)
    try:
        header = chan.request(messages.hello(1), time.monotonic() + 300).header
    finally:
        chan.close()
    return proc, url, header, time.perf_counter() - t


def run_one(name: str, policy: str, url: str, device: str, quick: bool, tmp: str, timeout: float) -> dict:
    child = [str(HERE), "child", name] + (["--quick"] if quick else [])
    report = os.path.join(tmp, f"{name}-{policy}.json")
    if policy == "local":
        cmd = [sys.executable, *child]  # NumPy alone: no shim installed at all
    else:
        cmd = [sys.executable, "-m", "fusion_shim", "--quiet", "--policy", policy, "--worker", url,
               "--report", report, *child]
    t = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(device), timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}: {out.stderr[-1500:]}"}
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    if policy != "local" and os.path.exists(report):
        rep = json.load(open(report))
        sm = rep.get("summary", {})
        result["calls"] = sm.get("calls")
        result["bytes"] = {k: sm.get(k) for k in ("bytes_sent", "bytes_received", "shm_sent", "shm_received")}
        result["time_by_phase_s"] = sm.get("time_by_phase_s")
        result["residency"] = sm.get("residency")
        result["events"] = [e["what"] for e in rep.get("events", [])][-6:]
    return result


def run(device: str, quick: bool, only: list[str], timeout: float, out: str | None = None) -> dict:
    """Every workload under every policy; with ``out``, the JSON is rewritten after each workload
    (a run stopped at its time limit keeps what it measured)."""
    import numpy as np

    tmp = tempfile.mkdtemp(prefix="fusion-shim-workloads-")
    proc, url, ready, start_s = start_worker(device, tmp)
    results: dict = {"device": device, "quick": quick, "machine": platform.node(), "cpus": os.cpu_count(),
                     "numpy": np.__version__, "python": platform.python_version(),
                     "worker": {k: ready.get(k) for k in ("device", "torch", "bench", "numba", "pid")},
                     "worker_start_s": start_s, "workloads": {}}
    try:
        for name in only:
            row: dict = {}
            for policy in ("local", "remote", "auto"):
                row[policy] = run_one(name, policy, url, device, quick, tmp, timeout)
                print(f"{name:13s} {policy:6s} {_fmt(row[policy])}", file=sys.stderr, flush=True)
            row.update(_judge(name, row))
            results["workloads"][name] = row
            if out:
                Path(out).write_text(json.dumps(results, indent=1))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        results["worker_log_tail"] = open(os.path.join(tmp, "worker.log"), errors="replace").read()[-2000:]
    return results


def _fmt(r: dict) -> str:
    return r["error"][:200] if "error" in r else f"body {r['body_s']:.3f} s  (process {r['process_wall_s']:.1f} s)"


def _judge(name: str, row: dict) -> dict:
    local = row["local"].get("body_s")
    out: dict = {}
    for policy in ("remote", "auto"):
        got = row[policy]
        if local and "body_s" in got:
            out[f"speedup_{policy}"] = local / got["body_s"]
            ref = row["local"]["checksum"]
            out[f"checksum_rel_diff_{policy}"] = abs(got["checksum"] - ref) / max(abs(ref), 1e-300)
    if name in TARGETS and "speedup_remote" in out:
        out["target_speedup"] = TARGETS[name]
        out["target_met"] = out["speedup_remote"] >= TARGETS[name]
    if "speedup_auto" in out:
        out["auto_not_slower_strict"] = out["speedup_auto"] >= 1.0
        out["auto_not_slower_within_10pct"] = out["speedup_auto"] >= 1 / 1.1
    return out


def table(results: dict) -> str:
    lines = [f"workloads on {results['device']} ({'quick dry run' if results['quick'] else 'full size'}), "
             f"{results['cpus']} CPUs, worker start {results['worker_start_s']:.1f} s, numba: "
             f"{results['worker'].get('numba')}",
             f"{'workload':13s} {'numpy s':>9s} {'remote s':>9s} {'auto s':>9s} {'x remote':>9s} {'x auto':>8s}  target"]
    for name, row in results["workloads"].items():
        cell = lambda p: f"{row[p]['body_s']:9.3f}" if "body_s" in row[p] else f"{'error':>9s}"  # noqa: E731
        sp = lambda k: f"{row[k]:8.2f}x" if k in row else f"{'-':>9s}"  # noqa: E731
        target = ""
        if "target_met" in row:
            target = f">= {row['target_speedup']:g}x: {'met' if row['target_met'] else 'NOT met'}"
        if "auto_not_slower_strict" in row:
            target += f"; auto {'not slower' if row['auto_not_slower_strict'] else 'SLOWER'} than NumPy"
        lines.append(f"{name:13s} {cell('local')} {cell('remote')} {cell('auto')} {sp('speedup_remote')} "
                     f"{sp('speedup_auto')}  {target}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(program(argv[1], "--quick" in argv[2:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(NAMES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for one program under one policy")
    opts = parser.parse_args(argv)
    # a TERM (run.sh's time limit) unwinds normally: the running program and the worker are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    only = [n for n in opts.only.split(",") if n]
    results = run(opts.device, opts.quick, only, opts.timeout, opts.out)
    Path(opts.out).write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

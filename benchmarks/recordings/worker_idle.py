"""Whether a recording's local times are taken beside a busy worker (Linux: reads /proc).

    python benchmarks/recordings/worker_idle.py [--runs N] [--calls] [NAME ...]

Runs ``record.py``'s command for each NAME (default ``example-lstsq_fit``) N times into a scratch
report, sampling the embedded worker's CPU time (its process and children, every 2 ms, in clock ticks)
and the host's busy CPUs. Per run it prints the checks' total time (each record's ``verify`` phase,
the window its ``local_measured_s`` is taken in), the worker's CPU time inside those windows, and inside
the worker's own calls (the sampler sees the worker when it computes). ``--calls``: per call as well.
Nothing under benchmarks/recordings/ is written.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children alive now (0 once gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        kids = [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / HZ + sum(_cpu(k) for k in kids)


def _busy() -> float:
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(v) - v[3] - v[4]) / HZ


def _worker(pid: int) -> int | None:
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = open(f"/proc/{pid}/task/{t}/children").read().split()
        except OSError:
            continue
        if kids:
            return int(kids[0])
    return None


def run_once(name: str, report: str) -> tuple[dict, list]:
    """One recording run; its report and the samples (monotonic s, worker CPU s, host busy CPU s)."""
    proc = subprocess.Popen(record.command(name, report), cwd=record.ROOT, stdout=subprocess.DEVNULL,
                            env=record.ENV)
    wpid = appeared = None
    samples: list[tuple[float, float, float]] = []
    while proc.poll() is None:
        now = time.monotonic()
        if wpid is None:
            wpid = _worker(proc.pid)
            appeared = now
        samples.append((now, _cpu(wpid) if wpid else 0.0, _busy()))
        time.sleep(0.002)
    if proc.returncode:
        raise SystemExit(f"{name}: the recording run exited {proc.returncode}")
    with open(report) as f:
        rep = json.load(f)
    spawned = next(e["t_s"] for e in rep["events"] if "embedded worker started" in e["what"])
    base = appeared - spawned  # the run's clock (ledger start) on this monotonic clock
    return rep, [(t - base, w, b) for t, w, b in samples]


def _at(samples: list, times: list, t: float) -> tuple:
    return samples[min(bisect.bisect_left(times, t), len(samples) - 1)]


def windows(rep: dict, samples: list) -> list[dict]:
    """Per checked record: its check's time, the worker's CPU in the check and in the call itself."""
    times = [s[0] for s in samples]
    out = []
    for r in rep["records"]:
        check = r.get("phases", {}).get("verify")
        if check is None:
            continue
        t0, t1 = r["start_s"], r["start_s"] + r["wall_s"]
        a, b, c = _at(samples, times, t0), _at(samples, times, t1), _at(samples, times, t1 + check)
        out.append({"call": f'{r["op"]} {r["site"].rsplit(":", 1)[-1]}', "check_s": check,
                    "local_s": r.get("local_measured_s") or 0.0, "worker_in_check_s": c[1] - b[1],
                    "worker_in_call_s": b[1] - a[1], "host_busy": (c[2] - b[2]) / check if check > 0.02 else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=["example-lstsq_fit"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--calls", action="store_true")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in record.PROGRAMS]
    if unknown:
        ap.error(f"unknown {', '.join(unknown)}; known: {', '.join(record.PROGRAMS)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            for i in range(args.runs):
                rows = windows(*run_once(name, os.path.join(tmp, "run.json")))
                print(f"{name} run {i + 1}: checks {sum(r['check_s'] for r in rows):.3f} s, worker CPU in them "
                      f"{sum(r['worker_in_check_s'] for r in rows):.3f} s, in its calls "
                      f"{sum(r['worker_in_call_s'] for r in rows):.3f} s (ticks of {1 / HZ:.3f} s)")
                for r in rows if args.calls else ():
                    busy = "" if r["host_busy"] is None else f", host busy {r['host_busy']:.2f} CPUs"
                    print(f"  {r['call']:26s} local {1e3 * r['local_s']:8.1f} ms, worker CPU in check "
                          f"{1e3 * r['worker_in_check_s']:4.0f} ms, in call {1e3 * r['worker_in_call_s']:5.0f} ms{busy}")


if __name__ == "__main__":
    main()

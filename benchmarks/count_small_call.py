"""Deterministic per-call counts of a forced-remote 1-element ``np.dot`` over ``ipc://``, both sides.

    python benchmarks/count_small_call.py count N      # Python calls and opcodes per call, client and worker
    python benchmarks/count_small_call.py cpu N        # CPU us per call: the calling thread, the worker process
    valgrind --tool=callgrind --toggle-collect=functools_reduce --separate-threads=yes \\
        python benchmarks/count_small_call.py reduce N  # the client's instructions: N calls inside functools.reduce

Load moves wall time and CPU time; it does not move these counts. ``count`` traces the client's calling thread
(``sys.settrace`` with ``f_trace_opcodes``) over N calls after 300 of warm-up, and the worker's serving thread
over the same calls (the worker runs under this file's ``worker`` mode: SIGUSR1 starts its trace, SIGUSR2 writes
it); ``reduce`` makes N calls under one C function, so that callgrind counts those alone: run it at two N and
divide the difference. Residency and shared memory are off, as in ``bench_small_call.py``'s ``dot1-ipc``.
Runs against any tree whose package is installed (it uses only ``fusion_shim.install``).
"""
from __future__ import annotations

import collections
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

WARM = 300


def _key(frame) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"


class Tracer:
    """Opcodes and Python calls per function, on the thread that installs it."""

    def __init__(self) -> None:
        self.ops: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def local(self, frame, event, arg):
        if event == "opcode":
            self.ops[_key(frame)] += 1
        return self.local

    def glob(self, frame, event, arg):
        frame.f_trace_opcodes = True
        self.calls[_key(frame)] += 1
        return self.local


def worker_main(argv: list[str]) -> None:
    """``fusion-shim worker ARGV``, its serving (main) thread traced between SIGUSR1 and SIGUSR2."""
    tracer = Tracer()

    def start(sig, frame):
        while frame is not None:  # the frames already running (the serve loop) are traced from here on
            frame.f_trace, frame.f_trace_opcodes = tracer.local, True
            frame = frame.f_back
        sys.settrace(tracer.glob)

    def stop(sig, frame):
        sys.settrace(None)
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back
        out = os.environ["COUNT_OUT"]
        with open(out + ".tmp", "w") as f:
            json.dump({"ops": dict(tracer.ops), "calls": dict(tracer.calls)}, f)
        os.rename(out + ".tmp", out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["fusion_shim", "worker", *argv]
    import runpy

    runpy.run_module("fusion_shim", run_name="__main__", alter_sys=True)


def _cpu_s(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def main(mode: str, n: int) -> dict:
    os.environ["FUSION_SHIM_RESIDENCY"], os.environ["FUSION_SHIM_SHM"] = "0", "0"
    import numpy as np

    import fusion_shim

    d = tempfile.mkdtemp(prefix="fs-count-")
    url, out = f"ipc://{d}/w.sock", f"{d}/worker.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["COUNT_OUT"] = out
    args = ["--bind", url, "--device", "cpu"]
    cmd = [sys.executable, __file__, "worker", *args] if mode == "count" else [
        sys.executable, "-m", "fusion_shim", "worker", *args]
    worker = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=env)
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=600)
        assert rt.link.wait_ready(600)
        a, b = np.random.default_rng(0).standard_normal(1), np.random.default_rng(1).standard_normal(1)
        dot = np.dot
        for _ in range(WARM):
            got = dot(a, b)
        assert rt.ledger.records[-1].kind == "worker", rt.ledger.records[-1].reason
        assert got == np.float64(a[0] * b[0]) and type(got) is np.float64, (got, type(got))
        result: dict = {"mode": mode, "calls": n}
        if mode == "reduce":
            functools.reduce(lambda _, __: dot(a, b), range(n), None)
        elif mode == "cpu":
            rounds = []
            for _ in range(9):
                c, w = time.thread_time(), _cpu_s(worker.pid)
                for _ in range(n):
                    dot(a, b)
                rounds.append(((time.thread_time() - c) / n * 1e6, (_cpu_s(worker.pid) - w) / n * 1e6))
            result.update(client_cpu_us=statistics.median(r[0] for r in rounds),
                          worker_cpu_us=statistics.median(r[1] for r in rounds))
        else:
            worker.send_signal(signal.SIGUSR1)
            time.sleep(1.0)  # its handler runs within the loop's 200 ms receive
            tracer = Tracer()
            sys.settrace(tracer.glob)
            for _ in range(n):
                dot(a, b)
            sys.settrace(None)
            worker.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 60
            while not os.path.exists(out) and time.monotonic() < deadline:
                time.sleep(0.1)
            with open(out) as f:
                theirs = json.load(f)
            result["client"] = {"ops": dict(tracer.ops), "calls": dict(tracer.calls)}
            result["worker"] = theirs
            for side in ("client", "worker"):
                result[f"{side}_opcodes_per_call"] = sum(result[side]["ops"].values()) / n
                result[f"{side}_py_calls_per_call"] = sum(result[side]["calls"].values()) / n
        recs = rt.ledger.records[-min(n, 100):]
        assert all(r.kind == "worker" for r in recs), {r.reason for r in recs}
        return result
    finally:
        fusion_shim.uninstall()
        worker.kill()
        worker.wait()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
    else:
        res = main(sys.argv[1], int(sys.argv[2]))
        if len(sys.argv) > 3:
            with open(sys.argv[3], "w") as f:
                json.dump(res, f)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()
                          if k not in ("client", "worker")}))

"""The worker's CPU per small request, two trees against each other and against a raw NumPy server.

    python benchmarks/worker_cpu.py BASE_TREE [--case dot1] [--rounds 25] [--calls 200]

One request of the shim's own (``policy remote``, residency off; shared memory on for ``dot1m_shm``)
is caught on the socket and sent again from a raw DEALER, ``--calls`` times a round, to a
``fusion-shim worker --device cpu`` of this tree, to one of ``BASE_TREE`` and to the raw server of
``bench_small_call.py``, alternately. Each process's CPU is read from ``/proc/<pid>/task/*/schedstat``
(its threads together, and its main thread alone); printed: the medians per request and the median
of the per-round ratios new/base. The shared-memory request names the shim's segments, which the
workers read through their fds as they read any client's (the DEALER is the same user: the same
principal on ``ipc://``); the raw server gets the header frame alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
sys.path.insert(0, TREE)
sys.path.insert(0, HERE)

from bench_small_call import CASES, SERVER, _cpu_s, _dealer, caught_request

import fusion_shim
from fusion_shim.protocol import messages
from fusion_shim.transport import Channel


def _main_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _worker(tree: str, url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = tree
    return subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                            stderr=subprocess.DEVNULL, env=env, cwd=tree)


def _ready(url: str) -> None:
    chan = Channel(url)
    try:
        chan.request(messages.hello(0), time.monotonic() + 600)
    finally:
        chan.close()


def _record(url: str, op: str, n: int) -> tuple[list, bytes]:
    """The shim's request for one call (caught on the socket) and the worker's reply header."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)), rng.standard_normal((n, n))) if op == "matmul" else (
        rng.standard_normal(n), rng.standard_normal(n))
    func = np.matmul if op == "matmul" else np.dot
    for _ in range(3):
        func(a, b)
    request = caught_request(func, a, b)
    sock = _dealer(url)
    sock.send_multipart(request)
    reply = sock.recv_multipart()
    sock.close(0)
    return request, reply[0]


def _keep_segments() -> tuple[list, object]:
    """The shim unlinks a segment's name once a worker has opened it; the other worker opens it by
    name too, so the names are kept (and unlinked at the end with the original method)."""
    from fusion_shim.transport import shm_client

    kept: list = []
    unlink = shm_client.Segment.unlink
    shm_client.Segment.unlink = lambda seg: kept.append(seg)
    return kept, unlink


def _round(sock: zmq.Socket, pid: int, request: list, calls: int) -> tuple[float, float]:
    c, m = _cpu_s(pid), _main_cpu_s(pid)
    for _ in range(calls):
        sock.send_multipart(request, copy=False)
        sock.recv_multipart(copy=False)
    return (_cpu_s(pid) - c) / calls, (_main_cpu_s(pid) - m) / calls


def run(base_tree: str, case: str, rounds: int, calls: int) -> dict:
    transport, op, n, shm = CASES[case]
    assert transport == "ipc", "the raw DEALER speaks plain ipc:// only"
    d = tempfile.mkdtemp(prefix="fs-worker-cpu-")
    urls = {"new": f"ipc://{d}/new.sock", "base": f"ipc://{d}/base.sock", "raw": f"ipc://{d}/raw.sock"}
    procs = {"new": _worker(TREE, urls["new"]), "base": _worker(base_tree, urls["base"])}
    os.environ["FUSION_SHIM_RESIDENCY"] = "0"
    os.environ["FUSION_SHIM_SHM"] = "auto" if shm else "0"
    kept, unlink = _keep_segments() if shm else ([], None)
    try:
        for k in ("new", "base"):
            _ready(urls[k])
        rt = fusion_shim.install(policy="remote", worker=urls["new"], quiet=True, ready_timeout=600)
        assert rt.link.wait_ready(600)
        request, reply_header = _record(urls["new"], op, n)
        raw_request = request[:1] if shm else request
        procs["raw"] = subprocess.Popen([sys.executable, "-c", SERVER, urls["raw"], op, str(n), "-"])
        socks = {k: _dealer(u) for k, u in urls.items()}
        socks["raw"].send_multipart([reply_header])
        socks["raw"].recv_multipart()
        for k in ("new", "base"):  # each worker's reply must be a result, or the figures mean nothing
            socks[k].send_multipart(request)
            got = socks[k].recv_multipart()
            assert b"result" in got[0], (k, got[0][:200])
        cpu: dict = {k: [] for k in urls}
        main: dict = {k: [] for k in urls}
        for _ in range(rounds):
            for k in ("base", "new", "raw"):
                c, m = _round(socks[k], procs[k].pid, raw_request if k == "raw" else request, calls)
                cpu[k].append(c)
                main[k].append(m)
        fusion_shim.uninstall()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        for seg in kept:
            unlink(seg)
    med = statistics.median
    out = {f"{k}_cpu_us": med(v) * 1e6 for k, v in cpu.items()}
    out.update({f"{k}_main_us": med(v) * 1e6 for k, v in main.items()})
    out["new_over_base"] = med(a / b for a, b in zip(cpu["new"], cpu["base"]))
    out["new_over_raw"] = med(a / b for a, b in zip(cpu["new"], cpu["raw"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("base_tree")
    p.add_argument("--case", action="append", choices=[c for c in CASES if c.endswith("-ipc")])
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    for case in args.case or ["dot1-ipc", "matmul64-ipc", "dot1m_shm-ipc"]:
        r = run(os.path.abspath(args.base_tree), case, args.rounds, args.calls)
        print(f"{case}: worker CPU per request base {r['base_cpu_us']:.0f} us (main {r['base_main_us']:.0f}), "
              f"new {r['new_cpu_us']:.0f} (main {r['new_main_us']:.0f}), raw server {r['raw_cpu_us']:.0f}; "
              f"new/base {r['new_over_base']:.3f}, new/raw {r['new_over_raw']:.2f}", flush=True)


if __name__ == "__main__":
    main()

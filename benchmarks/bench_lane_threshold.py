"""Where the shared-memory lane starts to pay: a forced-remote call through the lane against the
same call through the socket, measured alternately in one run (D39).

    python -m pytest benchmarks/bench_lane_threshold.py --benchmark-only -s

An ``np.dot`` of two float64 vectors (its kernel reads each byte once: the call is its transfer)
under ``policy remote``, residency off (every call
sends its inputs: with it on, the larger ones would stay on the worker after the first), to a
``fusion-shim worker --device cpu`` process over ``ipc://``: every buffer through the lane
(``MIN_BYTES`` 0) against none (shared memory off), alternately, ``CALLS`` calls each per round,
the median of the per-round ratios. Target: below ``MIN_BYTES`` the socket is not slower than the
lane (else the threshold is too high); at and above it the figures are reported, for the threshold
to follow where the lane starts to pay on the host it serves (D39).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.transport import shm, shm_client

ROUNDS = 8
SIZES_KIB = [128, 512, 1024, 2048, 8192]  # each input's size: below MIN_BYTES (256 KiB), then above it


@pytest.fixture(scope="module")
def worker():
    d = tempfile.mkdtemp(prefix="fs-bench-lane-")
    url = f"ipc://{d}/w.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                            stderr=subprocess.DEVNULL, env=env)
    yield url
    proc.kill()
    proc.wait()


def _per_call(url: str, a: np.ndarray, b: np.ndarray, calls: int, lane: bool, monkeypatch) -> float:
    monkeypatch.setenv("FUSION_SHIM_SHM", "auto" if lane else "0")
    monkeypatch.setenv("FUSION_SHIM_RESIDENCY", "0")
    if lane:
        monkeypatch.setattr(shm_client, "MIN_BYTES", 0)
    rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=600)
    try:
        assert rt.link.wait_ready(600)
        for _ in range(5):
            np.dot(a, b)
        t = time.perf_counter()
        for _ in range(calls):
            np.dot(a, b)
        per_call = (time.perf_counter() - t) / calls
        recs = rt.ledger.records[-calls:]
        assert all(r.kind == "worker" for r in recs)
        assert all((r.shm_sent > 0) == lane for r in recs), "the call did not take the lane it was meant to"
        return per_call
    finally:
        fusion_shim.uninstall()
        monkeypatch.undo()


@pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine")
@pytest.mark.parametrize("kib", SIZES_KIB)
def test_the_lane_against_the_socket(benchmark, worker, kib, monkeypatch):
    n = kib * 1024 // 8
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    calls = max(10, int(40_000 // kib))
    lane_t, sock_t = [], []

    def one_round():
        lane_t.append(_per_call(worker, a, b, calls, True, monkeypatch))
        sock_t.append(_per_call(worker, a, b, calls, False, monkeypatch))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    ratio = statistics.median(s / l for s, l in zip(sock_t, lane_t))
    below = n * 8 < shm_client.MIN_BYTES
    benchmark.extra_info.update({"input_kib": kib, "lane_us": statistics.median(lane_t) * 1e6,
                                 "socket_us": statistics.median(sock_t) * 1e6, "socket_vs_lane": ratio,
                                 "below_min_bytes": below})
    print(f"\n{kib} KiB float64 vectors: lane {statistics.median(lane_t) * 1e6:.0f} us, "
          f"socket {statistics.median(sock_t) * 1e6:.0f} us a call: socket / lane {ratio:.2f} "
          f"({'below' if below else 'at or above'} MIN_BYTES, {shm_client.MIN_BYTES >> 10} KiB)")
    if below:
        assert ratio <= 1.0, f"the socket is slower than the lane below MIN_BYTES: {ratio:.2f}"

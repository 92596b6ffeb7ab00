"""A pool's worker against the same worker started directly, measured in the same run, and the time
from ``pool up`` to the first ready call.

    python -m pytest benchmarks/bench_pool.py --benchmark-only -s

A local Ray cluster (``ray.init``) with one pool worker on the CPU (bound to the address Ray gives
this node: this machine's own), and a ``fusion-shim worker --device cpu --keys DIR`` process on
loopback tcp: both CURVE, both torch on the CPU of this machine. The same small program (``SMALL``: 200 products of two 64x64 float64
arrays under ``policy remote``, residency off, the per-call median printed) runs through each,
alternately, ``ROUNDS`` times; the ratio is the median of the per-round ratios (the machine is
shared: a load spike should hit both or neither). ``pool up`` to first call: from the start of
``manage.up`` to the first ``ready`` answer on the worker's socket (its torch import and warm-up
included). The residency benchmark's power iteration (``_iterative.py``, as in bench_residency.py)
runs through a pool worker with residency on and off: bytes sent and wall time.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from fusion_shim import transport  # noqa: E402
from fusion_shim.pool import NAMESPACE, manage  # noqa: E402
from fusion_shim.protocol import messages  # noqa: E402

HERE = Path(__file__).parent
ROUNDS = 5
SMALL = """
import statistics, time, numpy as np
a = np.ones((64, 64)); b = np.ones((64, 64))
a @ b  # the first call waits for the worker to be ready
times = []
for _ in range(200):
    t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _per_call_s(script: str, options: list[str]) -> float:
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--quiet", *options, script],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "FUSION_SHIM_RESIDENCY": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
             namespace=NAMESPACE, log_to_driver=False, object_store_memory=80 << 20, configure_logging=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_pool_up_to_first_ready_call(benchmark, cluster):
    import zmq

    def up_and_call() -> float:
        t = time.perf_counter()
        manage.up(cluster, 1, "cpu", name="bench-up")
        public, secret = zmq.curve_keypair()
        d = ray.get(ray.get_actor("bench-up.0").join.remote(public), timeout=300)
        chan = transport.Channel(d["url"], (d["server_key"], public, secret), None, None)
        try:
            assert chan.request(messages.hello(1), time.monotonic() + 300).header["t"] == "ready"
        finally:
            chan.close()
        took = time.perf_counter() - t
        manage.down(cluster, "bench-up")
        return took

    took = benchmark.pedantic(up_and_call, rounds=1, iterations=1)
    benchmark.extra_info["up_to_first_call_s"] = took
    print(f"\npool up (1 CPU worker) to its first ready call: {took:.2f} s")


def test_small_calls_through_a_pool_worker_against_the_same_worker_started_directly(benchmark, cluster, tmp_path):
    script = tmp_path / "small.py"
    script.write_text(SMALL)
    keys = tempfile.mkdtemp(prefix="fusion-shim-bench-keys-")
    subprocess.run([sys.executable, "-m", "fusion_shim", "keys", keys, "--client", "bench"], check=True,
                   capture_output=True, timeout=120)
    url = f"tcp://127.0.0.1:{_free_port()}"
    direct = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu",
                               "--keys", keys], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manage.up(cluster, 1, "cpu", name="bench")
    direct_opts = ["--worker", url, "--server-key", f"{keys}/server.key", "--client-keys", f"{keys}/bench.key_secret"]
    pool_opts = ["--pool", f"ray://{cluster}/bench"]
    try:
        def rounds() -> list[tuple[float, float]]:
            return [(_per_call_s(str(script), pool_opts), _per_call_s(str(script), direct_opts))
                    for _ in range(ROUNDS)]

        pairs = benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        direct.terminate()
        direct.wait(30)
        manage.down(cluster, "bench")
    ratio = statistics.median(p / d for p, d in pairs)
    pool_us = statistics.median(p for p, _ in pairs) * 1e6
    direct_us = statistics.median(d for _, d in pairs) * 1e6
    benchmark.extra_info.update(ratio=ratio, pool_us=pool_us, direct_us=direct_us)
    print(f"\n64x64 matmul, per call (median of {ROUNDS} rounds of 200): pool worker {pool_us:.0f} us, "
          f"direct worker {direct_us:.0f} us, ratio {ratio:.3f}")


def _iterative(options: list[str], residency: bool) -> dict:
    """bench_residency's power iteration (a 64 MiB matrix, 100 steps), through ``options``' worker."""
    report = Path(tempfile.mkdtemp(prefix="fusion-shim-bench-")) / "r.json"
    env = {**os.environ, "FUSION_SHIM_RESIDENCY": "1" if residency else "0", "FUSION_SHIM_SHM": "0"}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "--quiet", "--policy", "remote", *options,
                          "--report", str(report), str(HERE / "_iterative.py"), "power", "100"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(report.read_text())
    return {"wall_s": time.perf_counter() - t, "result": json.loads(out.stdout)["result"],
            "sent": rep["summary"]["bytes_sent"], "hits": rep["summary"]["residency"]["resident_hits"]}


def test_residency_through_a_pool_worker(benchmark, cluster):
    manage.up(cluster, 1, "cpu", name="bench-res")
    options = ["--pool", f"ray://{cluster}/bench-res"]
    try:
        off = _iterative(options, residency=False)
        on = benchmark.pedantic(_iterative, args=(options, True), rounds=1, iterations=1)
    finally:
        manage.down(cluster, "bench-res")
    benchmark.extra_info.update(sent_on=on["sent"], sent_off=off["sent"], wall_on_s=on["wall_s"],
                                wall_off_s=off["wall_s"])
    print(f"\npower iteration through the pool: sent {on['sent'] / 2**20:.1f} MiB with residency, "
          f"{off['sent'] / 2**20:.1f} MiB without ({on['hits']} inputs by reference); wall {on['wall_s']:.1f}s vs "
          f"{off['wall_s']:.1f}s")
    assert on["result"] == pytest.approx(off["result"], rel=1e-9)
    assert on["sent"] < off["sent"] / 10

"""The worker's self-benchmark cache (D58): reused on this boot for the same device and build,
taken again when stale, foreign-writable, or asked for."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fusion_shim.protocol import messages
from fusion_shim.transport import Channel

torch = pytest.importorskip("torch")

from fusion_shim.worker import bench  # noqa: E402
from fusion_shim.worker.backend import TorchBackend  # noqa: E402

BENCH = {"products": 50.0, "points": {"products/f8": [[2e6, 1e-4]]}, "ops": {}, "others_busy": [0.01]}


def test_a_saved_benchmark_is_reused_with_its_age_and_only_for_its_own_key(tmp_path):
    key = bench.cache_key(TorchBackend("cpu"))
    assert key["boot"] and key["device"] == "cpu" and key["cpus"]
    bench.save_cached(key, BENCH, str(tmp_path), now=lambda: 1000.0)
    got = bench.load_cached(key, str(tmp_path), now=lambda: 1090.0)
    assert got == {**BENCH, "cached_s": 90.0}
    assert bench.load_cached({**key, "threads": key["threads"] + 1}, str(tmp_path)) is None
    assert bench.load_cached({**key, "boot": "another boot"}, str(tmp_path)) is None
    assert bench.load_cached(key, str(tmp_path), now=lambda: 1000.0 + bench.CACHE_CLEAN_S + 1) is None
    assert bench.load_cached(key, str(tmp_path), now=lambda: 999.0) is None  # taken in the future: a bad clock


def test_a_contended_benchmark_is_reused_for_a_shorter_time(tmp_path):
    key = bench.cache_key(TorchBackend("cpu"))
    bench.save_cached(key, {**BENCH, "contended": True}, str(tmp_path), now=lambda: 0.0)
    assert bench.load_cached(key, str(tmp_path), now=lambda: bench.CACHE_CONTENDED_S - 1) is not None
    assert bench.load_cached(key, str(tmp_path), now=lambda: bench.CACHE_CONTENDED_S + 1) is None


def test_a_cache_file_others_could_write_is_not_trusted(tmp_path):
    key = bench.cache_key(TorchBackend("cpu"))
    bench.save_cached(key, BENCH, str(tmp_path))
    path = bench.cache_file(key, str(tmp_path))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert bench.load_cached(key, str(tmp_path)) is not None
    os.chmod(path, 0o666)
    assert bench.load_cached(key, str(tmp_path)) is None
    os.chmod(path, 0o600)
    with open(path, "w") as f:
        f.write("{not json")
    assert bench.load_cached(key, str(tmp_path)) is None
    with open(path, "w") as f:
        json.dump({"key": key, "taken": time.time(), "bench": [1, 2]}, f)
    assert bench.load_cached(key, str(tmp_path)) is None


def _ready(tmp_path, cache, *extra):
    url = f"ipc://{tmp_path}/w.sock"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", *extra],
                            env=env, stderr=subprocess.DEVNULL)
    chan = Channel(url, alive=lambda: proc.poll() is None)
    try:
        return chan.request(messages.hello(1), time.monotonic() + 600).header
    finally:
        chan.close()
        proc.kill()
        proc.wait()


def test_a_second_worker_of_the_host_reuses_the_first_ones_benchmark(tmp_path, sock_dir):
    cache = tmp_path / "cache"
    first = _ready(sock_dir, cache)["bench"]
    second = _ready(sock_dir, cache)["bench"]
    fresh = _ready(sock_dir, cache, "--fresh-bench")["bench"]
    assert "cached_s" not in first and "cached_s" not in fresh
    assert second["cached_s"] >= 0 and second["points"] == first["points"] and second["ops"] == first["ops"]
    assert fresh["points"] != first["points"]  # measured again: no two timings agree to the nanosecond


def test_the_planner_says_a_benchmark_was_reused():
    from fusion_shim.plan.planner import Planner

    said = []
    planner = Planner("auto", on_event=said.append)
    planner.worker_ready(0, {**BENCH, "cached_s": 180.0}, rtt=1e-4)
    assert any("reused from its host's cache (taken 3 min ago" in s and "--fresh-bench" in s for s in said)

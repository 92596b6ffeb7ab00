"""Issue 8, fuzzing a live worker: 2,000 mutated messages over an authenticated CURVE connection
to a real worker process (torch kernels, CPU). Same pid afterwards, memory back within 5% of the
baseline, every message malformed on the wire answered with an error, no result other than the
one a request declares. The 10,000-message run is benchmarks/bench_fuzz.py (figures in
benchmarks/RESULTS.md); tests/helpers/fuzz.py has the mutation operators.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import zmq

from fusion_shim import auth, transport

from tests.helpers import fuzz as _fuzz
from tests.helpers.shims import READY_S

PY = sys.executable
BUDGET = 256 << 20  # the worker's --max-bytes: fuzzed sizes stay far from the machine's memory


def start_worker(tmp_path) -> tuple[subprocess.Popen, str, tuple]:
    keys = tmp_path / "keys"
    auth.make_keys(str(keys), ["fuzzer"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", "--keys", str(keys),
                             "--max-bytes", str(BUDGET)], env=_fuzz.worker_env(), stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "worker.log", "wb"))
    curve = (auth.load_public(str(keys / "server.key")), *auth.load_pair(str(keys / "fuzzer.key_secret")))
    return proc, url, curve


def connect(url: str, curve: tuple) -> zmq.Socket:
    sock = transport.context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve
    sock.connect(url)
    return sock


def fuzz_live_worker(tmp_path, n: int, seed: int) -> dict:
    proc, url, curve = start_worker(tmp_path)
    sock = connect(url, curve)
    try:
        import msgpack

        sock.send_multipart([msgpack.packb({"v": 1, "t": "hello", "id": 1})])
        assert sock.poll(int(READY_S * 1000)), "the worker never answered"  # it warms first
        sock.recv_multipart()
        res = _fuzz.run_fuzz(sock, proc.pid, n, seed, max_bytes=BUDGET)
        res["alive"] = proc.poll() is None
        res["pid"] = proc.pid
        return res
    finally:
        sock.close(0)
        proc.kill()
        proc.wait(10)


def test_fuzz_live_worker_2000_messages(tmp_path):
    res = fuzz_live_worker(tmp_path, 2000, seed=8)
    print(json.dumps({k: v for k, v in res.items() if k != "failures"}, indent=1))
    assert res["failures"] == [], res["failures"][:10]
    assert res["alive"] and res["pid_after"] == res["pid"]
    assert res["wire_invalid"] > 500 and res["wire_invalid_error"] == res["wire_invalid"], res
    assert res["valid_error"] > 100 and res["valid_result"] > 50, res  # the mutations reach past the wire too
    assert res["rss_ratio"] <= 1.05, res

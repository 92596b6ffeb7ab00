"""A call whose shapes make more result elements than it declares is refused before anything is
computed (D61): tiny inputs cannot make the worker allocate a huge result. Every catalog row's
honest calls still run on the worker (tests/catalog asserts each one did)."""
from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel
from fusion_shim.catalog.facts import by_kernel, result_elements
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

# op, inputs, params, what NumPy makes of them (its result shapes): each amplifies its inputs
AMPLIFIERS = [
    ("kron", [np.ones((160, 160)), np.ones((100, 100))], {}, [(16000, 16000)]),
    ("outer", [np.ones(16000), np.ones(16000)], {}, [(16000, 16000)]),
    ("einsum", [np.ones(16000), np.ones(16000)], {"subscripts": "i,j->ij"}, [(16000, 16000)]),
    ("einsum", [np.ones((4000, 1)), np.ones((1, 4000))], {"subscripts": "ij,jk"}, [(4000, 4000)]),
    ("matmul", [np.ones((16000, 1)), np.ones((1, 16000))], {}, [(16000, 16000)]),
    ("dot", [np.ones((16000, 1)), np.ones((1, 16000))], {}, [(16000, 16000)]),
    ("tensordot", [np.ones(16000), np.ones(16000)], {"axes": [[], []]}, [(16000, 16000)]),
    ("linalg.svd", [np.ones((16000, 1))], {"compute_uv": True, "full_matrices": True, "hermitian": False},
     [(16000, 16000), (1,), (1, 1)]),
    ("linalg.qr", [np.ones((16000, 1))], {"mode": "complete"}, [(16000, 16000), (16000, 1)]),
]


def _numpy(op: str, arrays: list, params: dict) -> list:
    small = [a[: min(a.shape[0], 7)] if a.ndim == 1 else a[: min(a.shape[0], 7), : min(a.shape[1], 5)]
             for a in arrays]  # NumPy's shapes for small stand-ins, to check each rule against NumPy
    f = {"kron": np.kron, "outer": np.outer, "matmul": np.matmul, "dot": np.dot,
         "einsum": lambda *a: np.einsum(params["subscripts"], *a),
         "tensordot": lambda a, b: np.tensordot(a, b, axes=params["axes"]),
         "linalg.svd": lambda a: np.linalg.svd(a, full_matrices=True),
         "linalg.qr": lambda a: np.linalg.qr(a, mode="complete")}[op]
    out = f(*small)
    return small, list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("op,arrays,params,shapes", AMPLIFIERS, ids=lambda v: v if isinstance(v, str) else None)
def test_each_rule_gives_numpys_count(op, arrays, params, shapes):
    assert result_elements(op, [a.shape for a in arrays], params) == sum(math.prod(s) for s in shapes)
    small, out = _numpy(op, arrays, params)
    assert result_elements(op, [a.shape for a in small], params) == sum(r.size for r in out)


def _call(rid: int, op: str, arrays: list, params: dict, declared: list) -> messages.Request:
    header = messages.call_header(rid, op, {"cdtype": "<f8", **params}, ["C"] * len(declared),
                                  [("<f8", s) for s in declared])
    return messages.Request(header, [wire.to_wire(a) for a in arrays])


@pytest.mark.parametrize("op,arrays,params,shapes", AMPLIFIERS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_call_that_declares_less_than_it_makes_is_refused_before_it_runs(op, arrays, params, shapes, monkeypatch):
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    ran = []
    monkeypatch.setattr(w.backend, "compute", lambda *a, **k: ran.append(op))
    monkeypatch.setattr(w.backend, "to_device", lambda *a, **k: ran.append(op))
    small = [(1,)] * len(shapes)  # a request that says its results are tiny
    reply, _ = wire.decode(w.handle(_call(1, op, arrays, params, small).frames()))
    assert reply["t"] == "error" and reply["kind"] == "bad_request" and "result elements" in reply["msg"], reply
    assert ran == []  # refused before a byte went to the device


def test_rules_exist_only_where_results_can_outgrow_inputs():
    from fusion_shim.worker.kernels import KERNELS

    sized = {op for op, facts in by_kernel().items() if facts.result_size is not None}
    assert sized <= set(KERNELS)
    assert {"kron", "outer", "einsum", "matmul", "linalg.svd", "linalg.qr", "linalg.lstsq"} <= sized


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def test_amplifying_requests_leave_a_worker_process_up_and_small(sock_dir):
    """A real worker, sent each amplifier with tiny declared results: each is refused, the worker
    keeps its pid and its peak memory does not grow by the 2 GB a single result would take."""
    url = f"ipc://{sock_dir}/w.sock"
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                            stderr=subprocess.DEVNULL)
    chan = Channel(url)
    try:
        hello = chan.request(messages.hello(1), time.monotonic() + READY_S).header
        assert hello["t"] == "ready"
        before = _peak_rss(proc.pid)
        for rid, (op, arrays, params, shapes) in enumerate(AMPLIFIERS, 2):
            reply = chan.request(_call(rid, op, arrays, params, [(1,)] * len(shapes)), time.monotonic() + READY_S)
            assert reply.header["t"] == "error" and reply.header["kind"] == "bad_request", (op, reply.header)
        assert proc.poll() is None and chan.request(messages.hello(99), time.monotonic() + READY_S).header["pid"] == proc.pid
        assert _peak_rss(proc.pid) - before < 256 << 20  # a single 16000^2 result is 2 GB
    finally:
        chan.close()
        proc.kill()
        proc.wait()

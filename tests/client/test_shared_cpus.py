"""Under ``auto`` a worker started elsewhere that computes on this host's CPUs (a tcp worker here, a pool's
worker on this host) gets no call where the embedded CPU worker would not start (D301, D40's rule); the
evidence that opens a pool under ``auto`` (D302). The pool's own runs are in tests/pool/test_pool_lazy.py."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.plan.cpuwins import CpuWin, shared_worker_why
from fusion_shim.plan.poolopen import PoolEvidence
from tests.helpers.shims import READY_S

pytestmark = pytest.mark.usefixtures("no_shim_after")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_on_this_hosts_cpus_gets_no_reason_to_be_used_by_the_measured_table():
    why = shared_worker_why()
    assert why is not None and "x2.77" in why  # no op of the table wins by the first-call margin


def test_a_table_with_an_op_won_by_more_than_the_margin_lets_the_worker_be_used():
    assert shared_worker_why((CpuWin("numpy.fft.fft", 1 << 20, 5.0),)) is None


def test_a_tcp_cpu_worker_on_this_host_gets_no_call_under_auto_and_every_answer_is_numpys():
    from fusion_shim.worker import serve_in_thread

    a = np.random.default_rng(3).standard_normal((600, 600))
    want = a @ a  # plain NumPy: no shim yet
    url = f"tcp://127.0.0.1:{_free_port()}"
    thread, stop = serve_in_thread(url, device="cpu", insecure=True)
    try:
        rt = fusion_shim.install(policy="auto", worker=url, quiet=True, insecure=True)
        deadline = time.monotonic() + READY_S
        while rt.link.state == "starting" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rt.link.state == "shared_cpus", rt.ledger.events
        for _ in range(20):
            np.testing.assert_array_equal(a @ a, want)
        assert rt.link.calls == 0
        assert any("computes on this host's CPUs: under auto it gets no call" in e["what"]
                   for e in rt.ledger.snapshot()["events"])
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(10)


def test_the_same_worker_under_remote_gets_the_calls():
    from fusion_shim.worker import serve_in_thread

    a = np.random.default_rng(4).standard_normal((300, 300))
    want = a @ a
    url = f"tcp://127.0.0.1:{_free_port()}"
    thread, stop = serve_in_thread(url, device="cpu", insecure=True)
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, insecure=True)
        np.testing.assert_allclose(a @ a, want, rtol=1e-9, atol=1e-9)
        assert rt.link.calls >= 1 and rt.link.state == "ready"
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(10)


def test_pool_evidence_counts_calls_from_its_floor_and_says_enough_once():
    ev = PoolEvidence(["numpy.matmul"], floor=1000, open_after_s=1.0)
    assert ev.floors() == {"numpy.matmul": 1000}
    assert not ev.observe("numpy.matmul", 999, 5.0)  # below the floor: not evidence
    assert not ev.observe("numpy.matmul", 1000, 0.6)
    assert ev.observe("numpy.matmul", 5000, 0.6)
    assert not ev.observe("numpy.matmul", 5000, 0.6) and ev.calls == 2
    assert "2 calls" in ev.describe() and "1.2 s" in ev.describe()

"""Uploads are kept only under the fingerprint of the bytes that came (D59): a client that tags
other bytes with a fingerprint, by mistake or to poison the store, cannot change another call's
answer."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.fingerprint import fingerprint
from fusion_shim.transport import Channel
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

N = 600


def _poison(chan: Channel, victim: np.ndarray, rid: int) -> dict:
    """A call whose two inputs are zeros tagged with the fingerprint of ``victim``, asking to keep them."""
    fp = fingerprint(*wire.to_wire(victim))
    zeros = wire.to_wire(np.zeros_like(victim))
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", victim.shape)], keep=True)
    # READY_S: the worker answers once warm, its self-benchmark maybe taken again beside other work
    return chan.request(messages.Request(header, [zeros, zeros], [fp, fp]), time.monotonic() + READY_S).header


def test_a_worker_keeps_no_upload_whose_bytes_do_not_hash_to_its_tag():
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    victim = np.random.default_rng(42).standard_normal((N, N))
    fp = fingerprint(*wire.to_wire(victim))
    zeros = wire.to_wire(np.zeros_like(victim))
    header = messages.call_header(1, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", victim.shape)], keep=True)
    reply, arrays = wire.decode(w.handle(messages.Request(header, [zeros, zeros], [fp, fp]).frames()))
    assert reply["t"] == "result" and not arrays[0].any()  # the call itself is answered for the bytes it sent
    assert fp not in w.store and reply["kept"] == [] and reply["timing"]["fingerprint"] > 0
    header = messages.call_header(2, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", victim.shape)], keep=True)
    honest = wire.to_wire(victim)
    reply, _ = wire.decode(w.handle(messages.Request(header, [honest, honest], [fp, fp]).frames()))
    assert fp in w.store and reply["kept"] == [fp]
    stats, _ = wire.decode(w.handle(messages.stats_request(3).frames()))
    assert stats["fingerprint_mismatches"] == 2  # both inputs of the first call


def test_a_poisoning_client_leaves_anothers_answers_right(sock_dir):
    """Two clients of one worker process: the attacker uploads zeros under the fingerprint of the
    victim's predictable matrix before and while the victim computes; every answer stays right."""
    url = f"ipc://{sock_dir}/w.sock"
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                            stderr=subprocess.DEVNULL)
    attacker = Channel(url)
    try:
        victim = np.random.default_rng(42).standard_normal((N, N))
        assert _poison(attacker, victim, 1)["t"] == "result"
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True)
        try:
            assert rt.link.wait_ready(READY_S)
            b = np.random.default_rng(1).standard_normal((N, N))
            want = np.matmul.__wrapped__(victim, b)
            for i in range(20):
                np.testing.assert_allclose(np.matmul(victim, b), want, rtol=1e-10, atol=1e-10 * N)
                if i == 3:
                    _poison(attacker, victim, 2)
            hits = sum(r.resident_hits for r in rt.ledger.records)
            assert hits >= 19  # the victim's own upload was kept and reused: the attack had its chance
        finally:
            fusion_shim.uninstall()
    finally:
        attacker.close()
        proc.kill()
        proc.wait()

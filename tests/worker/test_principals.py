"""Principals (D60): a worker keeps each client's data under the principal of its connection (a
CURVE key, an ipc peer's uid). Another principal's resident entry answers as if absent, its
stats show nothing of it, its segments cannot be named, and its out of memory evicts only its own."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from fusion_shim import auth
from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.fingerprint import fingerprint
from fusion_shim.transport import Answer, Channel
from fusion_shim.transport.principal import ANON, Principal, principal_of
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

N = 300
ALICE, MALLORY = Principal("key:alice", None), Principal("key:mallory", None)


def _keep_call(rid: int, a: np.ndarray, ref: bool = False) -> messages.Request:
    """``a @ a``, its input tagged with its fingerprint (which keeps it); ``ref``: sent as a reference."""
    fp = fingerprint(*wire.to_wire(a))
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", a.shape)])
    return messages.Request(header, [wire.to_wire(a)] * 2, [fp, fp], refs=(0, 1) if ref else ())


def _answer(worker, req: messages.Request, who: Principal) -> tuple[dict, list]:
    return wire.decode(worker.handle(req.frames(), who))


def _without_id(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k != "id"}


def test_anothers_entry_answers_as_if_absent_and_their_stats_show_nothing_of_it():
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    secret = np.random.default_rng(42).standard_normal((N, N))
    reply, _ = _answer(w, _keep_call(1, secret), ALICE)
    fp = fingerprint(*wire.to_wire(secret))
    assert reply["t"] == "result" and reply["kept"] == [fp]
    probe, _ = _answer(w, _keep_call(2, secret, ref=True), MALLORY)
    guess, _ = _answer(w, _keep_call(2, np.random.default_rng(7).standard_normal((N, N)), ref=True), MALLORY)
    assert probe["t"] == "error" and probe["kind"] == "missing" and probe["missing"] == [fp, fp]
    assert _without_id(probe) == {**_without_id(guess), "missing": [fp, fp]}  # held elsewhere reads as never held
    mine, arrays = _answer(w, _keep_call(3, secret, ref=True), ALICE)
    np.testing.assert_allclose(arrays[0], secret @ secret)
    seen = {who: wire.decode(w.handle(messages.stats_request(4).frames(), who))[0] for who in (ALICE, MALLORY)}
    assert seen[ALICE]["resident_entries"] == 1 and seen[ALICE]["resident_hits"] == 2
    assert seen[MALLORY]["resident_entries"] == 0 and seen[MALLORY]["resident_bytes"] == 0
    assert seen[MALLORY]["calls"] == 0 == seen[ALICE]["calls"]  # counted at the socket, none here
    assert seen[MALLORY]["resident_hits"] == 0 and seen[MALLORY]["resident_misses"] == 4


def test_one_principals_out_of_memory_evicts_only_its_own_entries(monkeypatch):
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    rng = np.random.default_rng(3)
    alices = [rng.standard_normal((N, N)) for _ in range(3)]
    for i, a in enumerate(alices):
        assert _answer(w, _keep_call(i, a), ALICE)[0]["t"] == "result"
    earlier = rng.standard_normal((N, N))
    assert _answer(w, _keep_call(9, earlier), MALLORY)[0]["t"] == "result"
    compute = w.backend.compute
    failed = []

    def out_of_memory_once(*args, **kwargs):
        if not failed:
            failed.append(1)
            raise RuntimeError("CUDA out of memory (simulated)")
        return compute(*args, **kwargs)

    monkeypatch.setattr(w.backend, "compute", out_of_memory_once)
    reply, _ = _answer(w, _keep_call(10, rng.standard_normal((N, N))), MALLORY)
    assert failed and reply["t"] == "result" and reply["timing"]["oom_retry"] == 1.0
    assert reply["evicted"] == [fingerprint(*wire.to_wire(earlier))]  # its own, named to it
    for a in alices:  # alice's entries stay, and answer her references
        assert w.store.holds(ALICE.name, fingerprint(*wire.to_wire(a)))
    assert _answer(w, _keep_call(11, alices[0], ref=True), ALICE)[0]["t"] == "result"


def test_room_is_made_from_the_callers_own_entries_first_and_anothers_eviction_is_not_named_to_it():
    import torch

    from fusion_shim.worker.store import ResidentStore

    meta = {"dtype": "<f8", "shape": [128], "order": "C"}
    store = ResidentStore(3 * 1024)  # room for three
    for fp in ("a1", "a2"):
        store.put("alice", fp, torch.zeros(128, dtype=torch.float64), meta)
    store.put("mallory", "m1", torch.zeros(128, dtype=torch.float64), meta)
    assert store.put("alice", "a3", torch.zeros(128, dtype=torch.float64), meta) == ["a1"]  # hers, not mallory's
    assert store.holds("mallory", "m1") and not store.holds("alice", "a1")
    # mallory over her room: alice's oldest goes, and is not named to mallory
    assert store.put("mallory", "m2", torch.zeros(128, dtype=torch.float64), meta, pinned={"m1"}) == []
    assert not store.holds("alice", "a2") and store.holds("mallory", "m1") and store.holds("mallory", "m2")
    # D196: her own put's eviction is counted, mallory's taking of a2 (past alice's share) is not
    assert store.stats("alice")["resident_entries"] == 1 and store.stats("alice")["evictions"] == 1
    assert store.nbytes == 3 * 1024


def test_the_principal_of_a_connection_is_its_curve_key_or_its_ipc_peers_uid():
    import os

    import zmq

    ctx = zmq.Context.instance()
    path = f"/tmp/fs-principal-{os.getpid()}.sock"
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind(f"ipc://{path}")
        dealer.connect(f"ipc://{path}")
        dealer.send(b"x")
        assert router.poll(int(READY_S * 1000))
        frames = router.recv_multipart(copy=False)
        assert principal_of(frames[1], curve=False) == Principal(f"uid:{os.getuid()}", os.getuid())
    finally:
        router.close(0)
        dealer.close(0)
        if os.path.exists(path):
            os.unlink(path)
    assert principal_of(b"no metadata", curve=True) == ANON


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_allow_listed_key_can_neither_see_nor_poison_anothers_data(tmp_path):
    """A real worker process with two allow-listed CURVE clients: the attacker's probes of the
    victim's fingerprint read as absent, its upload of other bytes under that fingerprint changes
    none of the victim's answers, and its stats count none of the victim's calls."""
    keys = tmp_path / "keys"
    auth.make_keys(str(keys), ["alice", "mallory"])
    server = auth.load_public(str(keys / "server.key"))

    def channel(name: str) -> Channel:
        public, secret = auth.load_pair(str(keys / f"{name}.key_secret"))
        return Channel(url, curve=(server, public, secret))

    url = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu",
                             "--keys", str(keys)], stderr=subprocess.DEVNULL)
    victim, attacker = channel("alice"), channel("mallory")

    def ask(chan: Channel, req: messages.Request) -> Answer:
        # READY_S: the worker answers once warm, its self-benchmark maybe taken again beside other work
        return chan.request(req, time.monotonic() + READY_S)

    try:
        secret = np.random.default_rng(42).standard_normal((N, N))
        fp = fingerprint(*wire.to_wire(secret))
        assert ask(victim, _keep_call(1, secret)).header["kept"] == [fp]
        probe = ask(attacker, _keep_call(2, secret, ref=True)).header
        assert probe["t"] == "error" and probe["kind"] == "missing"
        zeros = wire.to_wire(np.zeros_like(secret))
        header = messages.call_header(3, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", secret.shape)])
        assert ask(attacker, messages.Request(header, [zeros, zeros], [fp, fp])).header["t"] == "result"
        for rid in range(4, 9):
            answer = ask(victim, _keep_call(rid, secret, ref=True))
            assert answer.header["t"] == "result"
            np.testing.assert_allclose(answer.arrays[0], secret @ secret, rtol=1e-10, atol=1e-10 * N)
        seen = ask(attacker, messages.stats_request(9)).header
        assert seen["calls"] == 2 and seen["resident_entries"] == 0 and seen["fingerprint_mismatches"] == 2
        assert ask(victim, messages.stats_request(10)).header["calls"] == 6
        assert proc.poll() is None
    finally:
        victim.close()
        attacker.close()
        proc.kill()
        proc.wait()

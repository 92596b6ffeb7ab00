"""Replies nobody reads count against their principal's budget, and requests past it are answered
``busy``, none dropped (D270, D271); and after a large request
the worker takes every request waiting on the socket into its per-principal queue, answering those
past the principal's budget ``busy`` at once (D197) instead of leaving them in libzmq's queues."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel
from fusion_shim.worker.inbox import principal_budget
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

MIB = 1 << 20


def _echo(rid: int, x: np.ndarray) -> list:
    header = messages.call_header(rid, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
    return messages.Request(header, [wire.to_wire(x)]).frames()


def _worker(url: str, delay: float = 0.0):
    from fusion_shim.worker.server import serve_in_thread
    from fusion_shim.worker.testing import FaultyWorker

    return serve_in_thread(url, worker=FaultyWorker("cpu", max_bytes=64 * MIB, delay=delay, bench_cache=True))


def _dealer(url: str, **opts: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in opts.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(url)
    return sock


def _answered(worker, n: int) -> None:
    """Wait until the worker has answered ``n`` requests of this test's principal, calls or ``busy``."""
    deadline = time.monotonic() + READY_S
    while sum(t["calls"] + t["busy"] for t in list(worker.traffic.values())) < n:
        assert time.monotonic() < deadline, f"the worker did not answer {n} requests: {worker.traffic}"
        time.sleep(0.05)


@pytest.mark.parametrize("connections", [1, 8])
def test_replies_nobody_reads_are_bounded_per_principal_and_the_rest_answered_busy(sock_dir, connections):
    url = f"ipc://{sock_dir}/w.sock"
    thread, stop = _worker(url)
    chan = Channel(url)
    readers = [_dealer(url, RCVHWM=1, SNDHWM=0) for _ in range(connections)]
    per, size = 40 // connections, 4 * MIB
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        for c, reader in enumerate(readers):
            for rid in range(per):
                reader.send_multipart(_echo(1000 * c + rid + 2, np.ones(size // 8)), copy=False)
        _answered(thread.worker, per * connections)
        # a probe's small reply is taken past the bound: the worker is not taken for down
        assert chan.request(messages.hello(3), time.monotonic() + READY_S).header["t"] == "ready"
        answers: dict = {}
        for reader in readers:  # every request is answered: a busy reply is small, never dropped
            for _ in range(per):
                assert reader.poll(READY_S * 1000), f"a reply was dropped: {answers}"
                header = wire.decode_header(reader.recv_multipart()[0])
                kind = header.get("kind", header["t"])
                answers[kind] = answers.get(kind, 0) + 1
        # D270: the budget's worth of replies may wait unread, one more of any size, and each reader's
        # own queue (RCVHWM 1) and the one its libzmq is reading took theirs off the worker
        bound = principal_budget(64 * MIB) // size + 1 + 2 * connections
        assert answers.get("result", 0) <= bound, answers
        assert answers.get("busy", 0) >= per * connections - bound, answers
    finally:
        for reader in readers:
            reader.close(0)
        chan.close()
        stop.set()
        thread.join(10)


def test_requests_waiting_on_many_connections_past_the_budget_are_answered_busy(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    thread, stop = _worker(url, delay=0.005)  # calls too short for the draining thread (DRAIN_AFTER_S)
    chan = Channel(url)
    senders = []
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        x = np.ones(4 * MIB // 8)
        for c in range(16):  # 256 MiB over one principal's connections
            senders.append(_dealer(url, SNDHWM=0))
            for k in range(4):
                senders[-1].send_multipart(_echo(100 * c + k, x), copy=False)
        poller = zmq.Poller()
        for s in senders:
            poller.register(s, zmq.POLLIN)
        answers: dict = {}
        deadline = time.monotonic() + READY_S
        while sum(answers.values()) < 64 and time.monotonic() < deadline:
            for s, _ in poller.poll(200):
                header = wire.decode_header(s.recv_multipart()[0])
                kind = header.get("kind", header["t"])
                answers[kind] = answers.get(kind, 0) + 1
        assert sum(answers.values()) == 64
        assert answers.get("busy", 0) > 0 and answers.get("result", 0) > 0, answers
    finally:
        for s in senders:
            s.close(0)
        chan.close()
        stop.set()
        thread.join(10)


class _Unread:
    done = False

    def wait(self, timeout: float) -> None:
        raise zmq.NotDone


def test_past_the_bound_a_call_is_answered_busy_and_a_probe_is_still_taken(sock_dir):
    from fusion_shim.worker.inbox import Inbox

    url = f"ipc://{sock_dir}/i.sock"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(url)
    inbox = Inbox(router, curve=False, budget=8 * MIB)
    client = _dealer(url)
    try:
        client.send_multipart(messages.hello(1).frames())
        frames, principal, _ = inbox.next(int(READY_S * 1000))
        inbox.unsent[principal.name] = [(_Unread(), 8 * MIB)]  # a reply of the whole budget, unread
        client.send_multipart(_echo(2, np.ones(1024)))
        client.send_multipart(messages.hello(3).frames())
        got, deadline = None, time.monotonic() + READY_S
        while got is None and time.monotonic() < deadline:  # past the busy answer it looks without waiting
            got = inbox.next(int(READY_S * 1000))
        frames = got[0]
        assert wire.decode_header(frames[1])["id"] == 3  # the probe; the call was answered busy
        assert client.poll(int(READY_S * 1000))
        header = wire.decode_header(client.recv_multipart()[0])
        assert (header["t"], header["kind"], header["id"]) == ("error", "busy", 2)
    finally:
        inbox.close()
        client.close(0)
        router.close(0)

"""A worker holds at most a few requests of one connection in its queue (D65): a client that sends
forty large requests while the worker is busy leaves them in its own send queue, not in the
worker's memory. A principal with many connections may have at most its budget of bytes waiting;
past it, requests are answered ``busy`` at once (D69). And one message's budget follows the host's
memory."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel
from fusion_shim.worker.inbox import QUEUED_BYTES, principal_budget
from fusion_shim.worker.server import MAX_MESSAGE_BYTES, QUEUED_PER_CONNECTION, default_max_bytes
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

MIB16 = 16 << 20


def _rss(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


def test_forty_large_requests_sent_while_busy_stay_out_of_the_workers_memory(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu",
                               "--delay", "3"], stderr=subprocess.DEVNULL)
    chan = Channel(url)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # the attacker's own queue: unbounded, so every request leaves send()
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        before = _rss(worker.pid)
        x = np.ones(MIB16 // 8)
        header = messages.call_header(0, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
        sock.connect(url)
        for rid in range(2, 42):
            sock.send_multipart(messages.Request({**header, "id": rid}, [wire.to_wire(x)]).frames(), copy=False)
        time.sleep(2.0)  # the first is in its kernel's delay; the rest as far as they got
        grown = _rss(worker.pid) - before
        limit = (QUEUED_PER_CONNECTION + 4) * MIB16  # the queue, the call being handled, its reply
        assert grown < limit, f"worker RSS grew {grown >> 20} MiB, limit {limit >> 20} MiB"
        assert worker.poll() is None
    finally:
        sock.close(0)
        chan.close()
        worker.kill()
        worker.wait()


def test_many_connections_of_one_principal_are_held_to_its_budget(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu",
                               "--delay", "4"], stderr=subprocess.DEVNULL)
    chan = Channel(url)
    socks = []
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        before = _rss(worker.pid)
        x = np.ones(MIB16 // 8)
        header = messages.call_header(0, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
        frames = messages.Request({**header, "id": 2}, [wire.to_wire(x)]).frames()
        first = zmq.Context.instance().socket(zmq.DEALER)
        first.setsockopt(zmq.LINGER, 0)
        first.connect(url)
        first.send_multipart(frames, copy=False)  # holds the worker 4 s
        time.sleep(0.5)
        for c in range(10):  # ten connections, four requests each: 640 MiB
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(url)
            socks.append(sock)
            for rid in range(4):
                sock.send_multipart(messages.Request({**header, "id": 100 * c + rid}, [wire.to_wire(x)]).frames(),
                                    copy=False)
        busy = 0
        deadline = time.monotonic() + 2.5  # still inside the first call's delay
        while time.monotonic() < deadline:
            for sock in socks:
                while sock.poll(0):
                    reply, _ = wire.decode(sock.recv_multipart())
                    busy += reply["t"] == "error" and reply["kind"] == "busy"
            time.sleep(0.05)
        grown = _rss(worker.pid) - before
        # what may wait; the call, its reply, one being read, and chunks of shed requests that the
        # allocator keeps for reuse (without the bound: 40 x 16 MiB)
        limit = QUEUED_BYTES + 10 * MIB16
        assert grown < limit, f"worker RSS grew {grown >> 20} MiB, limit {limit >> 20} MiB"
        assert busy >= 40 - QUEUED_BYTES // MIB16, busy  # the rest answered at once
        assert worker.poll() is None
        assert chan.request(messages.hello(3), time.monotonic() + READY_S * 2).header["t"] == "ready"
    finally:
        for sock in socks:
            sock.close(0)
        first.close(0)
        chan.close()
        worker.kill()
        worker.wait()


def test_one_messages_budget_follows_the_hosts_memory():
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_max_bytes(None) == min(MAX_MESSAGE_BYTES, ram // 2)
    from fusion_shim.worker.server import Worker

    assert Worker("cpu").max_bytes == min(MAX_MESSAGE_BYTES, ram // 2)
    assert Worker("cpu", max_bytes=1000).max_bytes == 1000


def test_a_principals_flood_over_many_connections_is_answered_busy_and_freed_when_they_close(sock_dir):
    import threading

    url = f"ipc://{sock_dir}/w.sock"
    max_bytes, connections = 64 << 20, 64
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu",
                               "--max-bytes", str(max_bytes), "--delay", "0.005"], stderr=subprocess.DEVNULL)
    chan = Channel(url)
    socks, peak, sampling = [], [0], threading.Event()

    def sample() -> None:
        while not sampling.wait(0.01):
            peak[0] = max(peak[0], _rss(worker.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        before = peak[0] = _rss(worker.pid)
        sampler.start()
        x = np.ones(MIB16 // 8)
        header = messages.call_header(0, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
        for c in range(connections):  # 4 GiB over one principal's connections
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(url)
            socks.append(sock)
            for k in range(4):
                sock.send_multipart(messages.Request({**header, "id": 100 * c + k + 2}, [wire.to_wire(x)]).frames(),
                                    copy=False)
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        answers: dict = {}
        deadline = time.monotonic() + 2 * READY_S
        while sum(answers.values()) < 4 * connections and time.monotonic() < deadline:
            for sock, _ in poller.poll(200):
                reply = wire.decode_header(sock.recv_multipart()[0])
                kind = reply.get("kind", reply["t"])
                answers[kind] = answers.get(kind, 0) + 1
        sampling.set()
        sampler.join(10)
        assert sum(answers.values()) == 4 * connections, answers  # none dropped
        assert answers.get("busy", 0) > 0, answers
        # D270: the principal's budget, one request and its reply of any size; D272's slack: what
        # libzmq holds of each connection before the worker sees it, one 16 MiB message or two
        # D272: libzmq holds, per connection, up to RCVHWM received messages and the one being read
        limit = principal_budget(max_bytes) + 2 * max_bytes + connections * (QUEUED_PER_CONNECTION + 1) * MIB16
        assert peak[0] - before < limit, f"peak RSS grew {(peak[0] - before) >> 20} MiB, limit {limit >> 20} MiB"
        for sock in socks:
            sock.close(0)
        socks.clear()
        deadline = time.monotonic() + READY_S  # freed once they closed (the idle loop trims the heap)
        while _rss(worker.pid) - before >= 64 << 20:
            assert time.monotonic() < deadline, f"RSS stayed {(_rss(worker.pid) - before) >> 20} MiB up"
            time.sleep(0.2)
        assert chan.request(messages.hello(3), time.monotonic() + READY_S).header["t"] == "ready"
    finally:
        sampling.set()
        for sock in socks:
            sock.close(0)
        chan.close()
        worker.kill()
        worker.wait()

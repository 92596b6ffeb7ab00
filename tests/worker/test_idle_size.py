"""An idle worker returns near its idle size (D197): after a burst of large messages over several
connections, once the loop is idle it hands the freed heap back to the system (main stayed 145-168
MiB over)."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

MIB = 1 << 20


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _echo(sock: zmq.Socket, rid: int, x: np.ndarray) -> None:
    header = messages.call_header(rid, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
    sock.send_multipart(messages.Request(header, [wire.to_wire(x)]).frames(), copy=False)
    assert sock.poll(READY_S * 1000)
    assert wire.decode_header(sock.recv_multipart()[0])["t"] == "result"


def _dealer(url: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    return sock


def test_an_idle_worker_returns_near_its_idle_size_after_large_messages(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu"],
                              stderr=subprocess.DEVNULL)
    chan = Channel(url)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        _echo(sock, 2, np.ones(1024))
        idle = _rss(worker.pid)
        senders = [_dealer(url) for _ in range(8)]
        try:  # a burst over several connections, sizes varying as a program's do
            for c, s in enumerate(senders):
                for k, mib in enumerate((16, 17, 15, 18)):
                    x = np.ones(mib * MIB // 8)
                    header = messages.call_header(100 * c + k, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
                    s.send_multipart(messages.Request(header, [wire.to_wire(x)]).frames(), copy=False)
            for s in senders:
                for _ in range(4):
                    assert s.poll(READY_S * 1000)
                    s.recv_multipart()
        finally:
            for s in senders:
                s.close(0)
        deadline = time.monotonic() + 60
        while _rss(worker.pid) - idle > 48 * MIB and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _rss(worker.pid) - idle <= 48 * MIB, f"{(_rss(worker.pid) - idle) >> 20} MiB over idle"
    finally:
        sock.close(0)
        chan.close()
        worker.kill()
        worker.wait()


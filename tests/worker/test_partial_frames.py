"""A frame being received counts from its first byte in libzmq, per connection (D272): one announced
past ``--max-bytes`` is cut off at the socket before it is buffered, and one within it holds what
has arrived until it completes or its connection closes."""
from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time

import pytest

from fusion_shim.protocol import messages
from fusion_shim.transport import Channel
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

MIB = 1 << 20
MAX_BYTES = 256 * MIB
CONNECTIONS = 8


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _zmtp(path: str) -> socket.socket:
    """A raw ZMTP 3.0 peer (NULL mechanism, a DEALER): it can stop in the middle of a frame."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(READY_S)
    s.connect(path)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + b"\0" * 31)
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(b"\x04" + bytes([len(body)]) + body)
    got = b""
    while len(got) < 64:  # the worker's greeting
        got += s.recv(64 - len(got))
    return s


def _start_frames(path: str, announced: int, sent: int) -> tuple[list, int]:
    """``CONNECTIONS`` peers each announcing one frame of ``announced`` bytes and sending ``sent`` of
    them; returns the sockets and how many were cut off by the worker."""
    socks, cut, chunk = [], 0, b"\0" * MIB
    for _ in range(CONNECTIONS):
        s = _zmtp(path)
        socks.append(s)
        try:
            s.sendall(b"\x02" + struct.pack(">Q", announced))  # a long final frame
            for _ in range(sent // MIB):
                s.sendall(chunk)
        except OSError:
            cut += 1
    return socks, cut


@pytest.fixture
def worker(sock_dir):
    path = f"{sock_dir}/w.sock"
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", f"ipc://{path}",
                             "--device", "cpu", "--max-bytes", str(MAX_BYTES)], stderr=subprocess.DEVNULL)
    chan = Channel(f"ipc://{path}")
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        yield proc, path, chan
    finally:
        chan.close()
        proc.kill()
        proc.wait()


def _settled(pid: int, below: int) -> int:
    deadline = time.monotonic() + READY_S
    while (now := _rss(pid)) >= below and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def test_frames_announced_past_max_bytes_are_cut_off_before_they_are_buffered(worker):
    proc, path, chan = worker
    before = _rss(proc.pid)
    socks, cut = _start_frames(path, 4 * MAX_BYTES, 128 * MIB)
    try:
        assert cut == CONNECTIONS  # the worker dropped each connection at the frame's header
        grown = _rss(proc.pid) - before
        assert grown < 32 * MIB, f"worker RSS grew {grown >> 20} MiB"
        assert chan.request(messages.hello(2), time.monotonic() + READY_S).header["t"] == "ready"
    finally:
        for s in socks:
            s.close()


def test_partial_frames_within_max_bytes_hold_what_arrived_until_their_connections_close(worker):
    proc, path, chan = worker
    before = _rss(proc.pid)
    sent = 32 * MIB
    socks, cut = _start_frames(path, 200 * MIB, sent)
    try:
        assert cut == 0
        grown = _rss(proc.pid) - before
        # D272: what arrived of each frame, per connection, outside the principal's budget
        assert grown < CONNECTIONS * sent + 64 * MIB, f"worker RSS grew {grown >> 20} MiB"
    finally:
        for s in socks:
            s.close()
    assert _settled(proc.pid, before + 32 * MIB) - before < 32 * MIB  # freed once they closed
    assert chan.request(messages.hello(2), time.monotonic() + READY_S).header["t"] == "ready"

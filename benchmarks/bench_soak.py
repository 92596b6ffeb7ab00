"""A connection and memory soak of one worker (its limits: docs/security.md, "Worker limits"): many idle
connections, one principal's requests over many connections, replies nobody reads, and frames
started and never finished; the worker's resident memory (VmRSS) before, at each phase's end and
after, and its peak (VmHWM). Under 3 minutes:

    python -m pytest benchmarks/bench_soak.py --benchmark-only -s

The worker is a CPU test worker (``fusion_shim.worker.testing``) with ``--max-bytes 128 MiB``.
"""
from __future__ import annotations

import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel

MIB = 1 << 20
MAX_BYTES = 128 * MIB
IDLE_CONNECTIONS = 2000
SENDERS, PER_SENDER, REQUEST = 16, 4, 16 * MIB   # 1 GiB offered over one principal's connections
UNREAD = 100                                      # 4 MiB replies nobody reads
PARTIAL, PARTIAL_SENT = 8, 64 * MIB               # frames announced at 120 MiB, stopped at 64 MiB


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


def _echo(rid: int, x: np.ndarray) -> list:
    header = messages.call_header(rid, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
    return messages.Request(header, [wire.to_wire(x)]).frames()


def _served(chan: Channel, rid: int) -> bool:
    x = np.arange(64.0)
    header = messages.call_header(rid, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", x.shape)])
    return chan.request(messages.Request(header, [wire.to_wire(x)]), time.monotonic() + 120).header["t"] == "result"


def _zmtp_partial(path: str, size: int, sent: int) -> socket.socket:
    """A connection that greets as a DEALER (ZMTP 3.0, NULL), then starts a ``size`` frame and stops."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    prop = bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = b"\x05READY" + prop
    s.sendall(greeting + bytes([0x04, len(body)]) + body + b"\x02" + struct.pack(">Q", size))
    chunk = b"\0" * MIB
    for _ in range(sent // MIB):
        s.sendall(chunk)
    return s


def _soak() -> dict:
    d = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
    path = f"{d}/w.sock"
    url = f"ipc://{path}"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu",
                               "--max-bytes", str(MAX_BYTES)], stderr=subprocess.DEVNULL)
    chan = Channel(url)
    ctx = zmq.Context.instance()
    out: dict = {}
    try:
        assert chan.request(messages.hello(1), time.monotonic() + 600).header["t"] == "ready"
        assert _served(chan, 2)
        rss = lambda: _status(worker.pid, "VmRSS") / MIB  # noqa: E731
        out["idle_mib"] = rss()

        raw: list = []  # idle connections, paced: past a full accept queue the kernel refuses
        stop = time.monotonic() + 30
        while len(raw) < IDLE_CONNECTIONS and time.monotonic() < stop:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
                raw.append(s)
            except OSError:
                s.close()
                time.sleep(0.005)
        out["idle_connections_opened"] = len(raw)
        out["after_idle_connections_mib"] = rss()
        out["served_among_idle_connections"] = _served(chan, 3)
        for s in raw:
            s.close()

        x = np.ones(REQUEST // 8)
        senders = []
        for c in range(SENDERS):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(url)
            senders.append(sock)
            for k in range(PER_SENDER):
                sock.send_multipart(_echo(100 * c + k, x), copy=False)
        answers = {"result": 0, "busy": 0, "other": 0}
        poller = zmq.Poller()
        for sock in senders:
            poller.register(sock, zmq.POLLIN)
        peak_during = 0.0
        stop = time.monotonic() + 60
        while sum(answers.values()) < SENDERS * PER_SENDER and time.monotonic() < stop:
            peak_during = max(peak_during, rss())
            for sock, _ in poller.poll(200):
                header = wire.decode_header(sock.recv_multipart()[0])
                kind = "result" if header["t"] == "result" else header.get("kind", "other")
                answers[kind if kind in answers else "other"] += 1
        out["many_senders_answers"] = answers
        out["many_senders_rss_peak_mib"] = peak_during
        for sock in senders:
            sock.close(0)

        reader = ctx.socket(zmq.DEALER)
        reader.setsockopt(zmq.LINGER, 0)
        reader.setsockopt(zmq.RCVHWM, 1)
        reader.setsockopt(zmq.SNDHWM, 0)
        reader.connect(url)
        y = np.ones(4 * MIB // 8)
        for k in range(UNREAD):
            reader.send_multipart(_echo(10_000 + k, y), copy=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the worker has answered them all (its calls count)
            peak_during = max(peak_during, rss())
            if chan.request(messages.stats_request(4), time.monotonic() + 60).header.get("calls", 0) >= \
                    1 + SENDERS * PER_SENDER + UNREAD - answers["busy"] - 4:
                break
            time.sleep(0.1)
        out["unread_replies_rss_mib"] = rss()
        reader.close(0)

        partial = [_zmtp_partial(path, 120 * MIB, PARTIAL_SENT) for _ in range(PARTIAL)]
        time.sleep(1.0)
        out["partial_frames_rss_mib"] = rss()
        out["served_among_partial_frames"] = _served(chan, 5)
        for s in partial:
            s.close()

        time.sleep(2.0)  # the worker frees what closed connections held
        assert _served(chan, 6)
        out["after_mib"] = rss()
        out["peak_mib"] = _status(worker.pid, "VmHWM") / MIB
        out["alive"] = worker.poll() is None
    finally:
        chan.close()
        worker.kill()
        worker.wait()
    return out


def test_soak_connections_unread_replies_partial_frames(benchmark):
    got = benchmark.pedantic(_soak, rounds=1, iterations=1)
    benchmark.extra_info.update(got)
    print("\nsoak:", {k: (round(v) if isinstance(v, float) else v) for k, v in got.items()})
    assert got["alive"] and got["served_among_idle_connections"] and got["served_among_partial_frames"]
    assert got["after_mib"] - got["idle_mib"] < 256  # back near its idle size

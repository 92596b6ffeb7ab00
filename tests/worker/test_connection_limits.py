"""Connections past a worker's limits are shut at once, never a crash (D193): a worker held to a
low fd limit survives many more idle connections than it has fds and keeps serving a client that
was there first; one principal's connections past its own limit are shut while another's are not."""
from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import Channel
from fusion_shim.worker.connections import connection_limit
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

FD_LIMIT = 256
# a worker whose fd limit is low, soft and hard: set here, in test code, not by a flag of the worker
LOW_FD_WORKER = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
                 "from fusion_shim.worker.testing import main; sys.exit(main(sys.argv[1:]))")


def _connect_raw(path: str, n: int) -> list[socket.socket]:
    """``n`` idle unix-socket connections that never say a word; one the kernel refuses is left out."""
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1.0)  # a full accept queue: left out
        try:
            s.connect(path)
        except OSError:
            s.close()
            continue
        s.setblocking(False)
        out.append(s)
    return out


def _ended(socks: list[socket.socket], want: int, deadline_s: float = 60.0) -> int:
    """How many of ``socks`` the far end closed, read until ``want`` of them were or the deadline."""
    ended: set[int] = set()
    stop = time.monotonic() + deadline_s
    while len(ended) < want and time.monotonic() < stop:
        live = [s for s in socks if s.fileno() not in ended]
        readable, _, _ = select.select(live[:1000], [], [], 0.2)
        for s in readable:
            try:
                if s.recv(4096) == b"":
                    ended.add(s.fileno())
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                ended.add(s.fileno())
    return len(ended)


def _call(chan: Channel, rid: int) -> np.ndarray:
    a = np.arange(16.0).reshape(4, 4)
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", (4, 4))])
    answer = chan.request(messages.Request(header, [wire.to_wire(a)] * 2), time.monotonic() + READY_S)
    assert answer.header["t"] == "result", answer.header
    return a @ a


def test_a_worker_at_a_low_fd_limit_outlives_many_idle_connections_and_keeps_serving(sock_dir):
    path = f"{sock_dir}/w.sock"
    url = f"ipc://{path}"
    worker = subprocess.Popen([sys.executable, "-c", LOW_FD_WORKER.format(n=FD_LIMIT), "--bind", url,
                               "--device", "cpu"], stderr=subprocess.DEVNULL)
    chan = Channel(url)
    socks: list[socket.socket] = []
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        _call(chan, 2)
        deadline = time.monotonic() + 120
        while len(socks) < 3 * FD_LIMIT and time.monotonic() < deadline:
            socks += _connect_raw(path, 64)  # past a full accept queue the kernel refuses at once
            assert worker.poll() is None, "the worker died of its connections"
            time.sleep(0.02)  # pacing: the worker accepts meanwhile
        assert len(socks) >= 3 * FD_LIMIT
        over = len(socks) - connection_limit(FD_LIMIT)
        assert _ended(socks, over) >= over  # the worker shut those past its limit
        assert worker.poll() is None
        _call(chan, 3)
    finally:
        for s in socks:
            s.close()
        chan.close()
        worker.kill()
        worker.wait()


def test_a_principals_connections_past_its_limit_are_shut_and_the_worker_serves_on(sock_dir):
    from fusion_shim.worker.server import Worker, serve_in_thread

    path = f"{sock_dir}/w.sock"
    url = f"ipc://{path}"
    thread, stop = serve_in_thread(url, worker=Worker("cpu", bench_cache=True),
                                   connection_limits={"max_per_principal": 4})
    chan = Channel(url)  # this principal's first connection
    socks: list[socket.socket] = []
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        socks = _connect_raw(path, 20)
        assert len(socks) == 20
        assert _ended(socks, 17) >= 17  # 3 more of the same uid may stay; the others are shut
        _call(chan, 2)
    finally:
        for s in socks:
            s.close()
        chan.close()
        stop.set()
        thread.join(10)


def test_the_fd_limit_is_raised_to_the_hard_limit_and_leaves_headroom():
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (200, 4096)); "
            "from fusion_shim.worker.connections import raise_fd_limit, connection_limit; "
            "n = raise_fd_limit(); print(n, resource.getrlimit(resource.RLIMIT_NOFILE)[0], connection_limit(n))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["4096", "4096", "1024"]

"""The benchmarks' link emulation (issue 5) sets up one condition and tears it down: a TCP echo server
in a network namespace behind a veth pair shaped by tbf, reached through the delaying proxy. The
measured round trip and rate must show the emulation took effect. EMULATED, and skipped where it
cannot run (not root, no ip/tc, no namespaces)."""
import os
import socket
import subprocess
import sys
import time

import pytest

from benchmarks import linkemu

ECHO = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
while True:
    conn, _ = srv.accept()
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        conn.sendall(data)
    conn.close()
"""


def _skip_reason():
    why = linkemu.available()
    if why:
        return why
    probe = f"{linkemu.PREFIX}-probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"network namespaces unavailable: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.mark.skipif(bool(_skip_reason()), reason=str(_skip_reason()))
def test_one_emulated_condition_up_and_down():
    cond = linkemu.Condition("ci-100m-2ms", "100mbit", 100e6, 2e-3)
    index = 200 + os.getpid() % 50  # our own 10.201.N subnet and interface names
    port = linkemu.WORKER_PORT + index
    ns_ip = f"{linkemu.SUBNET}.{index}.2"
    link = linkemu.Link(cond, index=index, server=[sys.executable, "-c", ECHO, ns_ip, str(port)])
    with link:
        host, pport = link.url.removeprefix("tcp://").rsplit(":", 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                s = socket.create_connection((host, int(pport)), timeout=5)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(b"x")
                if s.recv(1) == b"x":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the echo server behind the emulated link never answered"
            time.sleep(0.1)
        rtts = []
        for _ in range(10):
            t = time.perf_counter()
            s.sendall(b"y")
            assert s.recv(1) == b"y"
            rtts.append(time.perf_counter() - t)
        payload = b"z" * (2 << 20)
        t = time.perf_counter()
        s.sendall(payload)
        got = 0
        while got < len(payload):
            got += len(s.recv(1 << 20))
        bulk = time.perf_counter() - t
        s.close()
        assert min(rtts) >= 2e-3, rtts  # the proxy's delay took effect
        # 2 MiB each way over 12.5 MB/s shaped both ways: at least ~0.17 s (tbf's burst lets a little through)
        assert bulk >= 0.8 * len(payload) / 12.5e6, bulk
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert link.ns not in names
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert link.host_if + ":" not in links and link.host_if + "@" not in links

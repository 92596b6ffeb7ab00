"""A worker ended by SIGTERM removes the ``ipc://`` socket file it bound, and still dies by that
signal (D187); a file that replaced its socket since is left alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

DEADLINE = 120.0  # generous: the worker imports torch before it binds; a hang fails, a slow machine does not


def caught(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (its ``SigCgt`` mask)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(mask & (1 << (signum - 1)))


def wait_for(what, proc: subprocess.Popen) -> None:
    end = time.monotonic() + DEADLINE
    while not what():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < end, "the worker never got there"
        time.sleep(0.05)


@pytest.fixture
def worker(tmp_path):
    sock = tmp_path / "w.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", f"ipc://{sock}",
                             "--device", "cpu"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: sock.exists() and caught(proc.pid, signal.SIGTERM), proc)
        yield proc, sock
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=DEADLINE)


def test_a_worker_ended_by_sigterm_removes_its_socket_file_and_dies_by_the_signal(worker):
    proc, sock = worker
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == -signal.SIGTERM
    assert not sock.exists()


def test_a_file_that_replaced_the_socket_is_left_in_place(worker):
    proc, sock = worker
    sock.unlink()
    sock.write_text("someone else's")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == -signal.SIGTERM
    assert sock.read_text() == "someone else's"

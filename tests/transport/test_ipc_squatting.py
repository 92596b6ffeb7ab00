"""A client talks over ``ipc://`` only to a process of its own user (or root) (D64): a process of
another user listening at the path, as a squatter in a shared directory would, gets a hello and
nothing more, and the program's calls are computed here with the reason in the report. Where the
suite runs as root the squatter really is another uid (it drops to uid 65534); the other variant
simulates it by making the client believe it runs as another uid, and says so in its id."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import fusion_shim
from tests.helpers.shims import READY_S

OTHER_UID = 65534

SQUATTER = textwrap.dedent("""
    import os, sys, zmq, msgpack
    path, log = sys.argv[1], open(sys.argv[2], "a")  # opened before dropping to the other uid
    sock = zmq.Context().socket(zmq.ROUTER)
    os.setgid(%d); os.setuid(%d)
    sock.bind("ipc://" + path)
    print("bound", flush=True)
    while True:
        frames = sock.recv_multipart()
        header = msgpack.unpackb(frames[1])
        log.write(header.get("t", "?") + "\\n"); log.flush()
        reply = {"v": 1, "t": "ready", "id": header.get("id", 0), "pid": os.getpid(), "device": "cuda:0",
                 "torch": "2.13.0", "bench": {}, "memory_budget": 1 << 30, "numba": "none", "kernels": ["matmul"],
                 "health_s": 0.001}
        sock.send_multipart([frames[0], msgpack.packb(reply)])
""" % (OTHER_UID, OTHER_UID))

pytestmark = pytest.mark.usefixtures("no_shim_after")


def _refusal(rt) -> str | None:
    return next((e for e in map(str, rt.ledger.events) if "not as this user" in e), None)


def _wait_for(cond, seconds: float = READY_S):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


@contextlib.contextmanager
def _squatter(sock_dir: str, log: str = os.devnull):
    """A listener of uid OTHER_UID at ``sock_dir``/fs.sock (made world-writable, like /tmp); its path."""
    shared = Path(sock_dir)
    shared.chmod(0o1777)
    path = shared / "fs.sock"
    proc = subprocess.Popen([sys.executable, "-c", SQUATTER, str(path), str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "bound"
        yield path
    finally:
        fusion_shim.uninstall()
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _own_worker(sock_dir: str, monkeypatch):
    """An honest worker of this user, and a client made to believe it runs as another uid: its URL
    and this user's real uid."""
    url = f"ipc://{sock_dir}/w.sock"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                              stderr=subprocess.DEVNULL)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    try:
        yield url, me
    finally:
        fusion_shim.uninstall()
        worker.kill()
        worker.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run the squatter as another user")
def test_a_squatter_of_another_user_gets_a_hello_and_no_data(tmp_path, sock_dir):
    log = tmp_path / "seen.log"
    with _squatter(sock_dir, log) as path:
        assert os.stat(path).st_uid == OTHER_UID
        rt = fusion_shim.install(policy="remote", worker=f"ipc://{path}", quiet=True, ready_timeout=2.0)
        reason = _wait_for(lambda: _refusal(rt) or rt.link.ready.is_set())  # refused, or (wrongly) taken
        assert isinstance(reason, str) and f"uid {OTHER_UID}" in reason, rt.ledger.events
        a = np.random.default_rng(0).standard_normal((300, 300))
        np.testing.assert_allclose(np.matmul(a, a), np.matmul.__wrapped__(a, a))
        rec = rt.ledger.records[-1]
        assert rec.kind == "fallback", rec
        fusion_shim.uninstall()
        assert set(log.read_text().split()) <= {"hello"}  # it never saw a call, nor a byte of `a`


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the squatter above is real (and a root worker is trusted)")
def test_a_worker_of_another_user_is_refused_simulated_euid(sock_dir, monkeypatch):
    """Simulated: an honest worker of this user, and a client made to believe it runs as another."""
    with _own_worker(sock_dir, monkeypatch) as (url, me):
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=2.0)
        reason = _wait_for(lambda: _refusal(rt) or rt.link.ready.is_set())
        assert isinstance(reason, str) and f"runs as uid {me}" in reason, rt.ledger.events
        a = np.random.default_rng(0).standard_normal((64, 64))
        np.testing.assert_allclose(np.matmul(a, a), np.matmul.__wrapped__(a, a))
        assert rt.ledger.records[-1].kind == "fallback"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a listener as another user")
def test_a_configured_worker_uid_is_trusted(sock_dir):
    """FUSION_SHIM_WORKER_UID: a worker another account runs for this user is taken (here the
    listener of another uid; without the setting the test above refuses it)."""
    with _squatter(sock_dir) as path:
        rt = fusion_shim.install(policy="remote", worker=f"ipc://{path}", quiet=True, ready_timeout=2.0,
                                 worker_uid=str(OTHER_UID))
        assert rt.link.wait_ready(READY_S), rt.ledger.events
        assert _refusal(rt) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the test above runs a real listener of another uid")
def test_a_configured_worker_uid_is_trusted_simulated_euid(sock_dir, monkeypatch):
    """Simulated: as above, and the client told to trust this user's uid."""
    with _own_worker(sock_dir, monkeypatch) as (url, me):
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=READY_S, worker_uid=str(me))
        assert rt.link.wait_ready(READY_S), rt.ledger.events
        a = np.random.default_rng(0).standard_normal((64, 64))
        np.testing.assert_allclose(np.matmul(a, a), np.matmul.__wrapped__(a, a))
        assert rt.ledger.records[-1].kind == "worker"

"""A tcp worker on loopback authenticates its clients by default (D68): started without ``--keys``
it makes (or reuses) this user's keys in ``$XDG_CONFIG_HOME/fusion_shim/keys`` and serves CURVE with
them; a client of the same user finds them without flags; a client without them gets no frame to
the dispatcher. ``--insecure`` opts out, loudly. The suite's ``XDG_CONFIG_HOME`` is its own
(tests/helpers/environment.py); each test here takes a fresh one."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import zmq

import fusion_shim
from fusion_shim import auth
from fusion_shim.protocol import wire

from tests.helpers.shims import READY_S
from tests.worker.test_security import HELLO, REPLY_MS, dealt, free_port, monitor_events, send_refused

PY = sys.executable

pytestmark = pytest.mark.usefixtures("no_shim_after")


@pytest.fixture
def own_config(tmp_path, monkeypatch):
    """A fresh config directory for this test and the processes it starts."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "fusion_shim" / "keys"


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}


def test_the_worker_makes_the_users_keys_private_and_reuses_them(own_config):
    from fusion_shim.worker.command import default_keys

    assert default_keys("ipc:///tmp/x.sock") is None and not own_config.exists()  # ipc: no keys needed
    made = default_keys(f"tcp://127.0.0.1:{free_port()}")
    assert made == str(own_config)
    files = sorted(p.relative_to(own_config).as_posix() for p in own_config.rglob("*") if p.is_file())
    assert files == ["authorized/local.key", "local.key_secret", "server.key", "server.key_secret"]
    for p in [own_config, *own_config.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    secret = (own_config / "server.key_secret").read_bytes()
    assert default_keys("tcp://localhost:5555") == made  # reused, not replaced
    assert (own_config / "server.key_secret").read_bytes() == secret
    assert auth.user_curve()[0] == auth.load_public(str(own_config / "server.key"))
    own_config.chmod(0o770)  # the client refuses keys others could change
    with pytest.raises(auth.KeyFileError, match="writable by group or others"):
        auth.user_curve()


def test_an_unauthenticated_client_gets_no_frame_to_the_dispatcher(own_config):
    from fusion_shim.worker import Worker, serve_in_thread
    from fusion_shim.worker.command import default_keys

    url = f"tcp://127.0.0.1:{free_port()}"
    dispatched = []
    thread, stop = serve_in_thread(url, worker=Worker("cpu"), keys=default_keys(url), on_request=dispatched.append)
    try:
        with dealt(url, None, None) as (sock, mon):  # a local process of any user, no CURVE
            assert send_refused(sock, 3 * [HELLO]), "nothing left on a pipe, for the worker to refuse"
            assert not sock.poll(1500), "a client without keys was answered"
            assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in monitor_events(mon)
        assert dispatched == []
        server, public, secret = auth.user_curve()
        with dealt(url, server, (public, secret)) as (sock, mon):  # this user, keys found where the worker made them
            sock.send_multipart(HELLO)
            assert sock.poll(REPLY_MS), "this user's client got no answer"
            assert wire.decode(sock.recv_multipart())[0]["t"] == "ready"
        assert len(dispatched) == 1
    finally:
        stop.set()
        thread.join(10)


def test_two_commands_on_loopback_tcp_need_no_key_flags(own_config, tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"], env=_env(),
                              stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    try:
        app = tmp_path / "app.py"
        app.write_text("import numpy as np\n"
                       "a = np.random.default_rng(3).standard_normal((96, 96))\n"
                       "np.save('out.npy', np.matmul(a, a))\n")
        report = tmp_path / "run.json"
        r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "remote", "--worker", url, "--quiet",
                            "--ready-timeout", str(READY_S), "--report", str(report), str(app)],
                           capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        a = np.random.default_rng(3).standard_normal((96, 96))
        np.testing.assert_allclose(np.load(tmp_path / "out.npy"), a @ a, rtol=1e-12)
        ops = json.loads(report.read_text())["ops"]
        assert ops["numpy.matmul"]["worker"] == 1, (ops, json.loads(report.read_text())["events"])
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait(30)
    assert "this user's processes only" in log.read_text() or str(own_config) in log.read_text()


def test_a_client_started_before_the_worker_finds_the_keys_it_makes(own_config, tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}"
    rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=30.0, ready_timeout=READY_S)
    a = np.random.default_rng(5).standard_normal((64, 64))
    assert not own_config.exists()
    worker = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"], env=_env(),
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))
    try:
        np.testing.assert_allclose(np.matmul(a, a), np.matmul.__wrapped__(a, a), rtol=1e-12)  # waits for it
        assert rt.ledger.records[-1].kind == "worker", rt.ledger.events
        assert any("no keys in" in str(e) for e in rt.ledger.events)  # none at first, found later
    finally:
        fusion_shim.uninstall()
        worker.kill()
        worker.wait(30)


def test_insecure_loopback_warns_and_serving_without_keys_is_refused(own_config):
    from fusion_shim.worker import Worker, serve

    url = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit, match="refusing to bind.*tcp address needs authentication.*own keys"):
        serve(url, Worker(backend=object(), kernels={}))
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", "--insecure"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline() for _ in range(2)]  # what it says before it binds
    finally:
        proc.kill()
        proc.wait(30)
    assert "no authentication" in lines[0] and "WITHOUT AUTHENTICATION (--insecure)" in lines[1], lines
    r = subprocess.run([PY, "-m", "fusion_shim", "worker", "--bind", "tcp://127.0.0.1:1", "--insecure", "--keys", "x"],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 2 and "exclude each other" in r.stderr
    rt = fusion_shim.install(policy="auto", worker=url, quiet=True, ready_timeout=0.2)
    np.matmul(np.ones((2, 2)), np.ones((2, 2)))
    text = "\n".join(e for _, e in rt.ledger.events)
    assert "no keys in" in text and "nothing is sent there" in text, text  # D181: never plaintext by fallback
    assert not own_config.exists()  # a client never makes keys

"""No plaintext by fallback (D181): a client that cannot authenticate a tcp worker, loopback
included, opens no connection to it; its calls are computed here, NumPy's answers, and the ledger
and stderr say why in one line with the fix. Plaintext only with ``--insecure`` on the client
(and the worker's own ``--insecure``), said on stderr.

The "worker" here is another local user's stand-in: a plain ROUTER on 127.0.0.1 without CURVE,
which counts every connection it accepts and every message it receives."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

import fusion_shim
from fusion_shim import auth, transport
from fusion_shim.client import linkkeys
from fusion_shim.config import Config, ConfigError
from fusion_shim.intercept import bypassed

PY = sys.executable

pytestmark = pytest.mark.usefixtures("no_shim_after")


@pytest.fixture
def own_config(tmp_path, monkeypatch):
    """A fresh config directory (this user's keys live under it) for this test and its children."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "fusion_shim" / "keys"


class FakeWorker:
    """A ROUTER on loopback tcp, no CURVE: what it accepted and received."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{port}"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.mon = self.sock.get_monitor_socket(zmq.EVENT_ACCEPTED)
        self.sock.bind(self.url)
        self.messages: list = []
        self.accepted = 0
        self.got = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.mon, zmq.POLLIN)
        while not self._stop.is_set():
            for s, _ in poller.poll(50):
                if s is self.mon:
                    self.mon.recv_multipart()
                    self.accepted += 1
                else:
                    self.messages.append(self.sock.recv_multipart())
                    self.got.set()

    def close(self):
        self._stop.set()
        self._thread.join(10)
        self.sock.disable_monitor()
        self.mon.close(0)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def fake():
    f = FakeWorker()
    yield f
    f.close()


def _calls_match_numpy():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((80, 60)), rng.standard_normal((60, 80))
    with bypassed():
        want = [a @ b, np.linalg.inv(a @ b + 80 * np.eye(80))]
    got = [np.matmul(a, b), np.linalg.inv(np.matmul(a, b) + 80 * np.eye(80))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def _events(rt) -> str:
    return "\n".join(text for _, text in rt.ledger.events)


def _run_against(url: str, **options):
    rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=60.0, **options)
    _calls_match_numpy()
    return rt


def test_a_client_without_keys_sends_nothing_to_a_loopback_tcp_worker(own_config, fake, capfd):
    rt = _run_against(fake.url)
    records = [r for r in rt.ledger.records if r.op == "numpy.matmul"]
    assert records and all(r.kind == "fallback" for r in records), records
    assert rt.link.state == "down"
    text = _events(rt)
    assert "Unauthenticated" in text and f"no keys in {own_config}" in text, text
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("fusion_shim: nothing sent")]
    assert lines == [f"fusion_shim: nothing sent to {fake.url} (no keys in {own_config}); computing here: start "
                     f"the worker without --keys (`fusion-shim worker --bind {fake.url}` makes them there), or give "
                     "--server-key and --client-keys (or --insecure here and on the worker to send plaintext)"], lines
    fusion_shim.uninstall()
    assert fake.messages == [] and fake.accepted == 0
    assert not own_config.exists()  # a client never makes keys


def test_a_client_whose_keys_are_refused_sends_nothing_and_names_the_chmod(own_config, fake, capfd):
    auth.ensure_user_keys()
    pair = own_config / "local.key_secret"
    pair.chmod(0o644)  # readable by others: the permission check refuses the pair
    rt = _run_against(fake.url)
    assert all(r.kind == "fallback" for r in rt.ledger.records if r.op == "numpy.matmul")
    text = _events(rt)
    assert "keys for tcp" in text and "are refused" in text and f"chmod 600 {pair}" in text, text
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("fusion_shim: nothing sent")]
    assert len(lines) == 1 and "(keys refused)" in lines[0] and f"chmod 600 {pair}" in lines[0], lines
    fusion_shim.uninstall()
    assert fake.messages == [] and fake.accepted == 0


def test_a_network_worker_without_keys_gets_no_connection(own_config, monkeypatch, capfd):
    opened = []
    monkeypatch.setattr(transport, "Channel", lambda *a, **k: opened.append(a) or pytest.fail("a channel opened"))
    monkeypatch.setattr(linkkeys, "_said", set())  # said once per process: another test may have used the address
    url = "tcp://192.0.2.1:5555"  # TEST-NET-1: never reached, since nothing is opened
    rt = _run_against(url)
    assert opened == [] and rt.link.state == "down"
    assert "no keys to authenticate" in _events(rt)
    err = capfd.readouterr().err
    assert f"nothing sent to {url} (no keys given); computing here: `fusion-shim keys DIR --client NAME`" in err


def test_keys_made_later_are_used_and_the_plain_worker_still_gets_nothing(own_config, fake):
    """The wait for this user's keys ends where they appear (a worker started beside the client
    makes them): the client then speaks CURVE, which the plain stand-in cannot answer."""
    rt = fusion_shim.install(policy="auto", worker=fake.url, quiet=True, ready_timeout=0.0)
    auth.ensure_user_keys()
    deadline = time.monotonic() + 60
    while rt.link.curve is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rt.link.curve is not None
    fusion_shim.uninstall()
    assert fake.messages == []  # a CURVE hello never completes its handshake with a plain ROUTER


def test_insecure_on_the_client_connects_in_plaintext_and_says_so(own_config, fake, capfd):
    rt = fusion_shim.install(policy="auto", worker=fake.url, quiet=True, insecure=True)
    assert fake.got.wait(60), _events(rt)  # the hello arrived, in plaintext
    assert "WITHOUT AUTHENTICATION (--insecure)" in _events(rt)
    err = capfd.readouterr().err
    assert err.count(f"fusion_shim: WARNING: sending to {fake.url} WITHOUT AUTHENTICATION (--insecure)") == 1, err
    fusion_shim.uninstall()


def test_insecure_is_a_setting_and_a_launcher_flag():
    assert Config.load(env={}).insecure is False
    assert Config.load(env={"FUSION_SHIM_INSECURE": "1"}).insecure is True
    with pytest.raises(ConfigError, match="not a boolean"):
        Config.load(env={"FUSION_SHIM_INSECURE": "maybe"})
    from fusion_shim.cli import parse_run

    settings, script, _, _ = parse_run(["--insecure", "app.py"])
    assert settings == {"insecure": True} and script == "app.py"


def test_the_launchers_report_says_why_in_one_line(own_config, fake, tmp_path):
    app = tmp_path / "app.py"
    app.write_text("import numpy as np\na = np.arange(16.0).reshape(4, 4)\nprint(np.matmul(a, a).tolist())\n")
    report = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "remote", "--worker", fake.url, "--quiet",
                        "--report", str(report), str(app)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    a = np.arange(16.0).reshape(4, 4)
    assert r.stdout.strip() == str((a @ a).tolist())
    said = [ln for ln in r.stderr.splitlines() if "nothing sent to" in ln]
    assert len(said) == 1 and "computing here: start the worker without --keys" in said[0], r.stderr
    rep = json.loads(report.read_text())
    assert [rec["kind"] for rec in rep["records"]] == ["fallback"]
    assert any("Unauthenticated" in e["what"] and "fusion-shim worker --bind" in e["what"] for e in rep["events"])
    assert fake.messages == [] and fake.accepted == 0

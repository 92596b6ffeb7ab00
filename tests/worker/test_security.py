"""Issue 8, security: CURVE keys and the authentication matrix, the network-bind rule, the
validated wire at the socket (MAXMSGSIZE, frame count, budget), and no pickle on the default path.

The authentication matrix runs a real worker (torch kernels, CPU) in a thread of this process on
tcp://127.0.0.1 with CURVE and a ZAP allow-list, and counts the requests that reach its dispatcher:
a listed client gets answers; an unknown key, a client without CURVE and a client holding a wrong
server key get nothing, and not one of their frames reaches the dispatcher.
"""
from __future__ import annotations

import ast
import contextlib
import itertools
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth

import fusion_shim
from fusion_shim import auth, config, transport
from fusion_shim.protocol import wire

from tests.helpers.environment import ROOT
from tests.helpers.shims import READY_S

REPLY_MS = int(READY_S * 1000)  # a reply's deadline: a worker answers once warm (its self-benchmark)

PY = sys.executable


_mon_ids = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys") / "k"
    auth.make_keys(str(d), ["alice"])
    # a second key set: its client "mallory" is not in the first worker's allow-list, and its
    # server key is not the first worker's
    other = tmp_path_factory.mktemp("keys") / "other"
    auth.make_keys(str(other), ["mallory"])
    return d, other


class Counted:
    """A real worker in a thread, CURVE on tcp://127.0.0.1, counting what reaches its dispatcher."""

    def __init__(self, keys_dir: Path, max_bytes: int | None = None):
        from fusion_shim.worker import Worker, serve_in_thread

        self.url = f"tcp://127.0.0.1:{free_port()}"
        kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
        self.worker = Worker("cpu", **kwargs)
        self.dispatched = 0
        self.handled = 0
        handle = self.worker.handle

        def counting_handle(frames, *principal):
            self.handled += 1
            return handle(frames, *principal)

        self.worker.handle = counting_handle

        def on_request(frames):
            self.dispatched += 1

        self.thread, self.stop = serve_in_thread(self.url, worker=self.worker, keys=str(keys_dir),
                                                 on_request=on_request)

    def close(self):
        self.stop.set()
        self.thread.join(10)


@pytest.fixture(scope="module")
def curve_worker(keys):
    w = Counted(keys[0])
    yield w
    w.close()


def dealer(url: str, server_key: bytes | None, pair: tuple[bytes, bytes] | None) -> tuple[zmq.Socket, zmq.Socket]:
    sock = transport.context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = pair
    mon = sock.get_monitor_socket(addr=f"inproc://test-monitor-{next(_mon_ids)}")
    sock.connect(url)
    return sock, mon


@contextlib.contextmanager
def dealt(url: str, server_key: bytes | None, pair: tuple[bytes, bytes] | None):
    """:func:`dealer`, closed on exit even when an assertion fails (a socket left open makes the
    shared context's term() at exit wait for it forever)."""
    sock, mon = dealer(url, server_key, pair)
    try:
        yield sock, mon
    finally:
        close(sock, mon)


def send_refused(sock: zmq.Socket, messages: list, within_s: float = 30.0) -> int:
    """Send from a client the worker refuses, never blocking: once its handshake failed the DEALER
    has no pipe until it reconnects (a blocking send would wait for one). Each message is tried,
    and the round again until one went (a reconnect makes a new pipe); how many went."""
    deadline = time.monotonic() + within_s
    while True:
        went = 0
        for frames in messages:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                went += 1
            except zmq.Again:
                pass
        if went or time.monotonic() > deadline:
            return went
        time.sleep(0.05)


def close(sock: zmq.Socket, mon: zmq.Socket) -> None:
    # the monitor is stopped before the socket closes: closing a monitored socket first leaves
    # libzmq unable to reap any socket of the context closed afterwards (each keeps its fds)
    sock.disable_monitor()
    mon.close(0)
    sock.close(0)


def monitor_events(mon: zmq.Socket, until: int | None = None) -> set[int]:
    """The events the monitor has queued; with ``until``, first waits for that one (an event that
    comes once the handshake has run, however busy the machine), up to READY_S."""
    seen = set()
    deadline = time.monotonic() + READY_S
    while True:
        waiting = until is not None and until not in seen
        if not mon.poll(max(int((deadline - time.monotonic()) * 1000), 0) if waiting else 0):
            return seen
        seen.add(int.from_bytes(mon.recv_multipart()[0][:2], "little"))


HELLO = [msgpack.packb({"v": 1, "t": "hello", "id": 3})]


# -- keys -----------------------------------------------------------------------------------------------

def test_keys_command_writes_private_key_files(tmp_path):
    d = tmp_path / "keys"
    r = subprocess.run([PY, "-m", "fusion_shim", "keys", str(d), "--client", "alice", "--client", "bob"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "--keys" in r.stdout and "FUSION_SHIM_CLIENT_KEYS=" in r.stdout
    files = sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())
    assert files == ["alice.key_secret", "authorized/alice.key", "authorized/bob.key", "bob.key_secret",
                     "server.key", "server.key_secret"]
    for p in d.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # pyzmq's certificate format, public and secret where they belong
    pub, sec = zmq.auth.load_certificate(d / "server.key_secret")
    assert sec is not None and zmq.auth.load_certificate(d / "server.key") == (pub, None)
    alice_pub, alice_sec = zmq.auth.load_certificate(d / "alice.key_secret")
    assert zmq.auth.load_certificate(d / "authorized" / "alice.key") == (alice_pub, None)
    assert zmq.curve_public(alice_sec) == alice_pub
    # a second run adds a client without touching the server keys; a taken name is refused
    before = (d / "server.key_secret").read_bytes()
    r = subprocess.run([PY, "-m", "fusion_shim", "keys", str(d), "--client", "carol"], capture_output=True, text=True)
    assert r.returncode == 0 and (d / "authorized" / "carol.key").exists(), r.stderr
    assert (d / "server.key_secret").read_bytes() == before
    r = subprocess.run([PY, "-m", "fusion_shim", "keys", str(d), "--client", "alice"], capture_output=True, text=True)
    assert r.returncode == 1 and "exists already" in r.stderr
    r = subprocess.run([PY, "-m", "fusion_shim", "keys", str(d), "--client", "../x"], capture_output=True, text=True)
    assert r.returncode == 1 and "invalid" in r.stderr


def test_config_key_fields_are_validated(keys, tmp_path):
    d, _ = keys
    ok = config.Config.load(env={"FUSION_SHIM_SERVER_KEY": str(d / "server.key"),
                                 "FUSION_SHIM_CLIENT_KEYS": str(d / "alice.key_secret")})
    assert ok.server_key == str(d / "server.key") and ok.client_keys == str(d / "alice.key_secret")
    with pytest.raises(config.ConfigError, match="go together"):
        config.Config.load(env={"FUSION_SHIM_SERVER_KEY": str(d / "server.key")})
    with pytest.raises(config.ConfigError, match="go together"):
        config.Config.load(env={"FUSION_SHIM_CLIENT_KEYS": str(d / "alice.key_secret")})
    with pytest.raises(config.ConfigError, match="FUSION_SHIM_SERVER_KEY.*not a CURVE key file.*valid"):
        config.Config.load(env={"FUSION_SHIM_SERVER_KEY": str(tmp_path / "missing.key"),
                                "FUSION_SHIM_CLIENT_KEYS": str(d / "alice.key_secret")})
    with pytest.raises(config.ConfigError, match="holds no secret key"):
        config.Config.load(env={"FUSION_SHIM_SERVER_KEY": str(d / "server.key"),
                                "FUSION_SHIM_CLIENT_KEYS": str(d / "authorized" / "alice.key")})
    leaky = tmp_path / "leaky.key_secret"
    leaky.write_bytes((d / "alice.key_secret").read_bytes())
    leaky.chmod(0o644)
    with pytest.raises(config.ConfigError, match="readable by others.*chmod 600"):
        config.Config.load(server_key=str(d / "server.key"), client_keys=str(leaky))
    garbage = tmp_path / "garbage.key"
    garbage.write_text("public-key = \"short\"\n")
    with pytest.raises(config.ConfigError, match="40-character"):
        config.Config.load(server_key=str(garbage), client_keys=str(d / "alice.key_secret"))
    # children of a launched program inherit the fields
    env = ok.to_env()
    assert env["FUSION_SHIM_SERVER_KEY"] == str(d / "server.key")


# -- the authentication matrix -------------------------------------------------------------------------

def test_authentication_matrix(keys, curve_worker):
    d, other = keys
    server_pub = auth.load_public(str(d / "server.key"))
    alice = auth.load_pair(str(d / "alice.key_secret"))
    mallory = auth.load_pair(str(other / "mallory.key_secret"))
    wrong_server_pub = auth.load_public(str(other / "server.key"))

    # a listed client: answered
    with dealt(curve_worker.url, server_pub, alice) as (sock, mon):
        sock.send_multipart(HELLO)
        assert sock.poll(REPLY_MS), "the listed client got no answer"
        header, _ = wire.decode(sock.recv_multipart())
        assert header["t"] == "ready" and header["id"] == 3
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED in monitor_events(mon, until=zmq.EVENT_HANDSHAKE_SUCCEEDED)
    assert curve_worker.dispatched == curve_worker.handled == 1

    refused = {
        "unknown key": (server_pub, mallory),
        "NULL security": (None, None),
        "wrong server key": (wrong_server_pub, alice),
    }
    for name, (server_key, pair) in refused.items():
        with dealt(curve_worker.url, server_key, pair) as (sock, mon):
            sent = send_refused(sock, 3 * [HELLO, [msgpack.packb({"v": 1, "t": "call", "id": 4, "op": "matmul"}),
                                                    b"\0" * 8]])
            assert sent, name  # some left on a pipe, for the worker to refuse
            # the ZAP handler's no, waited for: the handshake has surely run before the silence counts
            seen = monitor_events(mon, until=zmq.EVENT_HANDSHAKE_FAILED_AUTH) if name == "unknown key" else set()
            assert not sock.poll(1500), f"{name}: the worker answered"
            seen |= monitor_events(mon)
            assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen, (name, seen)
            if name == "unknown key":
                assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in seen, seen  # the ZAP handler said no
        assert curve_worker.dispatched == curve_worker.handled == 1, f"{name}: frames reached the dispatcher"


def test_shim_over_curve(keys, curve_worker, capsys):
    d, other = keys
    a = np.random.default_rng(1).standard_normal((64, 64))
    want = a @ a
    rt = fusion_shim.install(policy="remote", worker=curve_worker.url, quiet=True, timeout=30.0, ready_timeout=READY_S,
                             server_key=str(d / "server.key"), client_keys=str(d / "alice.key_secret"))
    assert rt.link.wait_ready(READY_S), rt.ledger.events
    np.testing.assert_allclose(np.matmul(a, a), want)
    assert rt.ledger.records[-1].kind == "worker"
    fusion_shim.uninstall()

    # an unlisted client through the shim: refused, the calls run here, the report says why
    before = curve_worker.dispatched
    rt = fusion_shim.install(policy="remote", worker=curve_worker.url, quiet=True, timeout=5.0, ready_timeout=2.0,
                             server_key=str(d / "server.key"), client_keys=str(other / "mallory.key_secret"))
    assert not rt.link.wait_ready(2.5)
    deadline = time.monotonic() + 60  # the refusal is the handshake's answer: load can delay it
    while "refused this client's key" not in "\n".join(e for _, e in rt.ledger.events) and time.monotonic() < deadline:
        time.sleep(0.05)
    np.testing.assert_array_equal(np.matmul(a, a), want)
    assert rt.ledger.records[-1].kind == "fallback"
    text = "\n".join(e for _, e in rt.ledger.events)
    assert "Refused: the worker at" in text and "refused this client's key" in text, text
    said = capsys.readouterr().err.splitlines()  # D35: once, with the reason
    assert [ln for ln in said if ln.startswith("fusion_shim: no worker at")] == [
        f"fusion_shim: no worker at {curve_worker.url} (wrong key: the worker at {curve_worker.url} refused this "
        "client's key); computing here"], said
    assert curve_worker.dispatched == before


def test_launcher_flags_over_curve(keys, curve_worker, tmp_path):
    d, _ = keys
    app = tmp_path / "app.py"
    app.write_text("import numpy as np\n"
                   "a = np.arange(64.0 * 64).reshape(64, 64) / 4096\n"
                   "print(float(np.matmul(a, a).sum()))\n")
    report = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "remote", "--worker", curve_worker.url, "--quiet",
                        "--server-key", str(d / "server.key"), "--client-keys", str(d / "alice.key_secret"),
                        "--report", str(report), str(app)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    a = np.arange(64.0 * 64).reshape(64, 64) / 4096
    assert float(r.stdout) == pytest.approx(float((a @ a).sum()), rel=1e-12)
    import json

    ops = json.loads(report.read_text())["ops"]
    assert ops["numpy.matmul"]["worker"] == 1, ops


def test_a_network_worker_without_keys_is_reported(tmp_path):
    rt = fusion_shim.install(policy="auto", worker="tcp://192.0.2.1:5555", quiet=True, ready_timeout=0.2)
    np.matmul(np.ones((2, 2)), np.ones((2, 2)))  # numpy is imported: the link exists
    text = "\n".join(e for _, e in rt.ledger.events)
    # nothing was sent in plaintext, and the line says how to give keys, by flag or by environment
    assert "no keys to authenticate tcp://192.0.2.1:5555" in text, text
    assert "--server-key" in text and "FUSION_SHIM_SERVER_KEY" in text and "--insecure" in text, text


# -- where a worker may bind ------------------------------------------------------------------------------

def test_network_bind_needs_keys_or_insecure(keys, tmp_path):
    from fusion_shim.worker import Worker, serve

    url = f"tcp://0.0.0.0:{free_port()}"
    with pytest.raises(SystemExit, match="refusing to bind.*fusion-shim keys"):
        serve(url, Worker(backend=object(), kernels={}))  # refused before the worker is even looked at
    # --insecure: serves, and says so loudly
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", "--insecure"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "FUSION_SHIM": "0"})
    try:
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        assert "WARNING" in lines[1] and "WITHOUT AUTHENTICATION" in lines[1], lines
    finally:
        proc.kill()
        proc.wait(10)
    # a key file others can read is refused; so are --keys with --insecure
    d, _ = keys
    leaky = tmp_path / "leaky"
    leaky.mkdir()
    for name in ("server.key_secret", "server.key"):
        (leaky / name).write_bytes((d / name).read_bytes())
    (leaky / "server.key_secret").chmod(0o644)
    (leaky / "authorized").mkdir()
    r = subprocess.run([PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", "--keys", str(leaky)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "FUSION_SHIM": "0"})
    assert r.returncode == 2 and "readable by others" in r.stderr, r.stderr
    r = subprocess.run([PY, "-m", "fusion_shim", "worker", "--bind", url, "--keys", str(d), "--insecure"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "exclude each other" in r.stderr


def test_missing_allow_list_fails_closed(keys, tmp_path):
    from fusion_shim.worker import Worker, serve

    d, _ = keys
    bare = tmp_path / "bare"
    bare.mkdir(mode=0o700)
    (bare / "server.key_secret").write_bytes((d / "server.key_secret").read_bytes())
    (bare / "server.key_secret").chmod(0o600)
    with pytest.raises(auth.KeyFileError, match="authorized is missing"):
        serve(f"tcp://127.0.0.1:{free_port()}", Worker(backend=object(), kernels={}), keys=str(bare))


# -- the wire at the socket ---------------------------------------------------------------------------------

def test_message_size_limit_at_the_socket(keys):
    d, _ = keys
    w = Counted(d, max_bytes=1 << 20)
    try:
        pair = auth.load_pair(str(d / "alice.key_secret"))
        server_pub = auth.load_public(str(d / "server.key"))
        with dealt(w.url, server_pub, pair) as (sock, mon):
            sock.send_multipart(HELLO)
            assert sock.poll(REPLY_MS)
            sock.recv_multipart()
            assert w.dispatched == 1
            # one frame over MAXMSGSIZE: the socket drops the connection; nothing is buffered or dispatched
            big = np.zeros((1 << 20) // 8 + 1024)
            sock.send_multipart(wire.encode({"t": "call", "id": 5, "op": "matmul"}, [big]))
            assert not sock.poll(1500)
            assert zmq.EVENT_DISCONNECTED in monitor_events(mon, until=zmq.EVENT_DISCONNECTED)
            assert w.dispatched == 1
        # frames under the socket's limit but over the budget together: an error reply, no allocation
        with dealt(w.url, server_pub, pair) as (sock, mon):
            half = np.zeros((1 << 20) // 8 // 2 + 16)
            sock.send_multipart(wire.encode({"t": "call", "id": 6, "op": "matmul", "params": {"cdtype": "<f8"},
                                             "layouts": ["C"], "results": []}, [half, half]))
            assert sock.poll(REPLY_MS)
            header, _ = wire.decode(sock.recv_multipart())
            assert header["t"] == "error" and "over the limit" in header["msg"], header
            # declared results over the budget: refused before the kernel runs
            small = np.ones((4, 4))
            sock.send_multipart(wire.encode({"t": "call", "id": 7, "op": "matmul", "params": {"cdtype": "<f8"},
                                             "layouts": ["C"], "results": [{"dtype": "<f8", "shape": [1 << 18, 1]}]},
                                            [small, small]))
            assert sock.poll(REPLY_MS)
            header, _ = wire.decode(sock.recv_multipart())
            assert header["t"] == "error" and "declared results need" in header["msg"], header
            # an FFT size that does not fit the declared results: refused before the kernel runs
            x = np.ones(16, dtype=np.complex128)
            sock.send_multipart(wire.encode({"t": "call", "id": 8, "op": "fft.fft1",
                                             "params": {"cdtype": "<c16", "n": 1 << 40, "axis": -1, "norm": None,
                                                        "kind": "fft"},
                                             "layouts": ["C"], "results": [{"dtype": "<c16", "shape": [16]}]}, [x]))
            assert sock.poll(REPLY_MS)
            header, _ = wire.decode(sock.recv_multipart())
            assert header["t"] == "error" and "does not fit the declared results" in header["msg"], header
            # too many frames
            sock.send_multipart([msgpack.packb({"v": 1, "t": "call", "id": 9})] + [b"\0" * 8] * wire.MAX_FRAMES)
            assert sock.poll(REPLY_MS)
            header, _ = wire.decode(sock.recv_multipart())
            assert header["t"] == "error" and "frames, over the limit" in header["msg"], header
            # a kernel whose results differ from the declared ones: an error, never sent
            sock.send_multipart(wire.encode({"t": "call", "id": 10, "op": "matmul", "params": {"cdtype": "<f8"},
                                             "layouts": ["C"], "results": [{"dtype": "<f8", "shape": [4, 5]}]},
                                            [small, small]))
            assert sock.poll(REPLY_MS)
            header, arrays = wire.decode(sock.recv_multipart())
            assert header["t"] == "error" and header["exc"] == "ResultMismatch" and arrays == [], header
    finally:
        w.close()


def test_ndim_limit_is_64():
    assert wire.MAX_NDIM == 64
    ok = wire.encode({"t": "result", "id": 1}, [np.zeros((1,) * 64)])
    wire.decode(ok)
    meta = {"dtype": "<f8", "shape": [1] * 65, "order": "C"}
    with pytest.raises(wire.WireError, match="at most 64"):
        wire.decode([msgpack.packb({"v": 1, "t": "result", "id": 1, "arrays": [meta]}), b"\0" * 8])


# -- no pickle, cloudpickle or marshal on the default path ---------------------------------------------------

DEFAULT_PATH = ["protocol/wire.py", "protocol/fingerprint.py", "transport/__init__.py", "client/runtime.py", "client/call.py", "client/remote.py", "auth.py", "config.py", "catalog/__init__.py",
                "catalog/base.py", "catalog/products.py", "catalog/linalg.py", "catalog/fft.py", "catalog/scipy.py",
                "catalog/numba.py", "transport/shm.py", "transport/shm_common.py",
                "transport/shm_client.py", "transport/shm_worker.py",
                "plan/__init__.py", "ledger.py", "intercept/__init__.py", "worker/server.py", "worker/kernels/__init__.py",
                "worker/backend.py", "worker/bench.py",
                "worker/__init__.py", "reporting/__init__.py", "cli.py", "__init__.py", "_bootstrap.py"]
# copyreg is not a deserialiser (a registry every interpreter imports at start-up); the C fast path
# registers how its proxies pickle by name, like the functions they stand for (issue 3)
FORBIDDEN = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}
# stages (docs/stages.md) ship code by opt-in: this one module pickles, loaded only where stages are
# in use (tests/stage/test_opt_in.py checks that a run without them never loads it)
STAGE_PICKLERS = {"protocol/code.py"}


def test_default_path_source_never_imports_a_deserialiser():
    pkg = ROOT / "fusion_shim"
    present = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")}
    assert set(DEFAULT_PATH) <= present
    for rel in sorted(present - STAGE_PICKLERS):  # every module of the package, not only the list above
        tree = ast.parse((pkg / rel).read_text(), rel)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                names = [getattr(node.args[0], "value", "")] if node.args else []
            assert not FORBIDDEN & set(names), f"{rel}:{node.lineno} imports {names}"
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                assert getattr(node.value, "value", None) is False, f"{rel}:{node.lineno} allow_pickle"


def test_a_remote_round_trip_loads_no_pickle_module(tmp_path):
    code = """
import sys
import numpy
before = set(sys.modules)
import fusion_shim
from fusion_shim import transport, auth
from fusion_shim.client import runtime
from fusion_shim.protocol import wire
import zmq, msgpack
ctx = transport.context()
a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
a.bind("inproc://p"); b.connect("inproc://p")
for f in wire.encode({"t": "result", "id": 1}, [numpy.ones((300, 300))])[:-1]:
    a.send(f, zmq.SNDMORE)
a.send(wire.encode({"t": "result", "id": 1}, [numpy.ones((300, 300))])[-1])
h, arrs = wire.decode(b.recv_multipart(copy=False))
assert arrs[0].sum() == 90000
print(sorted(m for m in ("pickle", "_pickle", "cloudpickle", "dill", "copyreg", "shelve") if m in sys.modules and m not in before))
"""
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout

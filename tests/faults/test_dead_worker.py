"""A worker that never started, one killed between calls or during a call, a connection dropped as
its worker exits, an op that kills its worker: each call still returns NumPy's answer, recorded as
``fallback`` with its reason, and the worker's lifecycle shows in the events. Workers run as
subprocesses (``python -m fusion_shim worker``) or tests/helpers/faultlab.py's SIMULATED ones.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.client import checks as client_checks

from tests.helpers import faultlab as _faultlab
from tests.helpers.faults import PY, clean_env, events, install, last, operands, records, rng_matrix
from tests.helpers.shims import READY_S


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


# -- the worker never started -----------------------------------------------------------------

def test_worker_never_started(sock_dir):
    rt = install(f"ipc://{sock_dir}/nobody.sock", ready_timeout=1.0)
    took = []
    for seed in range(3):
        a, b, want = operands(seed)
        t = time.monotonic()
        np.testing.assert_array_equal(np.matmul(a, b), want)
        took.append(time.monotonic() - t)
    # only the first call may wait, and only ready_timeout: the others together take less than one wait
    assert sum(took[1:]) < 1.0, took
    recs = records(rt)
    assert [r.kind for r in recs] == ["fallback"] * 3
    assert all(r.reason.startswith("worker ") for r in recs), [r.reason for r in recs]
    assert [r.fallback for r in recs] == ["no_worker_ready"] * 3  # D323
    assert recs[0].phases.get("wait_ready", 0) > 0.5  # the wait is its own phase
    assert "worker not ready" in events(rt)
    rep = fusion_shim.report(format="json")
    assert rep["ops"]["numpy.matmul"]["fallback"] == 3 and rep["ops"]["numpy.matmul"]["worker"] == 0
    assert rep["summary"]["fallbacks_by_kind"] == {"no_worker_ready": 3}
    assert rep["worker"]["state"] == "down" and rep["worker"]["ready_after_s"] is None


def test_worker_never_started_launcher_report(tmp_path, sock_dir):
    prog = tmp_path / "app.py"
    prog.write_text(textwrap.dedent("""\
        import numpy as np
        a = np.arange(12.0).reshape(3, 4)
        print(np.matmul(a, a.T).tolist())
        print(np.linalg.solve(np.eye(3) * 2, np.ones(3)).tolist())
    """))
    out = tmp_path / "run.json"
    r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "remote", "--worker", f"ipc://{sock_dir}/none.sock",
                        "--report", str(out), "--quiet", str(prog)], capture_output=True, text=True,
                       timeout=600, env=clean_env(FUSION_SHIM_READY_TIMEOUT="1"))
    assert r.returncode == 0, r.stderr
    a = np.arange(12.0).reshape(3, 4)
    assert r.stdout.splitlines() == [str((a @ a.T).tolist()), str([0.5, 0.5, 0.5])]
    rep = json.loads(out.read_text())
    kinds = {rec["op"]: (rec["kind"], rec["reason"]) for rec in rep["records"]}
    assert kinds["numpy.matmul"][0] == kinds["numpy.linalg.solve"][0] == "fallback"
    assert rep["ops"]["numpy.matmul"]["reasons"]  # the reason is aggregated too
    assert any("worker not ready" in e["what"] for e in rep["events"])


# -- the worker is killed between calls ------------------------------------------------------------

def test_worker_killed_between_calls_and_replaced(workers):
    proc, url = workers.start()
    rt = install(url, timeout=2.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(1)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker"

    proc.kill()
    proc.wait(10)
    a, b, want = operands(2)
    t = time.monotonic()
    np.testing.assert_array_equal(np.matmul(a, b), want)
    took = time.monotonic() - t
    rec = records(rt)[-1]
    assert rec.kind == "fallback", rec
    # the channel's monitor saw the connection close: the call does not wait for its deadline (issue 8)
    assert rec.reason.startswith("WorkerLost"), rec.reason
    assert took < 2.0, took  # the deadline: a busy machine may take a while to see the close
    assert "worker fault: WorkerLost" in events(rt)
    assert fusion_shim.report(format="json")["ops"]["numpy.matmul"]["fallback"] == 1

    # a new worker on the same address: the shim's probe finds it and calls go there again
    workers.start()
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(3)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker"


def test_worker_killed_between_repeated_calls(workers):
    """Calls sent from their template (D45: residency off) fall back the same way."""
    proc, url = workers.start()
    rt = install(url, timeout=2.0, residency=False)
    assert rt.link.wait_ready(READY_S), events(rt)
    for seed in (1, 2):
        a, b, want = operands(seed)
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker" and rt.calls.repeated == 1
    proc.kill()
    proc.wait(10)
    a, b, want = operands(3)
    np.testing.assert_array_equal(np.matmul(a, b), want)
    rec = records(rt)[-1]
    assert rec.kind == "fallback" and rec.reason.startswith("WorkerLost"), rec.reason


# -- the worker is killed during a call -------------------------------------------------------------

def test_external_worker_killed_during_call(workers):
    proc, url = workers.start(delay=2.0)
    rt = install(url, timeout=3.0)
    assert rt.link.wait_ready(READY_S), events(rt)  # hello is not delayed, calls are
    killer = threading.Timer(0.5, proc.kill)
    killer.start()
    a, b, want = operands(4)
    t = time.monotonic()
    try:
        got = np.matmul(a, b)
    finally:
        killer.join()
    took = time.monotonic() - t
    np.testing.assert_array_equal(got, want)
    assert proc.wait(10) == -signal.SIGKILL
    rec = records(rt)[-1]
    # the closed connection is seen at once (issue 8), not at the 3 s deadline
    assert rec.kind == "fallback" and rec.reason.startswith("WorkerLost"), rec
    assert rec.fallback == "worker_lost", rec.fallback  # D323
    assert 0.5 <= took < 3.0, took  # killed at 0.5 s, seen before the deadline however busy the machine


EMBEDDED_APP = """\
    import json, os, signal, threading, time
    import numpy as np
    import fusion_shim

    from fusion_shim.intercept import bypassed

    rt = fusion_shim.active()
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((64, 64)) for _ in range(3))
    with bypassed():  # NumPy's own products, for reference
        aa, bb, cc = a @ a, b @ b, c @ c
    out = {"r1": bool(np.allclose(np.matmul(a, a), aa, rtol=1e-12))}
    pid = rt.link.proc.pid
    out["first_pid"] = pid
    # stopped, the worker cannot answer: the next call is surely in flight when it is killed
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    t = time.perf_counter()
    r2 = np.matmul(b, b)
    out["took"] = time.perf_counter() - t
    out["r2"] = bool(np.array_equal(r2, bb))
    r3 = np.matmul(c, c)  # the restarted worker
    out["r3"] = bool(np.allclose(r3, cc, rtol=1e-12))
    out["kinds"] = [r.kind for r in rt.ledger.records]
    out["reasons"] = [r.reason for r in rt.ledger.records]
    out["restarts"] = rt.link.restarts
    out["second_pid"] = rt.link.proc.pid
    print(json.dumps(out))
"""


def test_embedded_worker_killed_during_call(tmp_path):
    prog = tmp_path / "embedded.py"
    prog.write_text(textwrap.dedent(EMBEDDED_APP))
    report = tmp_path / "run.json"
    r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "remote", "--device", "cpu", "--quiet",
                        "--report", str(report), str(prog)],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["r1"] and out["r2"] and out["r3"], out
    # the embedded worker's process is watched: its death ends the wait at once, not after 60 s
    assert out["took"] < 30, out  # half the 60 s deadline: the wait ended on the death, not the deadline
    assert out["kinds"] == ["worker", "fallback", "worker"], out
    assert out["reasons"][1].startswith("WorkerDied"), out
    assert out["restarts"] == 1 and out["second_pid"] != out["first_pid"]
    rep = json.loads(report.read_text())
    assert rep["worker"]["restarts"] == 1
    whats = [e["what"] for e in rep["events"]]
    assert any("worker fault: WorkerDied" in w for w in whats), whats
    assert any("restart 1" in w for w in whats), whats
    # the restarted worker did not outlive the program
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(out["second_pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(out["second_pid"], signal.SIGKILL)
        pytest.fail("the embedded worker outlived its program")


# -- a dropped connection, then the worker's exit ----------------------------------------------------

def test_a_dropped_connection_whose_worker_process_is_exiting_is_reported_as_its_death(monkeypatch):
    """A killed worker closes its sockets before its exit can be reaped: the connection's drop can be
    seen first. Where this process watches the worker, a drop followed within moments by its exit is
    WorkerDied (the report's reason: the embedded worker-killed test read "lost" once in CI); a drop
    alone, with no process watched or one still running, stays WorkerLost."""
    from fusion_shim import transport

    url = f"inproc://fusion-shim-tests-nobody-{os.getpid()}"
    chan = transport.Channel(url)
    try:
        monkeypatch.setattr(chan, "_events", lambda data_only=False: None)
        monkeypatch.setattr(chan, "_problem", lambda mark: transport.WorkerLost("connection lost"))
        checks = iter([True, True, True, False])  # alive at the slice's check, gone a moment later
        with pytest.raises(transport.WorkerDied):
            chan._wait(1, time.monotonic() + 5, lambda: next(checks, False), 0)
        with pytest.raises(transport.WorkerLost):
            chan._wait(1, time.monotonic() + 5, lambda: True, 0)
        with pytest.raises(transport.WorkerLost):
            chan._wait(1, time.monotonic() + 5, None, 0)
    finally:
        chan.close()


# -- an op that brings the worker down three times ---------------------------------------------------------

def test_op_that_kills_the_worker_three_times_runs_locally(sock_dir):
    lab = _faultlab.FaultLab(sock_dir, crash_op="linalg.inv")  # SIMULATED: this kernel kills its worker
    a = rng_matrix(5)
    a32 = a.astype(np.float32)
    want, want32, want_mm = np.linalg.inv(a), np.linalg.inv(a32), a @ a
    try:
        rt = fusion_shim.install(policy="remote", worker=lab.url, quiet=True, timeout=10.0, ready_timeout=10.0)
        for i in range(client_checks.CRASH_LIMIT):
            assert rt.link.wait_ready(READY_S), events(rt)
            np.testing.assert_allclose(np.linalg.inv(a), want)
            rec = last(rt, "numpy.linalg.inv")
            assert rec.kind == "fallback" and rec.reason.startswith("WorkerLost"), rec.reason
            assert rec.fallback == "worker_lost", rec.fallback  # D323
        assert lab.crashes() == ["linalg.inv <f8"] * client_checks.CRASH_LIMIT
        assert rt.link.wait_ready(READY_S), events(rt)
        # the fourth: pinned, never sent
        np.testing.assert_allclose(np.linalg.inv(a), want)
        rec = last(rt, "numpy.linalg.inv")
        assert rec.kind == "fallback" and rec.reason.startswith("pinned local: linalg.inv(<f8)"), rec.reason
        assert rec.fallback == "pinned", rec.fallback
        by_kind = fusion_shim.report(format="json")["ops"]["numpy.linalg.inv"]["fallbacks_by_kind"]
        assert by_kind == {"worker_lost": client_checks.CRASH_LIMIT, "pinned": 1}, by_kind
        assert lab.crashes() == ["linalg.inv <f8"] * client_checks.CRASH_LIMIT
        assert "runs locally for the rest of the run" in events(rt)
        assert fusion_shim.report(format="json")["ops"]["numpy.linalg.inv"]["reasons"]
        # other ops still go to the worker, and so does the same op with other dtypes
        np.testing.assert_allclose(np.matmul(a, a), want_mm)
        assert last(rt).kind == "worker"
        np.testing.assert_allclose(np.linalg.inv(a32), want32, rtol=1e-4)
        assert last(rt, "numpy.linalg.inv").reason.startswith("WorkerLost")
        assert rt.checks.crashes == {("linalg.inv", ("<f8",)): 3, ("linalg.inv", ("<f4",)): 1}
    finally:
        fusion_shim.uninstall()
        lab.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free again once closed: nothing listens on it


@pytest.mark.parametrize("policy", ["auto", "remote"])
@pytest.mark.parametrize("where", ["tcp", "ipc", "unknown host"])
def test_an_address_where_nothing_listens_is_said_on_stderr_within_seconds(tmp_path, sock_dir, where, policy):
    """D35: a wrong worker address is said on stderr once, within about 2 s of NumPy's import, under
    auto and remote; under remote the call is not held for the --ready-timeout it was allowed."""
    urls = {"tcp": f"tcp://127.0.0.1:{_free_port()}", "ipc": f"ipc://{sock_dir}/nobody.sock",
            "unknown host": "tcp://nonexistent.invalid:5555"}  # .invalid never resolves (RFC 6761)
    url = urls[where]
    why = "unknown host" if where == "unknown host" else "connection refused"
    app = tmp_path / "app.py"
    app.write_text("import numpy as np\nprint('go', flush=True)\na = np.ones((300, 300))\n"
                   "print(float(np.matmul(a, a).sum()), flush=True)\nimport time\ntime.sleep(4)\n")
    plain = ["--insecure"] if url.startswith("tcp://") else []  # D181: without keys a tcp address is never tried
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "--policy", policy, "--worker", url, "--ready-timeout", "600",
                             "--quiet", *plain, "--report", str(tmp_path / "r.json"), str(app)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())
    said, lines = threading.Event(), []

    def read_stderr():
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("fusion_shim: no worker at"):
                said.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert proc.stdout.readline().strip() == "go"
        t = time.monotonic()
        assert said.wait(120), lines  # D35 says it at 1.5 s; a busy machine may take longer to run the probe
        took = time.monotonic() - t
        assert float(proc.stdout.readline()) == 300.0 ** 3
        assert proc.wait(120) == 0, lines
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    ours = [line for line in lines if line.startswith("fusion_shim: no worker at")]
    assert ours == [f"fusion_shim: no worker at {url} ({why}); computing here\n"], (ours, took)
    rep = json.loads((tmp_path / "r.json").read_text())
    text = "\n".join(e["what"] for e in rep["events"])
    said = "does not resolve" if where == "unknown host" else "connection refused"
    assert f"at {url}" in text and said in text, text
    if policy == "remote":
        rec = rep["records"][-1]
        assert rec["kind"] == "fallback", rec
        assert rec["phases"].get("wait_ready", 0.0) < 10, rec  # not the 600 s it was allowed

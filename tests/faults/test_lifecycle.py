"""The program around the shim: 8 threads x 200 mixed calls, offload forced, all right; a forked
child computes with its own connection; a client killed with SIGKILL leaves no worker behind;
Ctrl-C mid-call exits cleanly; exit with a stopped worker does not hang.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fusion_shim

from tests.helpers.faults import PY, clean_env, events, gone_within
from tests.helpers.shims import READY_S


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


# -- threads: 8 x 200 mixed calls, offload forced ------------------------------------------------------------

def _mixed_cases(seed: int, n: int) -> list[tuple]:
    r = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        k = int(r.integers(12, 40))
        a = r.standard_normal((k, k)) + k * np.eye(k)
        b = r.standard_normal((k, k))
        x = r.standard_normal(k)
        kind = i % 8
        if kind == 0:
            cases.append(("matmul", lambda a=a, b=b: np.matmul(a, b), a @ b))
        elif kind == 1:
            out = np.empty((k, k))
            cases.append(("matmul out=", lambda a=a, b=b, out=out: np.matmul(a, b, out=out), a @ b))
        elif kind == 2:
            cases.append(("dot", lambda a=a, x=x: np.dot(a, x), a @ x))
        elif kind == 3:
            cases.append(("solve", lambda a=a, b=b: np.linalg.solve(a, b), np.linalg.solve(a, b)))
        elif kind == 4:
            cases.append(("inv", lambda a=a: np.linalg.inv(a), np.linalg.inv(a)))
        elif kind == 5:
            cases.append(("einsum", lambda a=a, b=b: np.einsum("ij,jk->ik", a, b), a @ b))
        elif kind == 6:
            cases.append(("fft", lambda x=x: np.fft.fft(x), np.fft.fft(x)))
        else:
            cases.append(("svd", lambda a=a: np.linalg.svd(a, compute_uv=False), np.linalg.svd(a, compute_uv=False)))
    return cases


@pytest.mark.parametrize("residency", [True, False], ids=["residency", "templates"])
def test_eight_threads_two_hundred_mixed_calls_each(inproc_worker, residency):
    """``templates``: residency off, so the threads' repeated layouts share templates and their
    replies' skeletons (D45, D48), learnt by one thread while others read them."""
    per_thread = [_mixed_cases(100 + t, 200) for t in range(8)]  # expected answers: NumPy's, before the shim
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, timeout=60.0, residency=residency)
    assert rt.link.wait_ready(READY_S), events(rt)
    wrong, raised, channels = [], [], {}
    barrier = threading.Barrier(8)

    def run(t: int) -> None:
        barrier.wait()
        for i, (name, fn, want) in enumerate(per_thread[t]):
            try:
                got = fn()
            except Exception as exc:
                raised.append((t, i, name, repr(exc)))
                continue
            if not np.allclose(got, want, rtol=1e-9, atol=1e-9):
                wrong.append((t, i, name))
        channels[t] = rt.link.channel()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert raised == [] and wrong == [], (raised, wrong)
    snap = rt.ledger.snapshot()["ops"]
    assert sum(o["calls"] for o in snap.values()) == 1600  # nothing lost from the ledger either
    assert sum(o["worker"] for o in snap.values()) == 1600, {k: o["reasons"] for k, o in snap.items()}
    assert len({id(c) for c in channels.values()}) == 8  # one connection per thread
    if not residency:
        learnt = [t for t in rt.calls.templates.values() if not isinstance(t, str) and t.reply.header is not None]
        assert rt.calls.repeated > 0 and learnt


# -- fork: a child computes through the shim with its own connection ---------------------------------------------

FORK_APP = """\
import json, os, sys
import numpy as np
import fusion_shim

r = np.random.default_rng(0)
a, b, c = (r.standard_normal((64, 64)) for _ in range(3))
want = {"a": a @ a, "b": b @ b, "c": c @ c}
rt = fusion_shim.install(policy="remote", device="cpu", quiet=True)
assert rt.link.wait_ready(600), rt.ledger.events
out = {"parent_a": bool(np.allclose(np.matmul(a, a), want["a"])), "parent_kind": rt.ledger.records[-1].kind}
parent_chan = rt.link.channel()
rfd, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(rfd)
    try:
        got = np.matmul(b, b)
        chan = rt.link._local.chan
        child = {"ok": bool(np.allclose(got, want["b"])), "kind": rt.ledger.records[-1].kind,
                 "own_channel": chan is not parent_chan and chan.pid == os.getpid(),
                 "parent_socket_untouched": not parent_chan.sock.closed,
                 "records": len(rt.ledger.records)}
    except BaseException as exc:
        child = {"error": repr(exc)}
    os.write(wfd, json.dumps(child).encode())
    os.close(wfd)
    sys.exit(0)  # a normal exit: atexit runs in the child and must leave the parent's worker alone
os.close(wfd)
data = b""
while chunk := os.read(rfd, 65536):
    data += chunk
_, status = os.waitpid(pid, 0)
out["child"] = json.loads(data)
out["child_status"] = status
out["parent_c"] = bool(np.allclose(np.matmul(c, c), want["c"]))
out["parent_c_kind"] = rt.ledger.records[-1].kind
out["parent_same_channel"] = rt.link.channel() is parent_chan
out["worker_alive"] = rt.link.alive()
print(json.dumps(out))
"""


def test_forked_child_computes_with_its_own_connection(tmp_path):
    prog = tmp_path / "fork_app.py"
    prog.write_text(FORK_APP)
    r = subprocess.run([PY, str(prog)], capture_output=True, text=True, timeout=600, env=clean_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["parent_a"] and out["parent_kind"] == "worker", out
    child = out["child"]
    assert child.get("ok") and child["kind"] == "worker", child
    assert child["own_channel"] and child["parent_socket_untouched"], child
    assert child["records"] == 1  # the child reports its own calls only
    assert out["child_status"] == 0
    assert out["parent_c"] and out["parent_c_kind"] == "worker" and out["parent_same_channel"], out
    assert out["worker_alive"], out


# -- the program's end: SIGKILL, Ctrl-C, exit with a stopped worker ----------------------------------------------

LIFE_APP = """\
import os, signal, sys, time
import numpy as np
import fusion_shim

rt = fusion_shim.active()
a = np.random.default_rng(0).standard_normal((256, 256))
np.matmul(a, a)
assert rt.ledger.records[-1].kind == "worker", rt.ledger.records[-1]
print(rt.link.proc.pid, flush=True)
mode = sys.argv[1]
if mode == "sleep":
    time.sleep(120)
elif mode == "busy":
    while True:
        np.matmul(a, a)
elif mode == "stop_worker":
    os.kill(rt.link.proc.pid, signal.SIGSTOP)
    print("stopped", flush=True)
"""


def _launch(tmp_path, mode: str) -> tuple[subprocess.Popen, int]:
    prog = tmp_path / "life.py"
    prog.write_text(LIFE_APP)
    # SIGINT as a terminal gives it: a test run started in the background by a non-interactive
    # shell (`cmd &`) ignores SIGINT, its children inherit that, and Python then keeps it ignored
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "--policy", "remote", "--device", "cpu", "--quiet",
                             str(prog), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()
    assert line.strip().isdigit(), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line)


def test_sigkill_of_the_client_leaves_no_worker(tmp_path):
    proc, worker_pid = _launch(tmp_path, "sleep")
    proc.kill()
    proc.wait(10)
    assert gone_within(worker_pid, 5), "the embedded worker outlived its killed client"


def test_ctrl_c_mid_calls_exits_cleanly(tmp_path):
    proc, worker_pid = _launch(tmp_path, "busy")
    time.sleep(0.5)  # in the middle of remote calls
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert time.monotonic() - t < 10
    assert proc.returncode == -signal.SIGINT, err  # as plain python: KeyboardInterrupt, then SIGINT
    assert "KeyboardInterrupt" in err
    assert "fusion_shim" not in err.split("Traceback", 1)[-1], err  # the shim's frames are not shown
    assert gone_within(worker_pid, 5), "the embedded worker outlived its interrupted client"


def test_exit_with_a_stopped_worker_does_not_hang(tmp_path):
    proc, worker_pid = _launch(tmp_path, "stop_worker")
    t = time.monotonic()
    proc.wait(30)
    out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): readline buffered ahead
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert time.monotonic() - t < 6, time.monotonic() - t
    assert gone_within(worker_pid, 5)


@pytest.mark.parametrize("cause", ["torch missing", "bad device"])
def test_a_worker_that_cannot_start_is_named_with_its_fix_and_not_restarted(tmp_path, cause):
    """A client installed without the worker's extra (here a stand-in torch that fails as a missing
    one does), or a device this host lacks: the embedded worker dies at start; no restart, and
    stderr and the report say the reason and the fix in one line."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    if cause == "torch missing":
        (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    app = tmp_path / "app.py"
    app.write_text("import numpy as np\na = np.ones((300, 300))\nprint(float(np.matmul(a, a).sum()))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    if cause == "torch missing":
        env["PYTHONPATH"] = str(tmp_path / "site")
    device = "cpu" if cause == "torch missing" else "cuda:9"  # no host here has ten GPUs
    r = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--device", device, "--quiet",
                        "--report", str(tmp_path / "r.json"), str(app)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == 300.0 ** 3
    events = [e["what"] for e in json.loads((tmp_path / "r.json").read_text())["events"]]
    exits = [e for e in events if "embedded worker exited" in e]
    assert len(exits) == 1 and "not restarted" in exits[0], events
    said = [line for line in r.stderr.splitlines() if line.startswith("fusion_shim: the embedded worker cannot start")]
    assert len(said) == 1, r.stderr
    if cause == "torch missing":
        assert "No module named 'torch'" in said[0] and "pip install 'fusion-shim[worker]'" in said[0], said
    else:
        assert "--device" in said[0] and "--worker URL" in said[0], said


CTRL_C_APP = """\
import sys
import numpy as np
a = np.ones((300, 300))
if sys.argv[1] == "call":
    np.matmul(a, a)  # waits for the embedded worker: warm from here on
    a = np.random.default_rng(0).standard_normal((2500, 2500))
print("go", flush=True)
b = np.linalg.svd(a) if sys.argv[1] == "call" else np.matmul(a, a)
"""


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


@pytest.mark.parametrize("during", ["call", "readiness wait"])
def test_ctrl_c_prints_the_report_a_clean_traceback_and_leaves_no_worker(tmp_path, during):
    """SIGINT inside a remote call on the embedded worker, or while the first call waits for it to
    warm: as plain Python (KeyboardInterrupt, exit by SIGINT, no frame of the shim, pyzmq or
    threading), with the report still printed and the worker gone."""
    prog = tmp_path / "app.py"
    prog.write_text(CTRL_C_APP)
    proc = subprocess.Popen([PY, "-m", "fusion_shim", "--policy", "remote", "--device", "cpu", str(prog),
                             "call" if during == "call" else "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "go", proc.stderr.read() if proc.poll() is not None else ""
        workers = _children(proc.pid)
        assert workers, "no embedded worker was started"
        time.sleep(1.0)  # in the svd (seconds on a CPU worker), or in the worker's warm-up
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGINT, err
    start, end = err.index("Traceback (most recent call last):"), err.index("\nKeyboardInterrupt")
    tb = err[start:end]
    assert 'app.py", line 8' in tb, err
    assert "fusion_shim" not in tb and "zmq" not in tb and "threading.py" not in tb, tb
    assert "fusion_shim report" in err[end:], err
    assert all(gone_within(pid, 10) for pid in workers), "the embedded worker outlived its interrupted client"


def test_ctrl_c_while_the_first_call_makes_the_call_path_leaves_its_record(inproc_worker, monkeypatch):
    """A Ctrl-C that lands while the first call above the floor loads the call path's modules (a
    slow import on a loaded machine): the program sees KeyboardInterrupt, the run keeps the call's
    record, so the report at exit is printed; the next call makes the call path."""
    from fusion_shim.client.runtime import Runtime
    from tests.helpers.shims import installed

    with installed(inproc_worker, timeout=30.0) as rt:
        rt._calls = None
        parts = Runtime._parts
        monkeypatch.setattr(Runtime, "_parts", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
        a = np.ones((64, 64))
        with pytest.raises(KeyboardInterrupt):
            np.matmul(a, a)
        (rec,) = [r for r in rt.ledger.records if r.raised == "KeyboardInterrupt"]
        assert rec.kind == "fallback" and rec.reason == "interrupted before it ran" and rec.op == "numpy.matmul"
        assert rec.fallback == "interrupted"  # D323
        assert "test_lifecycle.py:" in rec.site  # the program's line
        assert rt.ledger.snapshot_ops()["numpy.matmul"]["fallback"] == 1  # what the report at exit counts
        assert rt.ledger.snapshot_ops()["numpy.matmul"]["fallbacks_by_kind"] == {"interrupted": 1}
        monkeypatch.setattr(Runtime, "_parts", parts)
        np.testing.assert_array_equal(np.matmul(a, a), np.full((64, 64), 64.0))
        assert rt.ledger.records[-1].kind == "worker"

"""Issue 8: faults survived with nothing lost, and a client that behaves inside a real program.

- Fault injection: a worker SIGKILLed, SIGSTOPped or dropping replies at random points of every call
  phase (tests/helpers/faultlab.py: the real server loop with NumPy kernels, SIMULATED device), >= 200
  injections: every answer right, no exception reaching the program, no call past its deadline.
- Heartbeats: a stopped external worker is noticed in about a second, not at the call's deadline.
- Per-call deadlines follow the prediction; an op in flight at three worker deaths runs locally.
- Out of memory: retried once after freeing, else an error reply and the call runs locally.
- The health probe does device work: a worker whose kernels give wrong answers is never "ready".
- 8 threads x 200 mixed calls, offload forced: all right. A forked child computes with its own
  connection. A client killed with SIGKILL leaves no worker behind; Ctrl-C mid-call exits cleanly.
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
from fusion_shim import transport
from fusion_shim.client import call as client_call, checks as client_checks, link as client_link
from fusion_shim.intercept import bypassed

from tests.helpers import faultlab as _faultlab
from tests.helpers.shims import READY_S

PY = sys.executable


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


def events(rt) -> str:
    return "\n".join(text for _, text in rt.ledger.events)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.update(extra)
    return env


def rng_matrix(seed: int, n: int = 48) -> np.ndarray:
    r = np.random.default_rng(seed)
    return r.standard_normal((n, n)) + n * np.eye(n)


def last(rt, op: str = "numpy.matmul"):
    return [r for r in rt.ledger.records if r.op == op][-1]


# -- heartbeats: a stopped worker is noticed in about a second ------------------------------------------

def test_stopped_external_worker_is_noticed_by_heartbeat(sock_dir, monkeypatch):
    monkeypatch.setattr(client_link, "REPROBE_MAX_S", 0.3)  # TEST SETTING: re-probe a stopped worker often
    lab = _faultlab.FaultLab(sock_dir, resume_after=None, delay=0.5)  # stays stopped; calls take 0.5 s
    try:
        rt = fusion_shim.install(policy="remote", worker=lab.url, quiet=True, timeout=30.0, ready_timeout=10.0)
        assert rt.link.wait_ready(READY_S), events(rt)
        a, b, c = rng_matrix(1), rng_matrix(2), rng_matrix(3)
        with bypassed():  # NumPy's own answers: `@` is intercepted too
            want_a, want_b, want_c = a @ a, b @ b, c @ c
        np.testing.assert_allclose(np.matmul(a, a), want_a)
        assert last(rt).kind == "worker", last(rt).reason

        # stopped in the middle of a call: the deadline is >= 5 s (and the cap 30 s); the heartbeat
        # ends the wait about HEARTBEAT_TIMEOUT_MS after the worker's last answer
        threading.Timer(0.2, os.kill, (lab.current, signal.SIGSTOP)).start()
        t = time.monotonic()
        got = np.matmul(b, b)
        took = time.monotonic() - t
        np.testing.assert_array_equal(got, want_b)  # computed here
        rec = last(rt)
        assert rec.kind == "fallback" and rec.reason.startswith("WorkerLost"), rec.reason
        assert "heartbeat" in rec.reason, rec.reason
        # not the deadline's end (at least DEADLINE_FLOOR_S): the heartbeat's (load only delays it)
        assert transport.HEARTBEAT_TIMEOUT_MS / 1000 - 0.1 < took < client_call.DEADLINE_FLOOR_S, took

        # resumed: the background probe finds it again
        os.kill(lab.current, signal.SIGCONT)
        assert rt.link.wait_ready(READY_S), events(rt)
        np.testing.assert_allclose(np.matmul(c, c), want_c)
        assert last(rt).kind == "worker"

        # stopped between calls: the next call is sent into a connection that still looks up
        os.kill(lab.current, signal.SIGSTOP)
        time.sleep(0.05)
        t = time.monotonic()
        np.testing.assert_array_equal(np.matmul(b, b), want_b)
        took = time.monotonic() - t
        assert last(rt).reason.startswith("WorkerLost"), last(rt).reason
        assert took < 2.0, took
        os.kill(lab.current, signal.SIGCONT)
    finally:
        fusion_shim.uninstall()
        lab.close()


# -- per-call deadlines ------------------------------------------------------------------------------

def test_deadline_follows_the_prediction(monkeypatch):
    from fusion_shim.worker import serve_in_thread

    monkeypatch.setattr(client_call, "DEADLINE_FLOOR_S", 0.3)  # TEST SETTING: 5 s in production
    worker = _faultlab.numpy_worker()
    url = f"inproc://deadline-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=worker)
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=20.0, ready_timeout=10.0)
        assert rt.link.wait_ready(READY_S), events(rt)
        a = rng_matrix(4)
        with bypassed():
            want = a @ a
        # unmeasured: an uncalibrated prediction is not trusted, the deadline is the 20 s cap
        worker.delay = 0.6
        np.testing.assert_allclose(np.matmul(a, a), want)
        assert last(rt).kind == "worker"
        device = rt.planner.profile.workers[0].device
        assert ("numpy.matmul", "f8") in rt.link.answered  # the op is measured on the worker now
        call = last(rt).plan[0]  # what the planner priced
        # the 0.6 s went to the link model (the delay is outside the worker's kernel time); a few
        # prompt answers bring it back (StarPU's rule resets it to the connect-time round trip)
        worker.delay = 0.0
        for _ in range(3):
            np.testing.assert_allclose(np.matmul(a, a), want)
        predicted_before = device.predict(call.op, call.family, call.dtype, call.flops)[0]
        # measured: the deadline is max(floor, 20 x predicted) = 0.3 s here, far below the cap
        worker.delay = 5.0  # far past the 0.3 s deadline: a call that waited for it took 5 s
        t = time.monotonic()
        np.testing.assert_array_equal(np.matmul(a, a), want)
        took = time.monotonic() - t
        rec = last(rt)
        assert rec.kind == "fallback" and rec.reason.startswith("Timeout"), rec.reason
        assert "(0.3 s: predicted" in rec.reason, rec.reason
        assert 0.3 <= took < 4.0, took
        # it took at least the deadline: the model learned the calls are slower than it thought
        assert device.predict(call.op, call.family, call.dtype, call.flops)[0] > predicted_before
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(5)


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
        assert lab.crashes() == ["linalg.inv <f8"] * client_checks.CRASH_LIMIT
        assert rt.link.wait_ready(READY_S), events(rt)
        # the fourth: pinned, never sent
        np.testing.assert_allclose(np.linalg.inv(a), want)
        rec = last(rt, "numpy.linalg.inv")
        assert rec.kind == "fallback" and rec.reason.startswith("pinned local: linalg.inv(<f8)"), rec.reason
        assert lab.crashes() == ["linalg.inv <f8"] * client_checks.CRASH_LIMIT
        assert "runs locally for the rest of the run" in events(rt)
        assert fusion_shim.report()["ops"]["numpy.linalg.inv"]["reasons"]
        # other ops still go to the worker, and so does the same op with other dtypes
        np.testing.assert_allclose(np.matmul(a, a), want_mm)
        assert last(rt).kind == "worker"
        np.testing.assert_allclose(np.linalg.inv(a32), want32, rtol=1e-4)
        assert last(rt, "numpy.linalg.inv").reason.startswith("WorkerLost")
        assert rt.checks.crashes == {("linalg.inv", ("<f8",)): 3, ("linalg.inv", ("<f4",)): 1}
    finally:
        fusion_shim.uninstall()
        lab.close()


# -- out of memory (SIMULATED: the backend raises torch's OutOfMemoryError) ------------------------------

def test_out_of_memory_is_retried_once_then_runs_locally():
    import torch

    from fusion_shim.worker import serve_in_thread

    worker = _faultlab.numpy_worker()
    backend = worker.backend
    run = backend.run
    state = {"fail": 0, "freed": 0}

    def flaky_run(*args):
        if state["fail"]:
            state["fail"] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return run(*args)

    def free_memory():
        state["freed"] += 1

    backend.run, backend.free_memory = flaky_run, free_memory
    url = f"inproc://oom-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=worker)
    a = rng_matrix(6)
    want = a @ a
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=20.0, ready_timeout=10.0)
        assert rt.link.wait_ready(READY_S), events(rt)
        state["fail"] = 1  # the retry after freeing succeeds
        np.testing.assert_allclose(np.matmul(a, a), want)
        rec = last(rt)
        assert rec.kind == "worker" and state["freed"] == 1, (rec, state)
        assert "retry succeeded" in events(rt)
        state["fail"] = 2  # the retry fails too: an error reply, and the call runs here
        np.testing.assert_allclose(np.matmul(a, a), want)
        rec = last(rt)
        assert rec.kind == "fallback" and "(out_of_memory)" in rec.reason, rec.reason
        assert state["freed"] == 2 and state["fail"] == 0
        # an error reply is about that call: the worker stays ready and takes the next one
        np.testing.assert_allclose(np.matmul(a, a), want)
        assert last(rt).kind == "worker"
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(5)


def test_out_of_memory_detection():
    import torch

    from fusion_shim.worker.server import _is_oom

    assert _is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert _is_oom(MemoryError())
    assert _is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not _is_oom(RuntimeError("linalg.inv: The diagonal element 2 is zero"))


# -- the health probe does device work --------------------------------------------------------------------

def test_health_probe_catches_a_worker_that_computes_wrong():
    import msgpack
    import zmq

    from fusion_shim.protocol import wire
    from fusion_shim.worker import serve_in_thread

    worker = _faultlab.numpy_worker()
    good = worker.kernels["matmul"]
    worker.kernels["matmul"] = lambda t, p: [good(t, p)[0] + 1e-9]  # SIMULATED silently broken device
    url = f"inproc://sick-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=worker)
    try:
        sock = transport.context().socket(zmq.DEALER)
        sock.connect(url)
        sock.send(msgpack.packb({"v": 1, "t": "hello", "id": 5}))
        assert sock.poll(10000)
        header, _ = wire.decode(sock.recv_multipart())
        assert header["t"] == "error" and header["kind"] == "unhealthy" and header["id"] == 5, header
        assert "health check" in header["msg"]

        a = rng_matrix(7)
        with bypassed():
            want = a @ a
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=5.0, ready_timeout=1.0)
        assert not rt.link.wait_ready(1.5)
        np.testing.assert_array_equal(np.matmul(a, a), want)  # computed here, right
        assert last(rt).kind == "fallback"
        assert "unhealthy" in events(rt), events(rt)

        worker.kernels["matmul"] = good  # repaired: the background probe finds a healthy worker
        assert rt.link.wait_ready(READY_S), events(rt)
        sock.send(msgpack.packb({"v": 1, "t": "hello", "id": 6}))
        assert sock.poll(10000)
        header, _ = wire.decode(sock.recv_multipart())
        assert header["t"] == "ready" and header["health_s"] > 0
        sock.close(0)
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(5)


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


def test_eight_threads_two_hundred_mixed_calls_each(inproc_worker):
    per_thread = [_mixed_cases(100 + t, 200) for t in range(8)]  # expected answers: NumPy's, before the shim
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, timeout=60.0)
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


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _faultlab._state(pid) in ("Z", "X"):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # do not leave it behind for the next test
    return False


def test_sigkill_of_the_client_leaves_no_worker(tmp_path):
    proc, worker_pid = _launch(tmp_path, "sleep")
    proc.kill()
    proc.wait(10)
    assert _gone_within(worker_pid, 5), "the embedded worker outlived its killed client"


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
    assert _gone_within(worker_pid, 5), "the embedded worker outlived its interrupted client"


def test_exit_with_a_stopped_worker_does_not_hang(tmp_path):
    proc, worker_pid = _launch(tmp_path, "stop_worker")
    t = time.monotonic()
    proc.wait(30)
    out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): readline buffered ahead
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert time.monotonic() - t < 6, time.monotonic() - t
    assert _gone_within(worker_pid, 5)

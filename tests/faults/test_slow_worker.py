"""A worker that is slow or stopped: the call waits no longer than its deadline, which follows the
prediction, or than the heartbeat takes to notice a stopped worker; then it runs here.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim import transport
from fusion_shim.client import call as client_call, link as client_link
from fusion_shim.intercept import bypassed

from tests.helpers import faultlab as _faultlab
from tests.helpers.faults import events, install, last, operands, records, rng_matrix
from tests.helpers.shims import READY_S


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


# -- a call that times out --------------------------------------------------------------------------

def test_timeout_with_a_slow_worker(workers):
    proc, url = workers.start(delay=3.0)
    rt = install(url, timeout=0.5, ready_timeout=20.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(8)
    t = time.monotonic()
    np.testing.assert_array_equal(np.matmul(a, b), want)
    assert time.monotonic() - t < 3.0  # the worker's delay: the call did not wait for its answer
    rec = records(rt)[-1]
    assert rec.kind == "fallback" and "Timeout" in rec.reason, rec
    assert "worker fault: Timeout" in events(rt)
    # the next call, same shapes, while the worker still owes the first reply: the right answer
    c, d, want2 = operands(9)
    np.testing.assert_array_equal(np.matmul(c, d), want2)
    assert records(rt)[-1].kind == "fallback"
    assert proc.poll() is None


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

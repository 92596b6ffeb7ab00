"""A worker killed (SIGKILL) and started again at the same address is used again (D182): while it
is away calls run here, NumPy's answers and no exception; once it is back the link's probe,
backing off up to REPROBE_MAX_S, finds it and calls go there again. In a forked child too."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from fusion_shim.intercept import bypassed

from tests.helpers.faults import PY, clean_env, events, install, records
from tests.helpers.shims import READY_S

pytestmark = pytest.mark.usefixtures("no_shim_after")


class Restartable:
    """One worker address, served by a `fusion-shim worker` subprocess that can be killed and restarted."""

    def __init__(self, url: str, log: str):
        self.url, self.log, self.proc = url, log, None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([PY, "-m", "fusion_shim", "worker", "--bind", self.url, "--device", "cpu"],
                                         env=clean_env(FUSION_SHIM="0"), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture(params=["ipc", "tcp"])
def worker(request, sock_dir, tmp_path):
    if request.param == "ipc":
        url = f"ipc://{sock_dir}/w.sock"
    else:  # loopback: the worker serves with this user's keys, which the client finds (D68)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    w = Restartable(url, str(tmp_path / "worker.log"))
    w.start()
    yield w
    w.close()


def _call(rt, seed: int) -> str:
    """One product through the shim, checked against NumPy's; returns where it ran."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((48, 40)), rng.standard_normal((40, 48))
    with bypassed():
        want = a @ b
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    return records(rt)[-1].kind


def _until_served(rt, first_seed: int, deadline_s: float = READY_S) -> int:
    """Calls, each checked, until one is served by the worker; returns how many ran here first."""
    here, seed, end = 0, first_seed, time.monotonic() + deadline_s
    while _call(rt, seed) != "worker":
        here += 1
        seed += 1
        assert time.monotonic() < end, "the restarted worker was never used again"
        time.sleep(0.05)
    return here


def _until_refused(rt, first_seed: int) -> int:
    """Calls, each checked, until the link has said its address refuses connections; returns how
    many ran here."""
    end, seed, here = time.monotonic() + READY_S, first_seed, 0
    while "connection refused" not in events(rt):
        here += _call(rt, seed) == "fallback"
        seed += 1
        assert time.monotonic() < end, events(rt)
        time.sleep(0.05)
    return here


def test_a_worker_killed_and_restarted_at_its_address_is_used_again(worker):
    rt = install(worker.url, timeout=10.0)
    assert _call(rt, 1) == "worker", events(rt)
    worker.kill()
    assert _until_refused(rt, 100) >= 1  # computed here while the probes back off
    worker.start()
    _until_served(rt, 200)
    assert records(rt)[-1].kind == "worker" and "worker back at" in events(rt)
    served = sum(r.kind == "worker" for r in records(rt))
    assert _call(rt, 300) == "worker" and sum(r.kind == "worker" for r in records(rt)) == served + 1


def test_a_forked_child_uses_its_restarted_worker_again(worker, tmp_path):
    """A child forked from a client probes the worker again itself: before, only the process that
    made the link did, so a child's first failed probe left it computing here for good."""
    rt = install(worker.url, timeout=10.0)
    assert _call(rt, 1) == "worker", events(rt)
    status = tmp_path / "child"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own channel to the same worker
        os.close(r)
        code = 1
        try:
            assert _call(rt, 2) == "worker"
            os.write(w, b"k")  # ready for the kill
            _until_refused(rt, 100)
            os.write(w, b"r")  # ready for the restart
            _until_served(rt, 200, 180.0)  # generous: a restart plus REPROBE_MAX_S
            status.write_text("served again")
            code = 0
        except BaseException as exc:  # reported to the parent, which asserts
            status.write_text(f"{type(exc).__name__}: {exc}\n{events(rt)}")
        finally:
            os._exit(code)
    os.close(w)
    try:
        assert os.read(r, 1) == b"k", status.read_text() if status.exists() else "child ended"
        worker.kill()
        assert os.read(r, 1) == b"r", status.read_text() if status.exists() else "child ended"
        worker.start()
    finally:
        os.close(r)
        _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0 and status.read_text() == "served again", status.read_text()

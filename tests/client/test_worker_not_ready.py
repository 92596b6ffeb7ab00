"""A worker that is not ready says where it is in its start (D286): the report's header names the
step, the CPU time it has had and its priority, or why it exited."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fusion_shim.client.embedded import boot_phase, lower_priority
from fusion_shim.reporting import _title


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_worker_not_listening_yet_is_importing_torch(sleeper, tmp_path):
    why = boot_phase(sleeper.pid, f"ipc://{tmp_path}/worker-0.sock", None, None)
    assert why.startswith("importing torch (not listening yet)") and "s of CPU so far" in why, why


def test_a_listening_worker_not_ready_is_taking_its_self_benchmark(sleeper, tmp_path):
    (tmp_path / "worker-0.sock").touch()
    why = boot_phase(sleeper.pid, f"ipc://{tmp_path}/worker-0.sock", None, None)
    assert why.startswith("self-benchmark running"), why


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here")
def test_a_worker_at_idle_priority_says_so(sleeper, tmp_path):
    lower_priority(sleeper.pid)
    assert "at idle priority" in boot_phase(sleeper.pid, f"ipc://{tmp_path}/w.sock", None, None)


def test_an_exited_worker_says_its_status_and_last_line(tmp_path):
    why = boot_phase(1, f"ipc://{tmp_path}/w.sock", 1, "ImportError: no torch")
    assert why == "exited with status 1: ImportError: no torch"


def test_the_report_header_shows_why_the_worker_is_not_ready():
    report = {"pid": 1, "policy": "auto", "wall_s": 20.0,
              "worker": {"url": "ipc:///x/w.sock", "state": "starting", "ready_after_s": None, "info": {},
                         "not_ready": "importing torch (not listening yet), 0.2s of CPU so far"}}
    assert "never ready (starting: importing torch (not listening yet), 0.2s of CPU so far)" in _title(report)


@pytest.mark.usefixtures("no_shim_after")
def test_an_embedded_cpu_worker_started_at_install_is_reported_with_its_step():
    import numpy as np

    import fusion_shim

    fusion_shim.install(policy="auto", device="cpu", quiet=True)
    np.dot(np.ones((8, 8)), np.ones((8, 8)))  # the first call makes the link: the worker starts
    w = fusion_shim.report(format="json")["worker"]
    assert w["embedded"] and w["url"].startswith("ipc://"), w
    assert w["ready_after_s"] is not None or w["not_ready"].startswith(("importing torch", "self-benchmark")), w

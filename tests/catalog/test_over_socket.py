"""The property-based differential suite against a worker over a real socket (issue 4): the worker
is ``python -m fusion_shim worker --bind ipc://...``, a separate process, and every call crosses
ZeroMQ's ipc transport and the wire format both ways, where tests/catalog/test_hypothesis.py uses
the in-process worker thread. Every catalog row runs ``EXAMPLES`` generated calls of the same
(derandomized) strategies, checked exactly as there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import fusion_shim
from tests.helpers.shims import CALL_TIMEOUT_S, READY_S, install
from tests.catalog.test_hypothesis import RECORDS, STRATEGIES, run_row

EXAMPLES = 6  # per row: 73 rows -> 438 calls over the socket


@pytest.fixture(scope="module")
def socket_worker():
    directory = tempfile.mkdtemp(prefix="fs-", dir="/tmp")  # a short path: unix sockets cap it at ~100 bytes
    url = f"ipc://{directory}/catalog.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["FUSION_SHIM"] = "0"
    log = open(os.path.join(directory, "worker.log"), "ab")
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"],
                            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    yield proc, url
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def shim(socket_worker):
    proc, url = socket_worker
    # the socket lane: every buffer crosses ZeroMQ (shared memory, issue 9, is tests/catalog/test_shm_differential.py)
    rt = install(url, timeout=CALL_TIMEOUT_S, ready_timeout=READY_S, shm="0")
    assert rt.link.info.get("pid") == proc.pid, "answered by some other worker"
    yield rt
    fusion_shim.uninstall()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_row_over_ipc(shim, socket_worker, name):
    RECORDS.clear()
    counts = run_row(shim, name, EXAMPLES)
    assert sum(counts.values()) >= EXAMPLES - 1, counts
    remote = [r for r in RECORDS if r.kind == "worker"]
    assert remote or counts["raised"] + counts["local"] + counts["fallback"] == sum(counts.values()), counts
    assert all(r.bytes_sent > 0 and r.bytes_received > 0 for r in remote), "a remote call moved no bytes"
    assert socket_worker[0].poll() is None, "the worker process died"

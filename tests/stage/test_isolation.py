"""A stage process cannot reach the worker (docs/stages.md, D189): not its memory, its key files, its
signals, its environment, nor modules planted in its current directory; and the worker keeps serving."""
from __future__ import annotations

import ctypes
import os
import shutil
import tempfile

import pytest

from tests.helpers.shims import install
from tests.stage import isolationfns

M = "tests.stage.isolationfns"
from fusion_shim.worker.isolation import stage_ids, why_not_other_user

root_only = pytest.mark.skipif(stage_ids() is None, reason="a stage runs as another user only under a root worker "
                               f"whose Python others can read: {why_not_other_user()}")


@pytest.fixture
def open_dir():
    """A directory any user may read, as a worker's keys or modules might lie in."""
    path = tempfile.mkdtemp(prefix="fusion-shim-iso-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _on_worker(rt, name):
    rec = [r for r in rt.ledger.records if r.op == f"stage {M}:{name}"][-1]
    assert rec.kind == "worker", (rec, rt.ledger.events)


def test_the_worker_that_runs_code_is_not_dumpable(code_worker):
    install(code_worker[0], stages=(f"{M}:surroundings",))
    isolationfns.surroundings()
    assert code_worker[1].stages is not None
    assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE of this process, the worker's


@root_only
def test_a_stage_cannot_read_the_workers_memory_nor_signal_it_and_the_worker_keeps_serving(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:read_memory", f"{M}:signal", f"{M}:surroundings"))
    memory = isolationfns.read_memory(os.getpid())
    _on_worker(rt, "read_memory")
    assert memory == "PermissionError"
    signalled = isolationfns.signal(os.getpid())
    _on_worker(rt, "signal")
    assert signalled == "PermissionError"
    assert isolationfns.surroundings()["uid"] != 0
    _on_worker(rt, "surroundings")


@root_only
def test_a_stage_cannot_read_the_workers_key_file(code_worker, open_dir):
    key = os.path.join(open_dir, "server.key_secret")
    with open(key, "w") as f:
        f.write("secret-key = \"not for stages\"\n")
    os.chmod(key, 0o600)
    rt = install(code_worker[0], stages=(f"{M}:read_file",))
    got = isolationfns.read_file(key)
    _on_worker(rt, "read_file")
    assert got == "PermissionError"


def test_a_stage_starts_isolated_without_the_workers_directory_environment_or_fds(code_worker, open_dir,
                                                                                 monkeypatch):
    with open(os.path.join(open_dir, "msgpack.py"), "w") as f:
        f.write("raise SystemExit('planted module imported')\n")
    monkeypatch.chdir(open_dir)
    monkeypatch.setenv("PLANTED_TOKEN", "worker's secret")
    rt = install(code_worker[0], stages=(f"{M}:surroundings",))
    seen = isolationfns.surroundings()
    _on_worker(rt, "surroundings")
    assert seen["isolated"] == 1 and "" not in seen["path"] and open_dir not in seen["path"]
    assert not seen["msgpack"].startswith(open_dir)
    assert "PLANTED_TOKEN" not in seen["env"]
    assert len(seen["fds"]) <= 5, seen["fds"]  # stdin, stdout, stderr, the socket, the listing itself


@pytest.mark.skipif(os.geteuid() != 0 or stage_ids() is not None, reason="a root worker whose Python others cannot read")
def test_a_root_worker_whose_stage_user_cannot_run_python_says_its_stages_ran_as_root(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:surroundings",))
    assert isolationfns.surroundings()["uid"] == 0
    _on_worker(rt, "surroundings")
    assert any("stage code ran as root" in str(e) for e in rt.ledger.events), rt.ledger.events

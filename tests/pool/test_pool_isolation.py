"""A stage run through the pool is as confined as on a plain worker (docs/stages.md, D189, D214, D215,
D344): on a pool worker started with ``--allow-code``, stage code cannot read the pool's Ray token nor
this user's fusion_shim keys (both placed beneath a directory it may read), cannot read the worker's
memory nor signal it (the worker keeps serving, the same process), starts without the worker's
environment, fds and current directory, and writes only to its own temporary directory. One head on
loopback; the stages are those of ``tests/stage/isolationfns.py``, sent by a client of the pool."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fusion_shim.worker import isolation
from fusion_shim.worker.isolation import landlock_abi
from tests.helpers.environment import ROOT
from tests.pool.clusters import records, start_head, stop_head, token_env

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(landlock_abi() < 6, reason=f"no Landlock ABI >= 6 (this kernel: {landlock_abi()})")

DEADLINE_S = 300.0  # generous: the machine is shared; a worker imports torch as it starts
STAGE_PROBE = str(ROOT / "tests" / "pool" / "stage_probe.py")
POOL = "iso"
PLANTED = "FUSION_TEST_PLANTED_SECRET"  # in the cluster's environment: the worker's, never a stage's


@pytest.fixture(scope="module")
def pool():
    """A pool of one worker (``--allow-code``) on a head whose Ray token and this user's keys lie beneath
    this package's parent, a directory every stage may read (D215)."""
    secrets_dir = Path(tempfile.mkdtemp(prefix=".fusion-shim-iso-", dir=isolation.child_path()[0]))
    os.chmod(secrets_dir, 0o755)
    directory = Path(tempfile.mkdtemp(prefix="rpi", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    here = directory / "cwd"  # the cluster's current directory, and so its workers'
    here.mkdir()
    (here / "msgpack.py").write_text("raise SystemExit('planted module imported')\n")
    keys = secrets_dir / "fusion_shim" / "keys"
    keys.mkdir(parents=True)
    (keys / "local.key_secret").write_text('secret-key = "not for stages"\n')
    os.chmod(keys / "local.key_secret", 0o600)
    (secrets_dir / "open.txt").write_text("anyone's\n")
    env = {**token_env(secrets_dir), "XDG_STATE_HOME": str(directory / "state"),
           "XDG_CONFIG_HOME": str(secrets_dir), PLANTED: "the worker's secret"}
    head, address = start_head(directory, env, cwd=here)
    try:
        up = _pool(address, env, "up", "--workers", "1", "--device", "cpu", "--allow-code")
        assert up.returncode == 0, up.stderr[-2000:]
        yield address, env, secrets_dir, here
        down = _pool(address, env, "down")
        assert down.returncode == 0, down.stderr[-2000:]
    finally:
        stop_head(head)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(secrets_dir, ignore_errors=True)


def _pool(address: str, env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusion_shim", "pool", argv[0], "--ray", address, "--name", POOL,
                           *argv[1:]], capture_output=True, text=True, timeout=DEADLINE_S, cwd=ROOT,
                          env={**os.environ, **env})


def _stages(pool, *calls) -> dict:
    """Each ``(function of isolationfns, args)`` run on the pool's worker by a client of its own; the
    worker as it described itself and the answers."""
    address, env = pool[:2]
    out = subprocess.run([sys.executable, STAGE_PROBE, address, f"{POOL}.0", json.dumps(calls)], capture_output=True,
                         text=True, timeout=DEADLINE_S, cwd=ROOT,
                         env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _worker_pid(pool) -> int:
    """The pool worker's pid as it recorded itself on this host (one worker, one record)."""
    (entry,) = records(pool[1], POOL)
    return entry["pid"]


def test_a_pool_workers_stage_cannot_read_the_pools_ray_token_nor_this_users_keys(pool):
    secrets_dir = pool[2]
    token = pool[1]["RAY_AUTH_TOKEN_PATH"]
    got = _stages(pool, ("read_file", [token]), ("read_file", [str(secrets_dir / "fusion_shim" / "keys" /
                                                                    "local.key_secret")]),
                  ("read_file", [str(secrets_dir / "open.txt")]))
    # the file beside them is read: the directory lies within the sandbox, and only the secrets are kept out
    assert got["answers"] == ["PermissionError", "PermissionError", "done"], got


def test_a_pool_workers_stage_cannot_read_its_memory_nor_signal_it_and_it_keeps_serving(pool):
    pid = _worker_pid(pool)
    got = _stages(pool, ("read_memory", [pid]), ("stop_or_terminate", [pid]))
    assert got["worker"]["pid"] == pid, got
    assert got["answers"] == ["PermissionError", {"probe": "PermissionError", "SIGSTOP": "PermissionError",
                                                  "SIGTERM": "PermissionError"}], got
    again = subprocess.run([sys.executable, STAGE_PROBE, pool[0], f"{POOL}.0"], capture_output=True, text=True,
                           timeout=DEADLINE_S, cwd=ROOT, env={**os.environ, **pool[1]})
    assert again.stdout.strip().splitlines()[-1:] == ["ran 12.0"], again.stderr[-3000:]
    assert _worker_pid(pool) == pid  # the same process: not stopped, not restarted by Ray
    status = _pool(pool[0], pool[1], "status")
    assert status.returncode == 0, status.stderr[-2000:]
    row = status.stdout.splitlines()[1].split()
    assert row[0] == f"{POOL}.0" and row[2] == str(pid) and "ready" in row, status.stdout


def test_a_pool_workers_stage_starts_without_its_environment_fds_or_current_directory(pool):
    here = str(pool[3])
    assert os.readlink(f"/proc/{_worker_pid(pool)}/cwd") == here
    (seen,) = _stages(pool, ("surroundings", []))["answers"]
    assert seen["isolated"] == 1 and "" not in seen["path"] and here not in seen["path"], seen
    assert not seen["msgpack"].startswith(here), seen  # the module planted there is not what it imported
    assert PLANTED not in seen["env"] and not [v for v in seen["env"] if v.startswith("RAY_")], seen["env"]
    assert len(seen["fds"]) <= 5, seen["fds"]  # stdin, stdout, stderr, the socket, the listing itself


def test_a_pool_workers_stage_writes_only_to_its_own_temporary_directory(pool, tmp_path):
    os.chmod(tmp_path, 0o755)
    pid = _worker_pid(pool)
    outside, scratch = _stages(pool, ("write_file", [str(tmp_path / "planted.py")]), ("write_temp", []))["answers"]
    assert outside == "PermissionError" and not (tmp_path / "planted.py").exists()
    assert os.path.basename(os.path.dirname(scratch)).startswith(f"fusion-shim-stage-{pid}-"), scratch
    assert Path(scratch).read_bytes() == b"scratch"

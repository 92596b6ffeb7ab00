"""A run's worker socket and log live in a directory of its own inside a per-user 0700 directory
(D63): removed at exit, by the embedded worker when its client dies of a signal, else swept by the
next run; a per-user directory that is not private to the user is refused."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fusion_shim.client import rundir
from tests.helpers.faults import gone_within
from tests.helpers.shims import READY_S

PROGRAM = textwrap.dedent("""
    import sys, time, numpy as np, fusion_shim
    rt = fusion_shim.install(policy="remote", device="cpu", quiet=True)
    print(rt.link.tmpdir, rt.link.proc.pid, flush=True)
    time.sleep(600)
""")


def _start(base: str) -> tuple[subprocess.Popen, str, int]:
    """The program, with its runtime directory in ``base`` (short: a socket path has at most 107 bytes)."""
    xdg = Path(base) / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["XDG_RUNTIME_DIR"] = str(xdg)
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().split()
    assert len(line) == 2, "the program did not start"
    return proc, line[0], int(line[1])


def test_sigterm_kills_the_program_at_once_and_its_worker_removes_the_directory(sock_dir):
    """No handler of the shim's stands between SIGTERM and the program (D63): it dies of it in its
    sleep, and its embedded worker, its client gone, removes the run's directory and exits."""
    proc, run, worker = _start(sock_dir)
    try:
        assert os.path.isdir(run) and run.startswith(os.path.join(sock_dir, "xdg", "fusion_shim", "run-"))
        assert stat.S_IMODE(os.stat(os.path.dirname(run)).st_mode) == 0o700
        assert os.path.exists(os.path.join(run, "worker.log"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(READY_S) == -signal.SIGTERM
        assert gone_within(worker, READY_S)
        assert not os.path.exists(run)
        assert os.path.isdir(os.path.dirname(run))  # the per-user directory stays
    finally:
        proc.kill()
        proc.wait()


def test_after_a_sigkill_the_worker_removes_the_directory(sock_dir):
    proc, run, worker = _start(sock_dir)
    proc.kill()
    proc.wait()
    assert gone_within(worker, READY_S)  # the embedded worker notices its client is gone
    assert not os.path.exists(run)


def test_when_both_are_killed_the_next_run_sweeps_the_leftover(sock_dir):
    proc, run, worker = _start(sock_dir)
    os.kill(worker, signal.SIGKILL)
    proc.kill()
    proc.wait()
    assert gone_within(worker, READY_S)
    assert os.path.isdir(run)  # nothing could clean up
    fresh, why = rundir.new_run_dir({"XDG_RUNTIME_DIR": os.path.join(sock_dir, "xdg")})
    try:
        assert why is None and not os.path.exists(run) and os.path.isdir(fresh)
    finally:
        os.rmdir(fresh)


def test_a_runtime_directory_too_long_for_a_socket_is_not_used(tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir(mode=0o700)
    path, why = rundir.new_run_dir({"XDG_RUNTIME_DIR": str(deep)})
    try:
        assert why is not None and "too long a path for a socket" in why, why
        assert os.path.dirname(path) == tempfile.gettempdir() and len(path) + rundir.SOCKET_ROOM <= rundir.IPC_PATH_MAX
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    finally:
        os.rmdir(path)


def test_a_live_runs_directory_is_not_swept(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    mine, _ = rundir.new_run_dir(env)
    other, _ = rundir.new_run_dir(env)  # a second runtime of this (live) process
    assert mine != other and rundir.sweep(os.path.dirname(mine)) == []
    assert os.path.isdir(mine) and os.path.isdir(other)


@pytest.mark.parametrize("how", ["open to others", "a link", "another user's" if os.geteuid() == 0 else "skip"])
def test_a_per_user_directory_that_is_not_private_is_refused(tmp_path, how):
    if how == "skip":
        pytest.skip("only root can give a directory to another user")
    base = tmp_path / "fusion_shim"
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        base.symlink_to(tmp_path / "elsewhere")
    else:
        base.mkdir(mode=0o700)
        if how == "open to others":
            base.chmod(0o777)
        else:
            os.chown(base, 65534, -1)
    path, why = rundir.new_run_dir({"XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        assert why and str(base) in why and "not a private directory" in why
        assert not path.startswith(str(base)) and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    finally:
        os.rmdir(path)


def test_a_named_run_directory_is_the_one_new_run_dir_would_make_and_is_made_only_when_asked(sock_dir):
    """D122: a deferred worker's directory is named at NumPy's import (for the children) and made when
    its link is; a name taken meanwhile is not handed out again."""
    env = {"XDG_RUNTIME_DIR": sock_dir}
    name = rundir.run_dir_name(env)
    assert name is not None and not os.path.exists(name)
    made, why = rundir.new_run_dir(env)
    try:
        assert made == name and why is None
        assert rundir.run_dir_name(env) is None  # taken: the caller falls back to new_run_dir
    finally:
        os.rmdir(made)
    assert rundir.make_named(name) == name and stat.S_IMODE(os.stat(name).st_mode) == 0o700
    os.rmdir(name)

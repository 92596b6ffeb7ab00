"""A stage process cannot reach the worker (docs/stages.md, D189, D214, D215): not its memory, its key
files, its signals, its environment, nor modules planted in its current directory, nor write outside its
own temporary directory; and the worker keeps serving."""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.shims import install
from tests.stage import isolationfns

from fusion_shim.worker import isolation
from fusion_shim.worker.isolation import landlock_abi, stage_ids, why_not_other_user

M = "tests.stage.isolationfns"
PKG_PARENT = isolation.child_path()[0]

sandboxed = pytest.mark.skipif(stage_ids() is None and landlock_abi() < 6, reason=(
    f"no Landlock ABI >= 6 (this kernel: {landlock_abi()}) and no other user for stages: {why_not_other_user()}"))
landlocked = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")


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


@pytest.fixture
def under_package_parent():
    """A directory beneath one a stage may read (this package's parent), as keys in a home might lie."""
    path = tempfile.mkdtemp(prefix=".fusion-shim-iso-", dir=PKG_PARENT)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _secret(directory, name="server.key_secret"):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("secret-key = \"not for stages\"\n")
    os.chmod(path, 0o600)
    return path


@sandboxed
def test_a_stage_cannot_read_the_workers_memory_nor_signal_it_and_the_worker_keeps_serving(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:read_memory", f"{M}:stop_or_terminate", f"{M}:surroundings"))
    memory = isolationfns.read_memory(os.getpid())
    _on_worker(rt, "read_memory")
    assert memory == "PermissionError"
    signalled = isolationfns.stop_or_terminate(os.getpid())
    _on_worker(rt, "stop_or_terminate")
    assert signalled == {"probe": "PermissionError", "SIGSTOP": "PermissionError", "SIGTERM": "PermissionError"}
    seen = isolationfns.surroundings()
    _on_worker(rt, "surroundings")
    assert stage_ids() is None or seen["uid"] != 0


@sandboxed
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


@landlocked
def test_a_stage_cannot_read_the_workers_keys_directory_where_it_lies_beneath_one_it_may_read(
        code_worker, under_package_parent):
    key = _secret(os.path.join(under_package_parent, "keys"))
    beside = os.path.join(under_package_parent, "open.txt")
    with open(beside, "w") as f:
        f.write("anyone's\n")
    isolation.protect(os.path.dirname(key))  # as serve(keys=DIR) does
    try:
        rt = install(code_worker[0], stages=(f"{M}:read_file",))
        got, other = isolationfns.read_file(key), isolationfns.read_file(beside)
    finally:
        isolation.KEY_DIRS.discard(os.path.realpath(os.path.dirname(key)))
    _on_worker(rt, "read_file")
    assert (got, other) == ("PermissionError", "done")


def test_a_worker_served_with_keys_keeps_them_out_of_every_stage_sandbox(tmp_path):
    from fusion_shim.auth import make_keys
    from tests.stage.conftest import stage_worker

    keys = str(tmp_path / "keys")
    make_keys(keys, ["alice"])
    assert os.path.realpath(keys) not in isolation.protected_dirs()
    worker, thread, stop = stage_worker("tcp://127.0.0.1:*", keys=keys)
    try:
        assert os.path.realpath(keys) in isolation.protected_dirs()
        assert isolation.reaches(isolation.sandbox_spec(str(tmp_path / "tmp"), [keys]), [keys]) == []
    finally:
        stop.set()
        thread.join(10)
        isolation.KEY_DIRS.discard(os.path.realpath(keys))


def test_where_landlock_is_missing_the_stage_says_what_does_not_hold(monkeypatch):
    monkeypatch.setattr(isolation, "landlock_abi", lambda: 0)
    assert "no Landlock" in isolation.sandbox({"read": [], "devices": [], "write": []})


@landlocked
def test_a_stage_cannot_read_this_users_fusion_shim_configuration(code_worker, under_package_parent, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", under_package_parent)
    key = _secret(os.path.join(under_package_parent, "fusion_shim", "keys"), "local.key_secret")
    rt = install(code_worker[0], stages=(f"{M}:read_file",))
    got = isolationfns.read_file(key)
    _on_worker(rt, "read_file")
    assert got == "PermissionError"


@landlocked
def test_a_stage_writes_only_to_its_own_temporary_directory(code_worker, open_dir):
    rt = install(code_worker[0], stages=(f"{M}:write_file", f"{M}:write_temp"))
    outside = isolationfns.write_file(os.path.join(open_dir, "planted.py"))
    scratch = isolationfns.write_temp()
    _on_worker(rt, "write_temp")
    assert outside == "PermissionError" and not os.path.exists(os.path.join(open_dir, "planted.py"))
    assert os.path.basename(os.path.dirname(scratch)).startswith("fusion-shim-stage-")
    code_worker[1].stages.close()
    assert not os.path.exists(os.path.dirname(scratch))  # gone with its process


def test_no_root_of_a_sandbox_holds_a_key_directory_even_where_python_lies_beside_the_keys(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "fusion_shim" / "keys").mkdir(parents=True)
    (home / ".config" / "other").mkdir()
    (home / "python" / "lib").mkdir(parents=True)
    keys = [str(home / ".config" / "fusion_shim")]
    roots = isolation.narrowed(str(home), keys)
    assert sorted(roots) == sorted([str(home / ".config" / "other"), str(home / "python")])
    assert isolation.reaches({"read": roots, "devices": [], "write": []}, keys) == []
    spec = isolation.sandbox_spec(str(tmp_path), [os.path.join(PKG_PARENT, "tests")])
    assert PKG_PARENT not in spec["read"] and os.path.join(PKG_PARENT, "fusion_shim") in spec["read"]
    assert isolation.reaches(spec, isolation.protected_dirs([os.path.join(PKG_PARENT, "tests")])) == []


NON_ROOT_WORKER = """
import json, os, sys
from tests.helpers.shims import install
from tests.stage import isolationfns
from tests.stage.conftest import stage_worker
url = "ipc://" + sys.argv[1] + "/stage.sock"
worker, thread, stop = stage_worker(url)
M = "tests.stage.isolationfns"
install(url, stages=(M + ":read_file", M + ":stop_or_terminate", M + ":read_memory"))
print(json.dumps({"uid": os.getuid(), "key": isolationfns.read_file(sys.argv[2]),
                  "memory": isolationfns.read_memory(os.getpid()),
                  "signal": isolationfns.stop_or_terminate(os.getpid())}))
stop.set()
"""


@landlocked
def test_a_non_root_workers_stage_cannot_read_its_keys_nor_signal_it(open_dir):
    user = "fusion-shim-stage-test"
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("making a user needs root and useradd")
    if why_not_other_user() is not None and not _can_expose_python():
        pytest.skip(f"another user cannot run this Python: {why_not_other_user()}")
    import site

    closed = [p for p in (*site.getsitepackages(), os.path.join(PKG_PARENT, "tests")) if not isolation._open_to_all(p)]
    if closed:
        pytest.skip(f"another user cannot read {closed}")
    if subprocess.run(["useradd", "--system", "--no-create-home", user], capture_output=True).returncode != 0:
        pytest.skip("useradd failed")
    try:
        _run_as_non_root_worker(pwd.getpwnam(user), Path(open_dir))
    finally:
        subprocess.run(["userdel", user], capture_output=True)


# The directory above this Python (``/root`` here) replaced, in a private mount namespace, by an empty
# one that others may enter, holding only the Python's own tree: the user runs it, and sees nothing
# else of root's home.
_EXPOSE = """set -e
keep=$(mktemp -d)
mount --bind "$TOP/$SUB" "$keep"
mount -t tmpfs -o mode=0755 tmpfs "$TOP"
mkdir -p "$TOP/$SUB"
mount --bind "$keep" "$TOP/$SUB"
exec setpriv --reuid="$RUID" --regid="$RGID" --clear-groups "$@"
"""


def _python_tree() -> tuple[str, str]:
    """(the closed directory, the Python's tree below it): ``/root`` and ``.pyenv``."""
    real = os.path.realpath(sys.executable)
    parts = Path(real).parts
    for i in range(2, len(parts)):
        top = os.path.join(*parts[:i])
        if not os.stat(top).st_mode & 0o001:
            return top, parts[i]
    return "", ""


def _can_expose_python() -> bool:
    top, sub = _python_tree()
    if not top or not all(shutil.which(c) for c in ("unshare", "setpriv", "mount")):
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


def _exposing_python(entry, cmd: list) -> list:
    top, sub = _python_tree()
    script = f"TOP={top}; SUB={sub}; RUID={entry.pw_uid}; RGID={entry.pw_gid}\n" + _EXPOSE
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]


def _run_as_non_root_worker(entry, tmp_path):
    os.chown(tmp_path, entry.pw_uid, entry.pw_gid)
    key = _secret(str(tmp_path / "keys"))
    os.chown(os.path.dirname(key), entry.pw_uid, entry.pw_gid)
    os.chown(key, entry.pw_uid, entry.pw_gid)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONPATH": PKG_PARENT}
    cmd = [sys.executable, "-c", NON_ROOT_WORKER, str(tmp_path), key]
    if why_not_other_user() is None:
        done = subprocess.run(cmd, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd=PKG_PARENT, env=env,
                              capture_output=True, text=True, timeout=600)
    else:  # this Python lies in a directory only root may enter: shown to the user in a namespace of its own
        done = subprocess.run(_exposing_python(entry, cmd), cwd=PKG_PARENT, env=env, capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["uid"] == entry.pw_uid and got["key"] == "PermissionError" and got["memory"] == "PermissionError"
    if landlock_abi() >= 6:
        assert got["signal"] == {"probe": "PermissionError", "SIGSTOP": "PermissionError", "SIGTERM": "PermissionError"}


@pytest.mark.skipif(os.geteuid() != 0 or stage_ids() is not None, reason="a root worker whose Python others cannot read")
def test_a_root_worker_whose_stage_user_cannot_run_python_says_its_stages_ran_as_root(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:surroundings",))
    assert isolationfns.surroundings()["uid"] == 0
    _on_worker(rt, "surroundings")
    assert any("stage code ran as root" in str(e) for e in rt.ledger.events), rt.ledger.events

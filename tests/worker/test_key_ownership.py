"""Keys directories and key files follow OpenSSH's rule (D62): the user's own (or root's), writable
by no one else; anything else is refused with a message naming it. Where this suite runs as root a
directory really is given to another uid (chown); otherwise the other owner is simulated by
pretending this process runs as another uid (os.geteuid), and the test says so in its id."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fusion_shim import auth

OTHER_UID = 65534  # nobody
ROOT = os.geteuid() == 0
HOW = "chown" if ROOT else "simulated-euid"


def _give_away(path, monkeypatch) -> None:
    """Make ``path`` another user's: really (root), or as this process sees it (simulated)."""
    if ROOT:
        os.chown(path, OTHER_UID, -1)
    else:
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)


@pytest.mark.parametrize("how", [HOW])
def test_keys_refuses_a_directory_another_user_made(tmp_path, monkeypatch, how):
    """The attack: another user pre-creates the directory with their key in authorized/."""
    d = tmp_path / "keys"
    (d / "authorized").mkdir(parents=True)
    (d / "authorized" / "intruder.key").write_text("planted\n")
    _give_away(d, monkeypatch)
    with pytest.raises(auth.KeyFileError, match=f"{d}.*belongs to uid"):
        auth.make_keys(str(d), ["alice"])
    assert not (d / "server.key_secret").exists()  # nothing written into it


@pytest.mark.skipif(not ROOT, reason="a worker process sees its real uid: needs root to chown")
def test_a_worker_refuses_a_keys_directory_another_user_owns(tmp_path):
    d = tmp_path / "keys"
    auth.make_keys(str(d), ["alice"])
    os.chown(d / "authorized", OTHER_UID, -1)
    r = subprocess.run([sys.executable, "-m", "fusion_shim", "worker", "--bind", "tcp://127.0.0.1:1", "--device", "cpu",
                        "--keys", str(d)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "FUSION_SHIM": "0"})
    assert r.returncode == 2 and f"{d / 'authorized'} belongs to uid {OTHER_UID}" in r.stderr, r.stderr


def test_group_or_world_writable_keys_are_refused(tmp_path):
    d = tmp_path / "keys"
    auth.make_keys(str(d), ["alice"])
    (d / "authorized").chmod(0o770)
    with pytest.raises(auth.KeyFileError, match=f"{d / 'authorized'} is writable by group or others.*chmod go-w"):
        auth.secure_server(None, None, str(d))
    (d / "authorized").chmod(0o700)
    (d / "authorized" / "alice.key").chmod(0o646)
    with pytest.raises(auth.KeyFileError, match="alice.key is writable by group or others"):
        auth.secure_server(None, None, str(d))


@pytest.mark.parametrize("how", [HOW])
def test_a_key_file_another_user_owns_is_refused_on_either_side(tmp_path, monkeypatch, how):
    d = tmp_path / "keys"
    auth.make_keys(str(d), ["alice"])
    _give_away(d / "alice.key_secret", monkeypatch)
    with pytest.raises(auth.KeyFileError, match="alice.key_secret belongs to uid"):
        auth.load_pair(str(d / "alice.key_secret"))
    if ROOT:
        os.chown(d / "server.key", OTHER_UID, -1)
    with pytest.raises(auth.KeyFileError, match="server.key belongs to uid"):
        auth.load_public(str(d / "server.key"))


def test_the_users_own_keys_still_load(tmp_path):
    d = tmp_path / "keys"
    auth.make_keys(str(d), ["alice"])
    assert len(auth.load_pair(str(d / "alice.key_secret"))[1]) == 40
    assert len(auth.load_public(str(d / "server.key"))) == 40
    auth.make_keys(str(d), ["bob"])  # a second run in one's own directory is fine

"""The pool costs nothing to a run without one, and an address without a cluster leaves the run local.
No Ray cluster is started here."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from fusion_shim.config import Config, ConfigError
from tests.helpers.environment import ROOT

PROGRAM = str(ROOT / "tests" / "pool" / "programs.py")
PROBE = "import sys, numpy as np; a = np.ones((300, 300)); print((a @ a).sum(), 'ray' in sys.modules)"


def test_a_run_without_a_pool_never_imports_ray(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--quiet", "-c", PROBE],
                         capture_output=True, text=True, timeout=300)
    if "-c" in out.stderr and out.returncode:  # the launcher takes scripts and modules: write one
        script = tmp_path / "probe.py"
        script.write_text(PROBE)
        out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--quiet", str(script)],
                             capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["27000000.0", "False"]


def test_an_unreachable_cluster_leaves_the_run_local_and_the_report_says_why_in_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    report = tmp_path / "r.json"
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--pool",
                          f"ray://127.0.0.1:{port}/t", "--report", str(report), "--quiet", PROGRAM, "spread"],
                         capture_output=True, text=True, timeout=300)
    plain = subprocess.run([sys.executable, PROGRAM, "spread"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == plain.stdout
    rep = json.loads(report.read_text())
    why = [e["what"] for e in rep["events"] if e["what"].startswith("pool ray://")]
    assert len(why) == 1 and "cannot be reached" in why[0], rep["events"]
    assert rep["summary"]["calls"]["worker"] == 0 and rep["pool"]["workers"] == []
    assert "ray" not in out.stderr.lower().replace("ray://", "")  # Ray was never joined, nor imported


@pytest.mark.parametrize("raw", ["tcp://host:1", "ray://", "ray://h:1/bad name"])
def test_an_invalid_pool_address_fails_and_says_what_is_valid(raw):
    with pytest.raises(ConfigError, match="valid: "):
        Config.load(env={"FUSION_SHIM_POOL": raw})


def test_a_pool_and_a_worker_list_exclude_each_other():
    with pytest.raises(ConfigError, match=r"pool \(.*\) and worker"):
        Config.load(env={"FUSION_SHIM_POOL": "ray://h:1", "FUSION_SHIM_WORKERS": "tcp://127.0.0.1:5555"})


def test_a_pool_address_names_its_cluster_and_its_pool():
    from fusion_shim.pool import parse

    assert parse("ray://10.0.0.1:6379") == ("10.0.0.1:6379", "default")
    assert parse("ray://auto/gpus") == ("auto", "gpus")


def test_ray_auto_without_a_cluster_on_this_host_says_so(tmp_path, monkeypatch):
    from fusion_shim.pool import cluster

    monkeypatch.setattr(cluster, "CURRENT_CLUSTER", str(tmp_path / "missing"))
    assert "belongs to no Ray cluster" in cluster.unreachable("auto")
    (tmp_path / "missing").write_text("127.0.0.1:1\n")
    assert "cannot be reached" in cluster.unreachable("auto")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pool_command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusion_shim", "pool", *argv], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("action", [["status"], ["up", "--workers", "1"], ["down"]])
def test_a_pool_command_without_a_cluster_fails_in_one_line(action):
    out = _pool_command(*action, "--ray", f"127.0.0.1:{_free_port()}")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be reached" in lines[0] and "ray start --head" in lines[0], out.stderr


def test_a_pool_command_checks_the_address_ray_dials_not_the_one_typed():
    """Something answers on 127.0.0.1 only: Ray would dial this host's own address (or wait on what
    answers there) and retry for a minute; the command says so in one line instead."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        out = _pool_command("up", "--workers", "1", "--ray", f"127.0.0.1:{listener.getsockname()[1]}")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be reached" in lines[0], out.stderr


def test_a_run_whose_pool_address_ray_cannot_dial_stays_local_with_one_reason(tmp_path):
    report = tmp_path / "r.json"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--pool",
                              f"ray://127.0.0.1:{listener.getsockname()[1]}/t", "--report", str(report), "--quiet",
                              PROGRAM, "spread"], capture_output=True, text=True, timeout=300)
    plain = subprocess.run([sys.executable, PROGRAM, "spread"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == plain.stdout and out.stderr == ""
    rep = json.loads(report.read_text())
    why = [e["what"] for e in rep["events"] if e["what"].startswith("pool ray://")]
    assert len(why) == 1 and "cannot be reached" in why[0], rep["events"]


def test_pool_up_without_an_address_on_a_host_without_ray_names_the_command_to_start_it(tmp_path, monkeypatch,
                                                                                        capsys):
    pytest.importorskip("ray")
    from fusion_shim.pool import cluster, command

    monkeypatch.setattr(cluster, "CURRENT_CLUSTER", str(tmp_path / "missing"))
    assert command.main(["up", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "belongs to no Ray cluster" in err[0]
    assert "RAY_AUTH_MODE=token ray start --head" in err[0]


@pytest.mark.parametrize("mode, refused", [(0o600, False), (0o640, True), (0o644, True)])
def test_a_ray_token_file_open_to_other_users_is_refused_with_the_chmod_that_fixes_it(tmp_path, mode, refused):
    from fusion_shim.pool.cluster import exposed_token

    path = tmp_path / "auth_token"
    path.write_text("x" * 64)
    path.chmod(mode)
    why = exposed_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert (why is not None) == refused
    if refused:
        assert f"chmod 600 {path}" in why
    assert exposed_token({"RAY_AUTH_TOKEN": "x" * 64, "RAY_AUTH_TOKEN_PATH": str(path)}) is None  # none on disk
    (tmp_path / ".ray").mkdir()
    path.rename(tmp_path / ".ray" / "auth_token")
    assert (exposed_token({"HOME": str(tmp_path)}) is not None) == refused  # Ray's default place


def test_pool_status_gives_resident_sizes_as_memory_budget_reads_them():
    from fusion_shim.pool import manage
    from fusion_shim.worker.command import size

    rows = [{"name": "p.0", "node": "n", "device": "cpu", "state": "ready", "calls": 3, "resident_bytes": 3 << 29},
            {"name": "p.1", "node": "n", "device": "cpu", "state": "ready", "calls": 0, "resident_bytes": 700},
            {"name": "p.2", "state": "unreachable (GetTimeoutError)"}]
    lines = manage.table(rows).splitlines()
    assert lines[0].split()[-2:] == ["resident", "budget"]
    assert [ln.split()[-2] for ln in lines[1:]] == ["1.5G", "700B", "-"]
    assert size("1.5G") == 3 << 29 and size("64M") == 64 << 20


def test_a_pool_command_without_ray_installed_names_the_extra_in_one_line(monkeypatch, capsys):
    from fusion_shim.pool import command

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert command.main(["status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'fusion-shim[ray]'" in err[0], err


@pytest.mark.parametrize("action", [["status"], ["up", "--workers", "1"]])
def test_a_pool_command_without_a_cluster_answers_within_10_s(action, capsys):
    """Nothing accepts a connection at the address: one refused TCP connect, no retry, Ray never joined."""
    pytest.importorskip("ray")
    from fusion_shim.pool import command

    t = time.monotonic()
    assert command.main([*action, "--ray", f"127.0.0.1:{_free_port()}"]) == 2
    elapsed = time.monotonic() - t
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot be reached" in lines[0], lines
    assert elapsed < 10.0, elapsed


@pytest.mark.parametrize("action", [["status"], ["up", "--workers", "1"]])
def test_a_pool_command_bounds_the_clusters_answer_as_ray_dials_it_within_10_s(action, monkeypatch, capsys):
    """Where something answers, Ray's own client may retry for a minute: the probe that asks it as Ray
    would is given the bound, and the whole check stays within 10 s."""
    pytest.importorskip("ray")
    from fusion_shim.pool import cluster, command

    given = []

    def probe(address, env, on_spawn=None, timeout=None):
        given.append(timeout)
        return {"address": address, "state": "unreachable", "why": "nothing accepts a connection there"}

    monkeypatch.setattr(cluster, "probe", probe)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert command.main([*action, "--ray", f"127.0.0.1:{listener.getsockname()[1]}"]) == 2
    assert given == [cluster.PROBE_TIMEOUT_S] and cluster.PROBE_TIMEOUT_S < 10.0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_probe_that_never_answers_is_ended_at_its_bound(tmp_path, monkeypatch):
    from fusion_shim.pool import cluster

    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(cluster, "PROBE", str(hang))
    spawned = []
    found = cluster.probe("127.0.0.1:1", {}, on_spawn=spawned.append, timeout=1.0)
    assert found["state"] == "unreachable" and "no answer as a Ray cluster within 1 s" in found["why"], found
    assert spawned[0].returncode is not None  # killed and reaped, not left running

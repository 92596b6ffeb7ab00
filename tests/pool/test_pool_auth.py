"""A pool refuses a Ray cluster that serves anyone: one head started without token authentication
(`ray start --head`, loopback, its own process group) for the module. The shim is given a token of its
own for it (0600), as a user of a cluster would have: the cluster asks for none."""
from __future__ import annotations

import pathlib
import tempfile

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.environment import ROOT
from tests.pool.clusters import start_head, stop_head, token_env

pytest.importorskip("ray")

PROGRAM = str(ROOT / "tests" / "pool" / "programs.py")
DEADLINE_S = 300.0


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory):
    directory = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    proc, address = start_head(directory, {"RAY_AUTH_MODE": "disabled"})
    try:
        yield address, token_env(directory)
    finally:
        stop_head(proc)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusion_shim", *argv], capture_output=True, text=True,
                          timeout=DEADLINE_S, env={**os.environ, **env})


def test_pool_up_refuses_a_cluster_without_token_authentication_in_one_line_naming_the_fix(open_cluster):
    address, env = open_cluster
    out = _run(["pool", "up", "--workers", "1", "--device", "cpu", "--ray", address, "--name", "open"], env)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "without token authentication" in lines[0], out.stderr
    assert "RAY_AUTH_MODE=token" in lines[0] and "--insecure" in lines[0]
    status = _run(["pool", "status", "--ray", address, "--name", "open"], env)  # reads, gives no keys: allowed
    assert status.returncode == 0, status.stderr[-2000:]
    assert status.stdout.strip().splitlines()[1:] == []  # nothing was made
    assert "warning: " in status.stderr and "without token authentication" in status.stderr


def test_a_run_with_a_pool_on_a_cluster_without_token_authentication_stays_local_and_says_why(open_cluster, tmp_path):
    address, env = open_cluster
    report = tmp_path / "r.json"
    out = _run(["--policy", "remote", "--pool", f"ray://{address}/open", "--report", str(report), "--quiet",
                PROGRAM, "spread"], env)
    plain = subprocess.run([sys.executable, PROGRAM, "spread"], capture_output=True, text=True, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == plain.stdout and out.stderr == ""
    rep = json.loads(report.read_text())
    why = [e["what"] for e in rep["events"] if e["what"].startswith("pool ray://")]
    assert len(why) == 1 and "without token authentication" in why[0] and "--insecure" in why[0], rep["events"]
    assert rep["summary"]["calls"]["worker"] == 0


def test_the_probe_tells_a_cluster_that_serves_anyone_from_one_that_asks_for_a_token(open_cluster):
    from fusion_shim.pool import cluster

    address, env = open_cluster
    found = cluster.probe(address, {**os.environ, **env})  # the shim's token is not shown to the cluster
    assert found["state"] == "open", found
    why, warning = cluster.check(address, insecure=True, env={**os.environ, **env})
    assert why is None and "without token authentication" in warning


def test_insecure_uses_a_cluster_without_token_authentication_and_says_so(open_cluster, tmp_path):
    address, env = open_cluster
    up = _run(["pool", "up", "--insecure", "--workers", "1", "--device", "cpu", "--ray", address, "--name", "ins"], env)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert "warning: " in up.stderr and "without token authentication" in up.stderr
        report = tmp_path / "r.json"
        out = _run(["--policy", "remote", "--insecure", "--pool", f"ray://{address}/ins", "--report", str(report),
                    "--quiet", PROGRAM, "spread"], env)
        plain = subprocess.run([sys.executable, PROGRAM, "spread"], capture_output=True, text=True,
                               timeout=DEADLINE_S)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout == plain.stdout
        rep = json.loads(report.read_text())
        assert any("used anyway (--insecure)" in e["what"] for e in rep["events"]), rep["events"]
        assert [w["name"] for w in rep["pool"]["workers"]] == ["ins.0"]
    finally:
        down = _run(["pool", "down", "--ray", address, "--name", "ins"], env)
    assert down.returncode == 0 and "1 workers stopped" in down.stdout, down.stderr[-2000:]

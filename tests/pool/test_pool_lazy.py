"""Ray only when it pays (D300, D302) and no call to a pool worker on this host's CPUs under ``auto``
(D301): one head on loopback with token authentication (a token of the module's own, 0600), in a
short temp dir under /tmp, its processes in one process group, and a pool of one CPU worker on this
host. Each run checks, in the program itself, whether Ray was loaded there (``sys.modules``)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers.environment import ROOT
from tests.pool.clusters import start_head, stop_head, token_env

pytest.importorskip("ray")

PROGRAM = str(ROOT / "tests" / "pool" / "programs.py")
POOL = "lz"
DEADLINE_S = 600.0  # generous: the machine is shared


def _env(auth: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("FUSION_SHIM", "RAY_"))}, **auth}


@pytest.fixture(scope="module")
def cpu_pool():
    directory = pathlib.Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    auth = token_env(directory)
    proc, address = start_head(directory, auth)
    env = _env(auth)
    cli = [sys.executable, "-m", "fusion_shim", "pool"]
    try:
        up = subprocess.run([*cli, "up", "--ray", address, "--workers", "1", "--device", "cpu", "--name", POOL],
                            capture_output=True, text=True, env=env, timeout=DEADLINE_S)
        assert up.returncode == 0, up.stderr[-2000:]
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:  # warm: a cold worker would be left out for being cold
            status = subprocess.run([*cli, "status", "--ray", address, "--name", POOL], capture_output=True,
                                    text=True, env=env, timeout=DEADLINE_S).stdout
            if " ready " in status:
                break
            time.sleep(1)
        yield address, env
    finally:
        subprocess.run([*cli, "down", "--ray", address, "--name", POOL], capture_output=True, env=env,
                       timeout=DEADLINE_S)
        stop_head(proc)
        shutil.rmtree(directory, ignore_errors=True)


def _run(cpu_pool, policy: str, argv: list[str], tmp_path) -> tuple[str, dict]:
    address, env = cpu_pool
    report = tmp_path / "r.json"
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", policy, "--pool",
                          f"ray://{address}/{POOL}", "--report", str(report), "--quiet", PROGRAM, *argv],
                         capture_output=True, text=True, env=env, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, json.loads(report.read_text())


def test_under_auto_a_program_whose_calls_cannot_pay_for_ray_never_asks_the_cluster(cpu_pool, tmp_path):
    out, rep = _run(cpu_pool, "auto", ["few"], tmp_path)
    assert out.split() == ["27000000.0", "False"]  # the answer, and Ray not loaded in the program
    pool = rep["pool"]
    assert pool["ray"] == {} and pool["workers"] == []  # no helper ran: Ray cost nothing
    assert pool["opening"].startswith("not opened (Ray never asked)"), pool


def test_under_auto_a_pool_worker_on_this_hosts_cpus_gets_no_call_and_ray_stays_out(cpu_pool, tmp_path):
    out, rep = _run(cpu_pool, "auto", ["until_opened"], tmp_path)
    assert out.split() == ["opened", "False"]
    pool = rep["pool"]
    assert pool["opening"].startswith("opened: "), pool
    assert [(w["state"], w["calls"]) for w in pool["workers"]] == [("shared_cpus", 0)], rep["events"]
    assert rep["summary"]["calls"]["worker"] == 0
    assert any("computes on this host's CPUs: under auto it gets no call" in e["what"] for e in rep["events"])
    # what Ray cost is counted, all of it in helper processes: the probe and one driver
    ray = pool["ray"]
    assert ray["helpers"] == 1 and ray["import_s"] > 0 and ray["connect_s"] > 0 and ray["probe_s"] > 0, ray
    assert ray["total_s"] >= ray["import_s"] + ray["connect_s"] + ray["join_s"]
    assert "pool" not in rep["startup"]  # opened off the program's thread: none of the program's start-up


def test_under_remote_calls_go_to_the_pool_and_ray_stays_out_of_the_program(cpu_pool, tmp_path):
    out, rep = _run(cpu_pool, "remote", ["few"], tmp_path)
    assert out.split() == ["27000000.0", "False"]
    workers = rep["pool"]["workers"]
    assert [w["state"] for w in workers] == ["ready"] and workers[0]["calls"] >= 1, rep["events"]
    assert rep["pool"]["ray"]["helpers"] == 1
    assert rep["startup"]["pool"] > 0  # the program waited for it: its start-up says so

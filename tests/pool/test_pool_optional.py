"""The pool costs nothing to a run without one, and an address without a cluster leaves the run local.
No Ray cluster is started here."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

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
    from fusion_shim.pool import locate

    monkeypatch.setattr(locate, "CURRENT_CLUSTER", str(tmp_path / "missing"))
    assert "belongs to no Ray cluster" in locate.unreachable("auto")
    (tmp_path / "missing").write_text("127.0.0.1:1\n")
    assert "cannot be reached" in locate.unreachable("auto")

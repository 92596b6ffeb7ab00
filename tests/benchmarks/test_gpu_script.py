"""The prepared GPU run (benchmarks/gpu/run.sh, issue 9) as a CPU dry run, so that it never rots:
the script runs end to end with ``--device cpu --quick``, every step succeeds, and the JSON it
writes has what the GPU run's table is made from. Its timings are not checked: tiny sizes on a CPU.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

from tests.helpers.environment import ROOT


def test_dry_run_writes_the_results(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    # each step's limit is a deadline, not a target: ten times the GPU run's, since a busy machine
    # slows the dry run's worker start-up (its self-benchmark is taken again under load) and its
    # pytest: the fidelity step ran past 300 s at a load average of 10 on 2 cores
    env.update(OUT=str(out), PYTHON=sys.executable, STEP_LIMIT_SCALE="10")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--device", "cpu", "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"results.json", "summary.txt", "workloads.json", "run.log"} <= set(files), files
    res = json.loads((out / "results.json").read_text())
    log = (out / "run.log").read_text()[-4000:]
    assert res["schema"] == "fusion_shim.gpu_run/1" and res["device"] == "cpu" and res["quick"] is True
    for step in ("deps", "install", "env", "fidelity", "diff", "workloads", "replay"):
        assert res["steps"][step]["exit"] == 0, (step, res["steps"][step], log)
    assert res["steps"]["native"]["exit"] in (0, "absent"), res["steps"]["native"]
    assert res["env"]["python"] and res["env"]["numpy"] and res["env"]["cpus"] >= 1
    assert res["differential"]["passed"] >= 6 and res["differential"]["failures"] == 0, res["differential"]
    assert res["fidelity"]["passed"] >= 2 and res["fidelity"]["failures"] == 0, res["fidelity"]
    wl = res["workloads"]
    assert wl["worker"]["device"] == "cpu" and wl["worker"]["numba"] == "simulator"
    assert set(wl["workloads"]) == {"power", "matmul_chain", "fft", "decomp"}
    for name, row in wl["workloads"].items():
        for policy in ("local", "remote", "auto"):
            assert "body_s" in row[policy], (name, policy, row[policy])
        remote = row["remote"]
        assert remote["calls"]["worker"] >= 1 and remote["calls"]["fallback"] == 0, (name, remote["calls"])
        assert remote["bytes"]["shm_sent"] > 0, (name, remote["bytes"])  # same host: buffers through /dev/shm
        assert row["checksum_rel_diff_remote"] < 1e-4 and row["checksum_rel_diff_auto"] < 1e-4, (name, row)
    assert "target_met" in wl["workloads"]["power"] and "target_met" in wl["workloads"]["matmul_chain"]
    # the replay step: on the CPU the CPU worker's model (a GPU run uses its GPU's), every row measured
    rp = res["replay"]
    assert rp["model"] == "cpu-worker" and rp["link"] == "loopback" and rp["device"] == "cpu", rp
    assert {(r["workload"].split()[0], r["policy"]) for r in rp["rows"]} == {
        (w, p) for w in ("power_chain", "fft_filter") for p in ("remote", "auto")}, rp
    for r in rp["rows"]:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["ratio"] == r["predicted_s"] / r["measured_s"], r
    summary = (out / "summary.txt").read_text()
    assert "quick dry run" in summary and "matmul_chain" in summary
    assert "replay vs measured: model cpu-worker" in summary and "fft_filter 256" in summary, summary


def test_the_replay_step_replays_on_the_lent_gpus_own_model():
    """What the dry run cannot reach: nvidia-smi's names of the lent GPUs map to the replay's table."""
    from fusion_shim.replay.hardware import DEVICES

    spec = importlib.util.spec_from_file_location("gpu_replay", ROOT / "benchmarks/gpu/replay.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    model_for = replay.model_for

    assert model_for("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert model_for("NVIDIA H100 PCIe") == "h100-pcie"
    assert model_for("NVIDIA H200") == "h200" and model_for("NVIDIA H200 NVL") == "h200"
    assert model_for("NVIDIA L4") == "l4" and model_for("NVIDIA L40S") is None
    assert {m for _, m in replay.MODELS} <= set(DEVICES)
    script = (ROOT / "benchmarks/gpu/run.sh").read_text()
    assert script.count("step replay") == 2 and '[ "$rl" -gt 150 ] && rl=150' in script  # both branches, capped


def test_the_device_command_fits_the_tool():
    """The README's device call must stay under the tool's 2,000 characters."""
    readme = (ROOT / "benchmarks/gpu/README.md").read_text()
    command = re.search(r"- command: `([^`]+)`", readme)[1]
    assert command.startswith("bash benchmarks/gpu/run.sh") and len(command) < 2000
    assert (ROOT / "benchmarks/gpu/run.sh").exists()

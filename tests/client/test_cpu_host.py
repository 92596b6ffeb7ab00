"""A host without a GPU: under ``auto`` the embedded worker would run torch on the program's own CPUs,
so it starts only on evidence, the program's own calls of ops a CPU worker wins here at the sizes it
wins them, enough to pay its start (D40, D101); a program whose calls stay below every floor never
starts it.

SIMULATED no GPU: ``CUDA_VISIBLE_DEVICES=-1`` (which ``embedded.gpu_visible`` honours) or a patched
``gpu_visible``, so that these tests say the same on a host that has one."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.catalog import BY_NAME
from fusion_shim.plan.cells import NEVER
from fusion_shim.plan.cpuwins import CPU_WINS, MIN_SPEEDUP, CpuEvidence, CpuWin
from fusion_shim.reporting import format_table
from tests.helpers.shims import READY_S

PY = sys.executable
TIMEOUT = 600
OLD_TIMER_S = 10.0  # the run after which the embedded worker used to start whatever the program did
RNG = np.random.default_rng(22)


def no_gpu_env(**extra: str) -> dict[str, str]:
    """SIMULATED no GPU; this tree's fusion_shim on PYTHONPATH; no FUSION_SHIM* inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["CUDA_VISIBLE_DEVICES"] = "-1"
    env.update(extra)
    return env


SMALL_CALLS = """\
    import json, os, sys, time
    import numpy as np

    def children():
        kids = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                kids += f.read().split()
        return kids

    a = np.random.default_rng(0).standard_normal((64, 64))
    s = np.random.default_rng(1).standard_normal(4096) + 0j
    stop = time.monotonic() + float(sys.argv[1])
    n = 0
    while time.monotonic() < stop:
        for _ in range(50):
            b = a @ a
            f = np.fft.fft(s)
            q = np.linalg.qr(a)
        n += 50
    print(json.dumps({"children": children(), "calls": n}))
"""


def test_a_program_whose_calls_stay_below_every_floor_never_starts_the_worker_on_a_cpu_only_host(tmp_path):
    """Small `@`, fft and qr for longer than the old timer waited: no worker process is ever
    started, and the report says why not (SIMULATED no GPU)."""
    prog = tmp_path / "small.py"
    prog.write_text(textwrap.dedent(SMALL_CALLS))
    report = tmp_path / "report.json"
    r = subprocess.run([PY, "-m", "fusion_shim", "--policy", "auto", "--quiet", "--report", str(report), str(prog),
                        str(OLD_TIMER_S + 1.0)], cwd=tmp_path, env=no_gpu_env(), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["children"] == [] and out["calls"] > 0
    rep = json.loads(report.read_text())
    assert rep["worker"]["state"] == "deferred" and rep["worker"]["ready_after_s"] is None
    assert rep["worker"]["cpu_start"].startswith("not started: no ")
    assert not any("starting the embedded worker" in e["what"] for e in rep["events"])
    below = sum(o.get("below_floor", 0) for o in rep["ops"].values())
    assert below == 3 * out["calls"]  # every call one size comparison, none through the slow path


def test_enough_winnable_work_starts_the_worker_and_the_report_says_on_what_evidence(monkeypatch):
    """Large fft calls: each one computed here is evidence; once they would have saved the worker's
    start, it starts (TEST SETTINGS: a start cost of 0.05 s, so that a few calls are enough, and
    fft won 4x, past the planner's first-call margin; SIMULATED no GPU)."""
    from fusion_shim.client import embedded

    monkeypatch.setattr(embedded, "gpu_visible", lambda: False)
    monkeypatch.setattr("fusion_shim.plan.cpuwins.START_COST_S", 0.05)
    measured = next(w for w in CPU_WINS if w.op == "numpy.fft.fft")
    fft = CpuWin(measured.op, measured.from_bytes, 4.0)  # TEST SETTING: a win past the first-call margin
    monkeypatch.setattr("fusion_shim.plan.cpuwins.CPU_WINS", (fft,))
    rt = fusion_shim.install(policy="auto", quiet=True)
    try:
        assert rt.starts.deferred and rt.floor_cell("numpy.fft.fft")[0] == fft.from_bytes
        assert rt.floor_cell("numpy.matmul")[0] == NEVER and rt.operator_floors() == (NEVER,) * 3
        x = RNG.standard_normal(fft.from_bytes // 16) + 1j * RNG.standard_normal(fft.from_bytes // 16)
        expected = np.fft.fft(x)  # counted as evidence as well
        for _ in range(200):  # each call saves tens of ms there: a few are enough, 200 far more than that
            if not rt.starts.deferred:
                break
            np.testing.assert_allclose(np.fft.fft(x), expected)
        assert not rt.starts.deferred, "the evidence never started the embedded worker"
        deadline = time.monotonic() + READY_S
        while rt.link.proc is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.link.proc is not None
        rep = fusion_shim.report(format="json")
        assert rep["worker"]["cpu_start"].startswith("started at ") and "fft.fft x" in rep["worker"]["cpu_start"]
        assert any("starting the embedded worker" in e["what"] and "would have saved" in e["what"]
                   for e in rep["events"])
        assert "embedded worker (no GPU on this host) started at " in format_table(rep)
    finally:
        fusion_shim.uninstall()


def test_a_win_the_planner_would_not_act_on_is_no_evidence_and_the_report_says_so(monkeypatch):
    """D40: a worker on this host's CPUs gets an op's first call only for a predicted win past
    first_call_margin (the D86 uncertainty added); a smaller win would start a worker given nothing.
    With the measured table none is that large here: the floors stay NEVER and nothing starts."""
    from fusion_shim.client import embedded
    from fusion_shim.plan import policy
    from fusion_shim.plan.margins import first_call_margin

    margin = first_call_margin(shared_cpus=True)
    assert margin == pytest.approx(math.exp(policy.Z * policy.SIGMA_SHARED_CPUS + policy.MIN_LOG_MARGIN))
    ev = CpuEvidence((CpuWin("numpy.fft.fft", 1000, margin * 0.99), CpuWin("numpy.fft.ifft", 1000, margin * 1.01)),
                     start_cost_s=0.1)
    assert ev.floors() == {"numpy.fft.ifft": 1000}
    assert not ev.observe("numpy.fft.fft", 10**6, 100.0) and ev.saving_s == 0.0
    assert ev.observe("numpy.fft.ifft", 10**6, 100.0)
    none = CpuEvidence((CpuWin("numpy.fft.fft", 1000, 1.6),))
    assert none.floors() == {} and "x1.6" in none.describe() and f"x{margin:.2f}" in none.describe()
    if max(w.speedup for w in CPU_WINS) <= margin:  # the table measured here
        monkeypatch.setattr(embedded, "gpu_visible", lambda: False)
        rt = fusion_shim.install(policy="auto", quiet=True)
        try:
            assert rt.starts.deferred and rt.floor_bytes == NEVER
            assert all(rt.floor_cell(w.op)[0] == NEVER for w in CPU_WINS)
            assert fusion_shim.report(format="json")["worker"]["cpu_start"].startswith("not started: no op a CPU worker wins")
        finally:
            fusion_shim.uninstall()


def test_calls_below_an_ops_win_size_or_of_an_op_no_cpu_worker_wins_are_no_evidence():
    ev = CpuEvidence((CpuWin("numpy.fft.fft", 1000, 4.0),), start_cost_s=1.0)
    assert not ev.observe("numpy.fft.fft", 999, 10.0)
    assert not ev.observe("numpy.matmul", 10**9, 10.0)
    assert ev.calls == {} and ev.saving_s == 0.0
    assert not ev.observe("numpy.fft.fft", 1000, 1.0)  # saves 0.75 s there
    assert ev.observe("numpy.fft.fft", 1000, 1.0 / 3)  # 1.0 s: enough, said once
    assert not ev.observe("numpy.fft.fft", 1000, 5.0)
    assert ev.calls == {"numpy.fft.fft": 2} and ev.saving_s == pytest.approx(1.0)


def test_every_cpu_win_is_a_catalog_op_with_a_kernel_and_a_measured_margin():
    from fusion_shim.worker.kernels import KERNELS

    assert CPU_WINS
    for win in CPU_WINS:
        spec = BY_NAME[win.op]
        assert spec.kernel_id in KERNELS, win.op
        assert win.speedup >= MIN_SPEEDUP and win.from_bytes > 0, win
    assert len({w.op for w in CPU_WINS}) == len(CPU_WINS)

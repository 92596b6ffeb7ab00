"""D338: when the workers start (now, deferred on evidence, a pool through Ray) is one object's decision
(:class:`fusion_shim.client.starts.WorkerStarts`); the runtime holds it and asks it, and names none of
its state. SIMULATED no GPU: a patched ``embedded.gpu_visible``."""
from __future__ import annotations

import ast
import os
import re
import threading

import numpy as np
import pytest

from fusion_shim.catalog import BY_NAME
from fusion_shim.client import embedded, starts
from fusion_shim.client.runtime import Runtime
from fusion_shim.client.starts import WorkerStarts
from fusion_shim.config import Config
from fusion_shim.ledger import Ledger
from fusion_shim.plan.cells import NEVER, floor_cells
from fusion_shim.plan.cpuwins import CpuWin
from tests.helpers.environment import ROOT

CLIENT = ROOT / "fusion_shim" / "client"
START_STATE = re.compile(r"defer|evidence|pool|urls|endpoints", re.IGNORECASE)
SET_ELSEWHERE = re.compile(r"deferred|evidence|pool_|_pool")  # WorkerLink.defer sets its own state
WAIT_S = 120.0  # generous: the machine is shared

# (settings, whether the start waits on evidence)
MODES = [
    (dict(policy="auto"), True),  # no GPU: the embedded CPU worker waits (D40)
    (dict(policy="auto", device="cpu"), False),  # asked for: started now
    (dict(policy="remote", worker="tcp://127.0.0.1:9"), False),
    (dict(policy="auto", pool="ray://127.0.0.1:9/p"), True),  # D302
    (dict(policy="remote", pool="ray://127.0.0.1:9/p"), False),  # opened by the first need (D154)
]


@pytest.mark.parametrize("settings, waits", MODES)
def test_the_runtime_holds_no_state_of_when_its_workers_start(monkeypatch, settings, waits):
    monkeypatch.setattr(embedded, "gpu_visible", lambda: False)
    rt = Runtime(Config(**settings))
    try:
        assert rt.starts.deferred is waits
        named = sorted(n for n in {*vars(rt), *dir(type(rt))} if START_STATE.search(n))
        assert named == [], f"the runtime keeps what WorkerStarts decides: {named}"
    finally:
        rt.shutdown()


def _tree(name: str) -> ast.Module:
    return ast.parse((CLIENT / name).read_text())


def _reads_config(node: ast.AST, inputs: set[str]) -> bool:
    """``config.X`` or ``self.config.X`` / ``self._config.X`` with X one of ``inputs``."""
    if not (isinstance(node, ast.Attribute) and node.attr in inputs):
        return False
    value = node.value
    return (isinstance(value, ast.Name) and value.id == "config"
            or isinstance(value, ast.Attribute) and value.attr in ("config", "_config"))


def test_only_the_starts_module_reads_what_decides_a_start_or_changes_the_deferral():
    """The decision's inputs (a GPU visible, a pool, the workers and device asked for) are read in
    client/starts.py alone, and the deferral's state is set nowhere else."""
    inputs = {"pool", "device", "workers", "worker"}
    found = []
    for path in sorted(CLIENT.glob("*.py")):
        if path.name == "starts.py":
            continue
        for node in ast.walk(_tree(path.name)):
            if path.name == "runtime.py":
                if _reads_config(node, inputs) or isinstance(node, ast.Attribute) and node.attr == "gpu_visible":
                    found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
                if isinstance(node, ast.FunctionDef) and START_STATE.search(node.name):
                    found.append(f"{path.name}:{node.lineno} defines {node.name}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{path.name}:{node.lineno} sets .{t.attr}" for t in targets
                          if isinstance(t, ast.Attribute) and SET_ELSEWHERE.search(t.attr)]
    assert found == []


class _Link:
    """A deferred embedded worker's link, as far as its start reads and calls it."""

    def __init__(self):
        self.state, self.stopped, self.owner, self.embedded = "deferred", False, os.getpid(), True
        self.started = threading.Event()

    def start(self):
        self.state = "starting"
        self.started.set()


def test_calls_timed_as_evidence_start_the_deferred_worker_off_the_programs_thread(monkeypatch):
    """D40: the calls it is handed are computed by ``original`` and recorded; once they would have paid
    the start (TEST SETTING: a start that costs 10 ms), the link is started on another thread."""
    monkeypatch.setattr(embedded, "gpu_visible", lambda: False)
    monkeypatch.setattr("fusion_shim.plan.cpuwins.CPU_WINS", (CpuWin("numpy.fft.fft", 64, 4.0),))
    monkeypatch.setattr("fusion_shim.plan.cpuwins.START_COST_S", 0.01)
    config = Config(policy="auto")
    cells, ledger, link, background = floor_cells("auto"), Ledger(), _Link(), threading.Event()
    published = []
    ws = WorkerStarts(config, True, ledger, cells, lambda: [link], background.set, lambda *a: published.append(a))
    assert ws.deferred and cells["numpy.fft.fft"][0] == 64 == ws.evidence_floor and cells["numpy.matmul"][0] == NEVER
    ws.start()
    assert not link.started.is_set()
    x = np.ones(64) + 0j
    threads = []

    def slow_fft(a):
        threads.append(threading.get_ident())
        threading.Event().wait(0.02)
        return np.fft.fft(a)

    spec = BY_NAME["numpy.fft.fft"]
    for _ in range(50):
        np.testing.assert_allclose(ws.evidence_call(spec, (x,), {}, slow_fft), np.fft.fft(x))
        if link.started.wait(0.05):
            break
    assert link.started.wait(WAIT_S) and background.wait(WAIT_S)
    assert not ws.deferred and set(threads) == {threading.get_ident()}
    assert ws.deferred_why().startswith("started at ") and ws.pool_opening() is None
    recs = ledger.snapshot()["records"]
    assert recs and all("timed as evidence for its start" in r["reason"] for r in recs)
    assert published == []  # the embedded worker's floors come from its planner, once ready


def test_a_start_waits_on_evidence_under_auto_for_a_pool_or_a_cpu_worker_embedded_here(monkeypatch):
    monkeypatch.setattr(embedded, "gpu_visible", lambda: False)
    assert starts.waits_on_evidence(Config(policy="auto"))
    assert starts.waits_on_evidence(Config(policy="auto", pool="ray://127.0.0.1:9/p"))
    assert not starts.waits_on_evidence(Config(policy="auto", device="cpu"))
    assert not starts.waits_on_evidence(Config(policy="auto", worker="tcp://127.0.0.1:9"))
    assert not starts.waits_on_evidence(Config(policy="remote", pool="ray://127.0.0.1:9/p"))
    monkeypatch.setattr(embedded, "gpu_visible", lambda: True)
    assert not starts.waits_on_evidence(Config(policy="auto"))

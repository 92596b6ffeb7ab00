"""A stage call is decided once, as an intercepted call is (``CallPath.decide``): running it here
after a refusal, checking a sampled answer here, and a stage it calls while running here ask the
run's stage decider (its planner's) nothing more. Under policy local a stage is a plain call, as an
intercepted one is."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import fusion_shim
from fusion_shim.plan.stages import FIRST_LOCAL, StageDecider
from tests.helpers.shims import install
from tests.stage import stagefns

M = "tests.stage.stagefns"


@pytest.fixture
def choices(monkeypatch):
    """Each stage decision made, by stage name."""
    made: list[str] = []
    decide = StageDecider.decide

    def counted(self, name, *args, **kwargs):
        made.append(name)
        return decide(self, name, *args, **kwargs)
    monkeypatch.setattr(StageDecider, "decide", counted)
    return made


def _records(rt, name):
    return [r for r in rt.ledger.records if r.op == f"stage {M}:{name}"]


def _operands():
    rng = np.random.default_rng(3)
    return rng.standard_normal((40, 40)), rng.standard_normal((40, 3))


def test_under_policy_local_a_stage_is_a_plain_call_and_nothing_decides(choices):
    rt = fusion_shim.install(policy="local", quiet=True, stages=(f"{M}:outer", f"{M}:inner_step"))
    A, X = _operands()
    for _ in range(3):
        stagefns.outer(A, X)
    assert choices == [] and _records(rt, "outer") == []


def test_under_policy_remote_each_stage_call_is_decided_once(code_worker, choices):
    rt = install(code_worker[0], stages=(f"{M}:outer", f"{M}:inner_step"))
    A, X = _operands()
    for _ in range(3):
        stagefns.outer(A, X)
    assert choices == [f"{M}:outer"] * 3
    assert [r.kind for r in _records(rt, "outer")] == ["worker"] * 3


def test_under_policy_remote_a_refused_stage_run_here_is_not_decided_again(plain_worker, choices):
    rt = install(plain_worker[0], stages=(f"{M}:where",))
    for _ in range(2):
        assert stagefns.where(os.getpid()) == "here"
    assert choices == [f"{M}:where"] * 2
    assert [r.kind for r in _records(rt, "where")] == ["fallback", "local"]  # then pinned here


def test_under_policy_remote_a_verified_stage_is_decided_once(code_worker, choices):
    rt = install(code_worker[0], stages=(f"{M}:outer", f"{M}:inner_step"), verify=1.0)
    A, X = _operands()
    stagefns.outer(A, X)
    assert choices == [f"{M}:outer"]
    assert [r.verify for r in _records(rt, "outer")] == ["ok"]


def test_under_policy_auto_a_stage_and_the_stage_it_calls_here_are_decided_once(code_worker, choices):
    rt = install(code_worker[0], policy="auto", stages=(f"{M}:outer", f"{M}:inner_step"))
    A, X = _operands()
    for _ in range(FIRST_LOCAL):
        stagefns.outer(A, X)
    assert choices == [f"{M}:outer"] * FIRST_LOCAL  # the inner stage ran inside it as plain code
    assert [r.kind for r in _records(rt, "outer")] == ["local"] * FIRST_LOCAL
    assert _records(rt, "inner_step") == []


def test_a_run_has_one_stage_runner_whose_decisions_are_its_planners(code_worker):
    """D347: the runtime holds the run's one runner (made once, whichever thread asks first), and the
    stage decisions it asks for, which the report reads, are the run's planner's."""
    rt = install(code_worker[0], stages=(f"{M}:outer", f"{M}:inner_step"))
    start, got = threading.Barrier(8), []

    def ask():
        start.wait()
        got.append(rt.stage_runner())
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(r is got[0] for r in got) and got[0] is rt.stage_runner()
    A, X = _operands()
    stagefns.outer(A, X)
    assert got[0].decider is rt.planner.stages
    assert [key[0] for key in rt.planner.stages.stats] == [f"{M}:outer"]
    assert [r.reason for r in _records(rt, "outer")] == ["policy remote"]

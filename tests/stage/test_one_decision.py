"""A stage call is decided once, as an intercepted call is (``CallPath.decide``): running it here
after a refusal, checking a sampled answer here, and a stage it calls while running here ask the
stage decider nothing more. Under policy local a stage is a plain call, as an intercepted one is."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fusion_shim
from fusion_shim.stages.decide import FIRST_LOCAL, Decider
from tests.helpers.shims import install
from tests.stage import stagefns

M = "tests.stage.stagefns"


@pytest.fixture
def choices(monkeypatch):
    """Each stage decision made, by stage name."""
    made: list[str] = []
    choose = Decider.choose

    def counted(self, name, *args, **kwargs):
        made.append(name)
        return choose(self, name, *args, **kwargs)
    monkeypatch.setattr(Decider, "choose", counted)
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

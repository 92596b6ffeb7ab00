"""Where a stage call runs: the decision as a value with its reason, and under policy auto against a
worker whose stage time differs from this host's."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from fusion_shim.plan import Call
from fusion_shim.plan.stages import FIRST_LOCAL, REUSE_CAP, Measured, Reused, StageDecider, shape_key
from tests.helpers.shims import install
from tests.stage import stagefns

LINK = SimpleNamespace(rtt_s=1e-3, bandwidth=None)
KEY = ("s", ((8,), "float64"))


def test_the_first_calls_run_here_then_an_exploration_measures_the_worker():
    d = StageDecider("auto")
    for _ in range(FIRST_LOCAL):
        c = d.decide("s", KEY, LINK, 64)
        assert c.where == "local" and "first" in c.reason
        d.learn("s", KEY, Measured("local", 1.0))
    c = d.decide("s", KEY, LINK, 64)
    assert c.where == "remote" and c.reason.startswith("exploring")
    d.learn("s", KEY, Measured("remote", 0.11, worker_s=0.1, sent=64, received=64, unsent=64))
    c = d.decide("s", KEY, LINK, 64)
    assert c.where == "remote" and c.remote_s < 0.2 and c.local_s == 1.0


def test_a_worker_that_measures_slower_sends_the_stage_back_here():
    d = StageDecider("auto")
    for _ in range(FIRST_LOCAL):
        d.decide("s", KEY, LINK, 64)
        d.learn("s", KEY, Measured("local", 0.1))
    d.decide("s", KEY, LINK, 64)
    d.learn("s", KEY, Measured("remote", 1.0, worker_s=0.99, sent=64, received=64, unsent=64))
    assert [d.decide("s", KEY, LINK, 64).where for _ in range(5)] == ["local"] * 5


def test_exploration_waits_while_it_costs_more_than_its_share():
    d = StageDecider("auto")
    d.learn("s", KEY, Measured("local", 10.0))
    d.learn("s", KEY, Measured("local", 10.0))
    d.learn("s", KEY, Measured("remote", 1.0, worker_s=0.9, sent=8, received=8, unsent=8))
    for _ in range(60):  # local is due for a new measurement after 50 calls, but would cost 9 s more each
        assert d.decide("s", KEY, LINK, 8).where == "remote"
        d.learn("s", KEY, Measured("remote", 1.0, worker_s=0.9, sent=8, received=8, unsent=8))


MATMUL = Call("numpy.matmul", "products", "f8", 2e9, 64, 64)


def _measured_here(d, priced, inner_s=0.9):
    for _ in range(FIRST_LOCAL):
        d.decide("s", KEY, LINK, 64)
        d.learn("s", KEY, Measured("local", 1.0, inner_s=inner_s, priced=priced))


def test_before_its_first_run_there_a_stage_is_priced_by_the_workers_models_of_its_calls():
    d = StageDecider("auto")
    _measured_here(d, {MATMUL: 3})
    fast = d.decide("s", KEY, LINK, 64, price=lambda calls: 0.01 * sum(calls.values()))
    assert fast.where == "remote" and "the worker's models for its 3 calls inside" in fast.reason
    # here's 0.1 s outside the intercepted calls, the worker's 3 x 0.01 s, the round trip and the bytes
    assert fast.remote_s == pytest.approx(0.1 + 0.03 + 1e-3 + 64e-9)
    slow = d.decide("s", KEY, LINK, 64, price=lambda calls: 1.0 * sum(calls.values()))
    assert slow.where == "local" and not slow.reason.startswith("exploring")  # 2.1 s more: over its share
    assert slow.remote_s == pytest.approx(0.1 + 3.0 + 1e-3 + 64e-9)


def test_without_the_workers_models_a_stage_is_assumed_as_fast_there_and_explored():
    d = StageDecider("auto")
    _measured_here(d, {MATMUL: 3})
    for price in (None, lambda calls: None):
        c = d.decide("s", KEY, LINK, 64, price=price)
        assert c.where == "remote" and c.reason.startswith("exploring") and "assumed as fast as here" in c.reason


def test_a_run_whose_calls_went_unrecorded_keeps_the_calls_seen_before():
    d = StageDecider("auto")
    _measured_here(d, {MATMUL: 3})
    d.learn("s", KEY, Measured("local", 1.0))  # its calls stayed under their floors this time
    d.learn("s", KEY, Measured("local", 1.0, inner_s=0.3, priced={MATMUL: 1}))  # ... most of them
    c = d.decide("s", KEY, LINK, 64, price=lambda calls: 0.01 * sum(calls.values()))
    assert "its 3 calls inside" in c.reason and c.remote_s == pytest.approx(0.131, abs=1e-3)


def test_an_input_a_stage_keeps_being_passed_is_priced_by_its_share_of_one_upload():
    reused, kept = Reused(), lambda nbytes: nbytes >= 1 << 18
    A, small = np.ones((512, 512)), np.ones(16)
    got = [reused.priced_bytes(((A, small), {}), kept) for _ in range(REUSE_CAP + 3)]
    assert got == [A.nbytes // (min(k, REUSE_CAP) + 1) + small.nbytes for k in range(REUSE_CAP + 3)]
    # a copy is another buffer, which a remote run would upload whole
    assert reused.priced_bytes(((A.copy(), small), {}), kept) == A.nbytes + small.nbytes


def test_a_pinned_stage_runs_here_and_policy_remote_sends_the_rest():
    d = StageDecider("remote")
    assert d.decide("a", KEY, LINK).where == "remote"
    assert d.decide("a", KEY, None).reason == "no worker ready"
    d.pin("a", "the worker refuses code")
    assert d.decide("a", KEY, LINK).reason == "pinned here: the worker refuses code"


def test_models_are_kept_per_argument_shapes():
    assert shape_key("s", (np.zeros((2, 3)),), {}) != shape_key("s", (np.zeros((3, 2)),), {})
    assert shape_key("s", ([np.zeros(2)], 1.0), {"k": 2}) == shape_key("s", ([np.ones(2)], 5.0), {"k": 3})


def _kinds(rt, name):
    return [r.kind for r in rt.ledger.records if r.op == f"stage tests.stage.stagefns:{name}"]


@pytest.mark.parametrize("name, kinds", [
    ("slow_here", ["local", "local", "worker", "worker", "worker", "worker"]),  # moves to the worker
    ("slow_elsewhere", ["local", "local", "worker", "local", "local", "local"]),  # stays here once measured
])
def test_auto_places_a_stage_where_it_measured_faster(code_worker, name, kinds):
    rt = install(code_worker[0], policy="auto", stages=(f"tests.stage.stagefns:{name}",))
    fn, a = getattr(stagefns, name), np.ones(4)
    for _ in range(6):
        np.testing.assert_array_equal(fn(os.getpid(), a), a * 2)
    assert _kinds(rt, name) == kinds


def test_a_stage_goes_where_the_workers_models_price_its_calls_before_it_ran_there(code_worker):
    """SIMULATED: the worker's products model is set 10^6 times faster than any device; its real
    stage time is never measured before the decision that this test checks. ``min_flops`` keeps the
    products inside here, so that no measured call corrects that model meanwhile. The link is set
    measured at 1 GB/s each way: its own probe, taken beside busy CPUs, measured 2-60 MB/s over ipc,
    which priced the stage's 4 MB over its calls' time and raised the products' floor past them
    (then unrecorded, unpriced); the link's price is not what this test checks."""
    rng = np.random.default_rng(5)
    A, X = rng.standard_normal((1024, 1024)), rng.standard_normal((1024, 128))
    expected = stagefns.chain(A, X, 10)  # plain NumPy: the shim is not installed yet
    rt = install(code_worker[0], policy="auto", min_flops=1e12, stages=("tests.stage.stagefns:chain",))
    rt.link.bandwidth = (1e9, 1e9)  # measured: no probe of its own (the first stage call would start one)
    worker = rt.planner.profile.workers[0]
    worker.link.set_measured(rt.link.rtt_s, 1e9, 1e9)
    worker.device.set_curve("products", "f8", [(1e9, 1e-6)])
    rt.planner.refresh_floors()
    for _ in range(FIRST_LOCAL + 1):
        np.testing.assert_allclose(stagefns.chain(A, X, 10), expected, rtol=1e-10)
    stages = [r for r in rt.ledger.records if r.op == "stage tests.stage.stagefns:chain"]
    assert [r.kind for r in stages] == ["local"] * FIRST_LOCAL + ["worker"], [(r.wall_s, r.reason) for r in stages]
    assert stages[-1].reason.startswith("predicted"), stages[-1].reason  # decided, not explored
    assert "the worker's models for its 10 calls inside" in stages[-1].reason, stages[-1].reason

"""The client trusts no number a worker reports: times that are not finite, negative, or longer
than the round trip that carried them are dropped with an event, never shown or learnt from."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import fusion_shim
from fusion_shim.plan.model import RateModel
from fusion_shim.protocol import messages
from fusion_shim.reporting import format_table
from tests.helpers.shims import READY_S

pytest.importorskip("torch")


def test_impossible_times_in_a_result_are_left_out_and_named():
    t = messages.read_timing({"timing": {"kernel": float("nan"), "h2d": -1.0, "d2h": 0.002,
                                         "fingerprint": float("inf"), "oom_retry": 0}})
    assert t.phases == {"d2h": 0.002} and t.fingerprint == 0.0
    assert sorted(t.rejected) == ["fingerprint=inf", "h2d=-1.0", "kernel=nan"]
    assert messages.read_timing({"timing": {"kernel": 0.5}}).rejected == ()


def test_a_benchmark_point_no_device_could_give_is_not_believed():
    m = RateModel("worker")
    m.set_curve("products", "f8", [(1e9, float("inf")), (1e9, float("nan")), (float("inf"), 1.0), (1e9, 1e-12)])
    assert ("products", "f8") not in m.curves  # none was a device's: the prior stays
    m.set_curve("products", "f8", [(1e9, 0.01), (1e9, 1e-12)])
    assert len(m.curves[("products", "f8")]) == 1
    assert m.observe("numpy.matmul", "products", "f8", 1e9, float("inf")) is None and not m.buckets


class Lying:
    """A worker whose results are right and whose times are not (set per test)."""

    def __init__(self, timing):
        from fusion_shim.worker.server import Worker

        class _Worker(Worker):
            def _reply(self, rid, results, timing_, extra, dests, slots):
                return super()._reply(rid, results, {**timing_, **timing}, extra, dests, slots)

        self.worker = _Worker("cpu")


@pytest.mark.parametrize("lie", [{"kernel": float("nan")}, {"h2d": -135.0}, {"kernel": 3600.0}],
                         ids=["nan", "negative", "longer-than-the-call"])
def test_a_worker_reporting_impossible_times_costs_nothing_but_an_event(lie, no_shim_after):
    from fusion_shim.worker import serve_in_thread

    url = f"inproc://fusion-shim-lying-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=Lying(lie).worker)
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True)
        assert rt.link.wait_ready(READY_S)
        a = np.random.default_rng(3).standard_normal((300, 300))
        for _ in range(3):
            np.testing.assert_allclose(np.matmul(a, a), np.matmul.__wrapped__(a, a), rtol=1e-12, atol=1e-9)
        recs = [r for r in rt.ledger.records if r.op == "numpy.matmul"]
        assert len(recs) == 3 and all(r.kind == "worker" for r in recs)
        for r in recs:
            assert all(math.isfinite(v) and v >= 0 for v in r.phases.values()) and r.phases.get("kernel", 0) < 60, r.phases
        assert any("reported impossible times" in e for _, e in rt.ledger.events)
        table = [ln for ln in format_table(fusion_shim.report(format="json"), full=True).splitlines() if "impossible times" not in ln]
        assert not [ln for ln in table if "nan" in ln or "-135" in ln or "3600" in ln], table
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(10)

"""D348: an op this host knows by nothing but its prior, yet a worker timed against its own GEMM,
is read here halfway (in logs) between the prior and this host's GEMM curve at the worker's ratio;
and D350: an exploration priced free needs no budget left, so the program's first call may be one."""
import math

import pytest

from fusion_shim.plan import Call, Planner, Profile, WorkerState, decide
from fusion_shim.plan.model import PRIOR_GFLOPS, SIGMA_CURVE, SIGMA_KIN, SIGMA_PRIOR

READY = [WorkerState("ready")]
SVD = "numpy.linalg.svd"


def svd_call(flops=1.7e9, n_bytes=2359296):
    return Call(SVD, "linalg", "f8", flops, n_bytes, n_bytes)


def with_kin(local_gemm=40.0, worker_gemm=400.0, worker_svd=20.0):
    """This host's GEMM calibrated; a worker that timed GEMM and svd (GFLOP/s, flat)."""
    p = Profile(1)
    p.local.set_curve("products", "f8", [(1e9, 1e9 / (local_gemm * 1e9))])
    dev = p.workers[0].device
    dev.set_curve("products", "f8", [(1e9, 1e9 / (worker_gemm * 1e9))])
    dev.set_op_curve(SVD, "f8", [(1e8, 1e8 / (worker_svd * 1e9)), (1e9, 1e9 / (worker_svd * 1e9))])
    p.local.set_kin(SVD, "f8", dev.gemm_offsets(SVD, "f8"))
    p.workers[0].link.set_measured(1e-4, 1e10, 1e10)
    return p


def test_an_op_known_here_only_by_its_prior_is_read_between_it_and_gemm_at_the_workers_ratio():
    """svd 20x slower than GEMM on the worker, GEMM 40 GFLOP/s here: 2 GFLOP/s by the ratio, 10 by
    the prior; read at their geometric mean, two guesses as wide as each other, narrower together."""
    p = with_kin()
    seconds, sigma, _ = p.local.predict(SVD, "linalg", "f8", 1e9)
    assert seconds == pytest.approx(1e9 / (math.sqrt(PRIOR_GFLOPS["linalg"] * 2.0) * 1e9))
    assert sigma == SIGMA_KIN < SIGMA_PRIOR
    # an op the worker did not time, and the products family itself, read as before
    assert p.local.predict("numpy.linalg.eigh", "linalg", "f8", 1e9)[1] == SIGMA_PRIOR
    assert p.local.predict("numpy.matmul", "products", "f8", 1e9)[0] == pytest.approx(1e9 / 40e9)


def test_without_this_hosts_gemm_curve_the_prior_stands():
    p = with_kin()
    p.local.curves.clear()
    assert p.local.predict(SVD, "linalg", "f8", 1e9) == (pytest.approx(1e9 / 10e9), SIGMA_PRIOR, 0)


def test_anything_measured_here_of_the_family_outranks_the_workers_ratio():
    p = with_kin()
    p.local.set_curve("linalg", "f8", [(1e9, 1e9 / 30e9)])  # solve calibrated here
    seconds, sigma, _ = p.local.predict(SVD, "linalg", "f8", 1e9)
    assert seconds == pytest.approx(1e9 / 30e9) and sigma > SIGMA_CURVE
    p = with_kin()
    p.local.observe(SVD, "linalg", "f8", 1e9, 0.5)  # its own call measured
    assert p.local.predict(SVD, "linalg", "f8", 1e9)[0] == pytest.approx(0.5)


def test_a_worker_much_faster_than_the_kin_reading_gets_the_call_the_bare_prior_kept():
    """pca_spectral on an RTX 5090 model: the worker predicted ~3x faster than the prior, short of a
    prior's x8 margin; read at the worker's ratio as well, this host's side is no bare prior."""
    call = svd_call()
    bare = with_kin()
    bare.local.kin.clear()
    assert decide("auto", call, bare, READY).where == "local"
    d = decide("auto", call, with_kin(), READY)
    assert d.where == "worker" and not d.explore and d.local_sigma == SIGMA_KIN


def test_a_ready_worker_lends_its_ratios_and_a_linalg_call_reads_this_hosts_cached_gemm_curve():
    class Cache:
        def get(self, family, dtype):
            return [(1e9, 1e9 / 40e9)] if (family, dtype) == ("products", "f8") else None

    planner = Planner("auto", 1, cache=Cache(), ops={SVD: "linalg", "numpy.matmul": "products"})
    bench = {"points": {"products/f8": [[1e9, 1e9 / 400e9]]}, "ops": {f"{SVD}/f8": [[1e9, 1e9 / 20e9]]}}
    planner.worker_ready(0, bench, 1e-4, 1e10, 1e10)
    assert planner.profile.local.kin[(SVD, "f8")] == [(pytest.approx(math.log(1e9)), pytest.approx(math.log(0.05)))]
    assert ("products", "f8") not in planner.profile.local.curves
    d = planner.decide(svd_call(), READY)
    assert ("products", "f8") in planner.profile.local.curves and d.local_sigma == SIGMA_KIN


def free_svd():
    """A worker that even priced pessimistically beats this host's kin reading, short of the margin."""
    p = with_kin(worker_svd=20.0)
    p.workers[0].device.set_op_curve(SVD, "f8", [(1e9, 1e9 / 8.0e9)])  # ~1.8x the kin reading: no margin
    return p, svd_call(n_bytes=1 << 10)


def test_an_exploration_priced_free_needs_no_budget_left_but_an_overspent_one_stops_it():
    """The program's first decided call has no budget yet (2% of nothing): a worker that even priced
    pessimistically beats this host's prediction, short of the margin, is tried all the same."""
    p, call = free_svd()
    d = decide("auto", call, p, READY, explore_left_s=0.0)
    assert d.where == "worker" and d.explore
    assert d.remote_s * math.exp(d.remote_sigma) < d.local_s < d.remote_s * math.exp(math.hypot(d.local_sigma,
                                                                                          d.remote_sigma))
    assert decide("auto", call, p, READY, explore_left_s=-1e-3).where == "local"
    # one that could cost more than nothing still needs a budget to pay it from
    slow = Call(SVD, "linalg", "f8", call.flops, 1 << 30, call.bytes_out)  # 1 GB up at 10 GB/s: 0.1 s more
    assert decide("auto", slow, p, READY, explore_left_s=0.0).where == "local"
    assert decide("auto", slow, p, READY, explore_left_s=1.0).explore


def test_a_price_without_exploring_never_explores_even_at_a_zero_budget():
    """Planner.price(explore=False) (what residency asks: would the call go were its inputs there?)
    answers below any budget, so that a free exploration is no reason to hash a call's inputs."""
    p, call = free_svd()
    planner = Planner("auto", 1, ops={SVD: "linalg", "numpy.matmul": "products"})
    planner.profile = p
    assert planner.intercepted_s == 0.0
    assert planner.price(call, READY).explore
    d = planner.price(call, READY, explore=False)
    assert d.where == "local" and not d.explore

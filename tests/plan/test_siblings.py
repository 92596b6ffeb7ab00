"""D331: the local model learns, from the first call of each op of a family read off another op's
curve or the prior, how far such readings are off here, and reads the family's next ops by it."""
import math

import pytest

from fusion_shim.plan import Call, Profile, WorkerState, decide
from fusion_shim.plan.model import SIGMA_CURVE, SIGMA_OTHER, SIGMA_PRIOR

READY = [WorkerState("ready")]


def linalg(op, flops, n_bytes=4 << 20):
    return Call(op, "linalg", "f8", flops, n_bytes, n_bytes)


def test_decompositions_read_off_the_solve_curve_follow_the_first_ones_measured_here():
    """Read off solve's calibration curve, eigh, svd, inv and qr ran 2.5-5x slower here than predicted
    (workload-decompositions); the first measured says so of the next, which then go to a worker
    predicted 2x faster than their reading, 6x than the corrected one."""
    p = Profile.synthetic(local_gflops=30.0, worker_gflops=60.0, rtt=100e-6, bandwidth=2e10)
    local = p.local
    inv = linalg("numpy.linalg.inv", 1e9)
    before = local.predict(inv.op, "linalg", "f8", inv.flops)[0]
    assert decide("auto", inv, p, READY).where == "local"  # 2x faster, short of the margin
    eigh = local.predict("numpy.linalg.eigh", "linalg", "f8", 4e9)[0]
    local.observe("numpy.linalg.eigh", "linalg", "f8", 4e9, 3 * eigh)
    assert local.predict(inv.op, "linalg", "f8", inv.flops)[0] == pytest.approx(3 * before)
    assert decide("auto", inv, p, READY).where == "worker"
    # the representative's own curve stands as measured, and the measured op keeps its own calls
    assert local.predict("numpy.linalg.solve", "linalg", "f8", 1e9)[0] == pytest.approx(1e9 / 30e9)
    assert local.predict("numpy.linalg.eigh", "linalg", "f8", 4e9)[0] == pytest.approx(3 * eigh)
    # each op says so once: the eigh's next calls do not move it
    local.observe("numpy.linalg.eigh", "linalg", "f8", 4e9, 30 * eigh)
    assert local.siblings[("linalg", "f8")][1] == 1
    # a new curve for the family replaces the reading it was learnt against
    local.set_curve("linalg", "f8", [(1e9, 1e9 / 30e9)])
    assert local.predict(inv.op, "linalg", "f8", inv.flops)[0] == pytest.approx(before)


def test_a_prior_corrected_by_a_measured_sibling_is_as_certain_as_another_ops_curve():
    """No calibration of the family: the prior read an svd 3.3x fast here (pca_spectral); once it is
    measured, its family's other ops are read at its offset, no longer trusted as a bare prior."""
    p = Profile()
    sigma = p.local.predict("numpy.linalg.eigh", "linalg", "f8", 5e8)[1]
    assert sigma == SIGMA_PRIOR
    svd = p.local.predict("numpy.linalg.svd", "linalg", "f8", 1.7e9)[0]
    p.local.observe("numpy.linalg.svd", "linalg", "f8", 1.7e9, 3.3 * svd)
    seconds, sigma, _ = p.local.predict("numpy.linalg.eigh", "linalg", "f8", 5e8)
    assert seconds == pytest.approx(3.3 * 5e8 / 10e9) and sigma == SIGMA_CURVE + SIGMA_OTHER
    # another family, and a lower bound out of a deadline, say nothing
    assert p.local.predict("numpy.fft.fft", "fft", "c16", 1e8)[1] == SIGMA_PRIOR
    p.local.observe("numpy.linalg.qr", "linalg", "f8", 1e9, 100.0, force=True)
    assert p.local.siblings[("linalg", "f8")] == [pytest.approx(-math.log(3.3)), 1]


def test_a_workers_model_learns_no_siblings():
    """The worker's counterpart is its drift (D83); its first calls carry warm-ups of their own."""
    worker = Profile().workers[0].device
    worker.observe("numpy.linalg.svd", "linalg", "f8", 1e9, 10.0)
    assert not worker.siblings

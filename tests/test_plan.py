"""The decision function on synthetic profiles: pure, no I/O."""
from fusion_shim import plan
from fusion_shim.plan import Profile, decide


def _profile(local=100.0, worker=1000.0, rtt=100e-6, bw=2e9):
    p = Profile()
    p.local_gflops = {f: local for f in plan.FAMILIES}
    p.worker_gflops = {f: worker for f in plan.FAMILIES}
    p.rtt_s, p.bandwidth = rtt, bw
    return p


def test_local_policy_never_offloads():
    d = decide("local", "products", 1e12, 1, 1, "ready", _profile(), 0)
    assert d.where == "local" and d.reason == "policy local"


def test_remote_policy_offloads_when_ready_and_says_why_not_otherwise():
    assert decide("remote", "products", 1.0, 1, 1, "ready", _profile(), 1e9).where == "worker"
    d = decide("remote", "products", 1e12, 1, 1, "down", _profile(), 0)
    assert d.where == "local" and "down" in d.reason


def test_auto_never_waits_for_a_cold_worker():
    d = decide("auto", "products", 1e12, 1, 1, "starting", _profile(), 0)
    assert d.where == "local" and "starting" in d.reason


def test_auto_below_the_floor_stays_local():
    d = decide("auto", "products", 1e5, 1, 1, "ready", _profile(), 1e6)
    assert d.where == "local" and "floor" in d.reason


def test_auto_offloads_heavy_compute_with_small_transfers():
    n = 4096  # 137 GFLOP, 384 MiB moved: 1.4 s here vs 0.14 s + 0.2 s there
    d = decide("auto", "products", 2 * n**3, 2 * 8 * n * n, 8 * n * n, "ready", _profile(), 0)
    assert d.where == "worker"
    assert d.remote_s < d.local_s


def test_auto_keeps_transfer_bound_work_local():
    # element-wise-like intensity: moving the bytes costs more than computing here
    d = decide("auto", "fft", 5e8, 8 << 27, 8 << 27, "ready", _profile(local=50, worker=5000, bw=1e9), 0)
    assert d.where == "local" and d.remote_s > d.local_s


def test_same_speed_worker_is_never_chosen():
    # the CPU worker on this machine: same rate, plus transfers -> always local
    for flops in (1e6, 1e9, 1e12):
        assert decide("auto", "linalg", flops, 1 << 20, 1 << 20, "ready", _profile(100, 100), 0).where == "local"


def test_online_correction_moves_predictions_toward_measurements():
    p = _profile()
    before = p.predict_local("products", 1e9)
    for _ in range(20):
        p.learn("products", "local", p.predict_local("products", 1e9), 4 * before)
    assert 3.5 * before < p.predict_local("products", 1e9) < 4.5 * before

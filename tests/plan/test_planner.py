"""The decision function and the models on synthetic profiles: pure, no I/O (issue 5)."""
import math

import pytest

from fusion_shim.plan import NEVER, Call, Decision, Planner, Profile, WorkerState, decide, floors
from fusion_shim.plan.model import BUCKET, SIGMA_CURVE, SIGMA_OTHER, LinkModel, RateModel

READY = [WorkerState("ready")]


def matmul(n, dtype="f8", size=8):
    return Call("numpy.matmul", "products", dtype, 2.0 * n**3, 2 * size * n * n, size * n * n)


def profile(local=100.0, worker=1000.0, rtt=100e-6, bw=2e9, workers=1, measured=True):
    return Profile.synthetic(local, worker, rtt=rtt, bandwidth=bw, workers=workers, measured=measured)


# -- policies ----------------------------------------------------------------------------------------

def test_local_policy_never_offloads():
    d = decide("local", matmul(8192), profile(), READY)
    assert d.where == "local" and d.reason == "policy local"


def test_remote_policy_offloads_when_ready_and_says_why_not_otherwise():
    d = decide("remote", matmul(4), profile(), READY)
    assert d.where == "worker" and d.worker == 0 and d.local_s and d.remote_s  # priced for the report
    d = decide("remote", matmul(4096), profile(), [WorkerState("down")])
    assert d.where == "local" and "down" in d.reason


@pytest.mark.parametrize("state", ["cold", "warming", "starting", "down"])
def test_auto_never_waits_for_a_worker_that_is_not_ready(state):
    # a 100 GFLOP/s here, 1000 there, 16k matmul: the worker would win by far, were it ready
    d = decide("auto", matmul(16384), profile(), [WorkerState(state)])
    assert d.where == "local" and state in d.reason


def test_auto_below_the_configured_flop_floor_stays_local():
    d = decide("auto", matmul(4096), profile(), READY, min_flops=1e12)
    assert d.where == "local" and "floor" in d.reason


def test_auto_offloads_heavy_compute_with_small_transfers():
    n = 4096  # 137 GFLOP, 384 MiB moved: 1.4 s here vs 0.14 s + 0.2 s there
    d = decide("auto", matmul(n), profile(), READY)
    assert d.where == "worker" and d.worker == 0 and not d.explore
    assert d.remote_s < d.local_s
    assert d.remote_s == pytest.approx(100e-6 + 3 * 8 * n * n / 2e9 + 2 * n**3 / 1e12, rel=1e-6)


def test_auto_keeps_transfer_bound_work_local():
    # an FFT's intensity: moving the bytes costs more than computing here
    fft = Call("numpy.fft.fft", "fft", "c16", 5 * (1 << 24) * 24, 16 << 24, 16 << 24)
    d = decide("auto", fft, profile(local=50, worker=5000, bw=1e9), READY)
    assert d.where == "local" and d.remote_s > d.local_s


def test_same_speed_worker_is_never_chosen():
    # the CPU worker on this machine: the same rate, plus transfers -> always local
    for n in (64, 512, 4096, 16384):
        assert decide("auto", matmul(n), profile(100, 100), READY).where == "local"


# -- what a decision prices ---------------------------------------------------------------------------

def test_busy_worker_is_priced_with_its_queue():
    call = matmul(4096)
    idle = decide("auto", call, profile(), [WorkerState("ready")])
    assert idle.where == "worker"
    busy = decide("auto", call, profile(), [WorkerState("busy", queued=3, backlog_s=5.0)])
    assert busy.where == "local" and busy.remote_s > 5.0
    # two workers: the idle one is chosen over the busy one
    two = decide("auto", call, profile(workers=2), [WorkerState("busy", 3, 5.0, name="a"),
                                                      WorkerState("ready", name="b")])
    assert two.where == "worker" and two.worker == 1 and "on b" in two.reason


def test_missing_residency_is_priced_and_resident_inputs_are_not():
    # a matrix-vector-like product: 8 GFLOP on 1 GB of inputs; 80 ms here, 0.5 s to ship the inputs
    call = Call("numpy.matmul", "products", "f8", 8e9, 1 << 30, 1 << 20)
    p = profile(local=100, worker=1000, bw=2e9)
    assert decide("auto", call, p, [WorkerState("ready", bytes_in=None)]).where == "local"
    assert decide("auto", call, p, [WorkerState("ready", bytes_in=call.bytes_in)]).where == "local"
    held = decide("auto", call, p, [WorkerState("ready", bytes_in=0)])
    assert held.where == "worker" and held.remote_s < 0.02
    # several workers: the one that holds the inputs
    p2 = profile(local=100, worker=1000, bw=2e9, workers=3)
    d = decide("auto", call, p2, [WorkerState("ready", name="a"), WorkerState("ready", bytes_in=0, name="b"),
                                  WorkerState("warming", bytes_in=0, name="c")])
    assert d.where == "worker" and d.worker == 1


def test_margin_shrinks_as_evidence_grows():
    # predicted 1.3x faster on the worker: with a prior-only worker model that is not enough
    p = Profile(1)
    p.local.set_curve("products", "f8", [(1e9, 0.01)])       # 100 GFLOP/s here, calibrated
    p.workers[0].link.set_measured(1e-4, 1e10, 1e10)
    p.workers[0].device.prior = {"products": 130.0}            # no benchmark: sigma is the prior's
    call = matmul(2048)
    first = decide("auto", call, p, READY)
    assert first.where == "local" and first.remote_s < first.local_s
    for _ in range(30):  # both sides measured again and again at this size, as predicted
        p.local.observe(call.op, call.family, call.dtype, call.flops, call.flops / 100e9)
        p.workers[0].device.observe(call.op, call.family, call.dtype, call.flops, call.flops / 130e9)
    later = decide("auto", call, p, READY)
    assert later.where == "worker"
    assert later.local_sigma < first.local_sigma and later.remote_sigma < first.remote_sigma


# -- exploration --------------------------------------------------------------------------------------

def _uncertain_worker():
    """Prior-only worker model (sigma 1): predicted 2x slower than local, could plausibly win."""
    p = Profile(1)
    p.local.set_curve("products", "f8", [(1e9, 0.01)])
    p.workers[0].device.prior = {"products": 60.0}
    p.workers[0].link.set_measured(1e-4, 1e10, 1e10)
    return p


def test_exploration_needs_budget():
    p, call = _uncertain_worker(), matmul(1024)
    assert decide("auto", call, p, READY, explore_left_s=0.0).where == "local"
    d = decide("auto", call, p, READY, explore_left_s=1.0)
    assert d.where == "worker" and d.explore and "exploring" in d.reason


def test_exploration_on_a_worker_contended_by_the_programs_blas_is_priced_more_pessimistically():
    """Beside the program's own BLAS threads a same-host CPU worker's kernel took 1-30x its idle
    time: an exploration there needs a budget that would cover the worst of it (it is waited for);
    elsewhere the same one is taken."""
    from fusion_shim.plan.policy import SIGMA_SHARED_CPUS_EXPLORE, Z_EXPLORE_COST

    p, call = _uncertain_worker(), matmul(1024)
    shared = [WorkerState("ready", contended=True)]
    d = decide("auto", call, p, READY, explore_left_s=1.0)
    assert d.explore
    cost = d.remote_s * math.exp(Z_EXPLORE_COST * d.remote_sigma) - d.local_s
    shared_cost = d.remote_s * math.exp(Z_EXPLORE_COST * math.hypot(d.remote_sigma, SIGMA_SHARED_CPUS_EXPLORE)) - d.local_s
    assert 0 < cost < shared_cost and shared_cost > 25 * d.remote_s - d.local_s
    budget = (cost + shared_cost) / 2
    assert decide("auto", call, p, READY, explore_left_s=budget).explore
    assert not decide("auto", call, p, shared, explore_left_s=budget).explore
    assert decide("auto", call, p, shared, explore_left_s=shared_cost * 1.01).explore


def test_no_exploration_over_a_link_not_yet_measured():
    p, call = _uncertain_worker(), matmul(1024)
    p.workers[0].link = type(p.workers[0].link)()  # the prior link: 2 GB/s assumed, never measured
    d = decide("auto", call, p, READY, explore_left_s=1.0)
    assert d.where == "local" and not d.explore


def test_no_exploration_where_the_worker_cannot_plausibly_win():
    p = profile(local=100, worker=100, bw=1e8)  # a measured, slow link: hopeless even optimistically
    d = decide("auto", matmul(2048), p, READY, explore_left_s=100.0)
    assert d.where == "local" and not d.explore


def test_exploration_stops_once_the_place_has_samples():
    p, call = _uncertain_worker(), matmul(1024)
    for _ in range(3):
        p.workers[0].device.observe(call.op, call.family, call.dtype, call.flops, call.flops / 30e9)
    d = decide("auto", call, p, READY, explore_left_s=1.0)
    assert d.where == "local" and not d.explore


def test_planner_learns_a_wrong_prior_within_the_budget():
    """The worker is really 20x faster than its prior says. Exploration finds out; the planner then
    offloads; what exploring cost stays within 2% of the intercepted time."""
    truth_local, truth_worker = 50e9, 1000e9
    planner = Planner("auto", 1)
    p = planner.profile
    p.local.set_curve("products", "f8", [(1e9, 1e9 / truth_local)])
    p.workers[0].device.prior = {"products": 50.0}  # the wrong prior: the same speed as here
    p.workers[0].link.set_measured(1e-4, 5e9, 5e9)
    call = matmul(1024)  # 2.1 GFLOP: 43 ms here, 2 ms + 5 ms transfers there
    places = []
    for _ in range(600):  # a 2-sigma-pessimistic exploration of a prior-only model waits for its budget
        d = planner.decide(call, READY)
        places.append(d.where)
        if d.where == "local":
            planner.observed_local(call, d, call.flops / truth_local)
        else:
            compute = call.flops / truth_worker
            link = p.workers[0].link.predict(call.bytes_in, call.bytes_out)
            planner.observed_remote(0, call, d, compute + link, compute, call.bytes_in, call.bytes_out)
    assert planner.explored >= 1
    assert places[-50:] == ["worker"] * 50
    assert planner.explore_spent_s <= 0.02 * planner.intercepted_s
    # and the other way: a worker believed fast that is slow is abandoned after few calls
    planner = Planner("auto", 1)
    p = planner.profile
    p.local.set_curve("products", "f8", [(1e9, 1e9 / truth_local)])
    p.workers[0].device.set_curve("products", "f8", [(1e9, 1e9 / 1000e9)])  # believed 20x faster
    p.workers[0].link.set_measured(1e-4, 5e9, 5e9)
    places = []
    for _ in range(100):
        d = planner.decide(call, READY)
        places.append(d.where)
        if d.where == "local":
            planner.observed_local(call, d, call.flops / truth_local)
        else:  # really 5 GFLOP/s
            planner.observed_remote(0, call, d, call.flops / 5e9 + 0.01, call.flops / 5e9, call.bytes_in, call.bytes_out)
    assert places.count("worker") <= 3 and places[-90:] == ["local"] * 90


# -- models -------------------------------------------------------------------------------------------

def test_online_correction_moves_predictions_toward_measurements():
    p = profile()
    call = matmul(1024)
    before = p.local.predict(call.op, call.family, call.dtype, call.flops)[0]
    for _ in range(20):
        p.local.observe(call.op, call.family, call.dtype, call.flops, 1.6 * before)
    after, sigma, n = p.local.predict(call.op, call.family, call.dtype, call.flops)
    assert after == pytest.approx(1.6 * before, rel=0.02) and n == 20 and sigma < 0.1
    # a neighbouring size borrows the offset, with more uncertainty
    near, near_sigma, near_n = p.local.predict(call.op, call.family, call.dtype, call.flops * 8)
    assert near == pytest.approx(1.6 * 8 * before, rel=0.02) and near_n == 0 and near_sigma > sigma


def test_a_model_that_keeps_mispredicting_is_reset_and_reported():
    m = RateModel("local")
    m.set_curve("products", "f8", [(1e9, 0.01)])
    for _ in range(3):
        assert m.observe("numpy.matmul", "products", "f8", 1e9, 0.01) is None
    messages = [m.observe("numpy.matmul", "products", "f8", 1e9, 0.1) for _ in range(3)]
    assert messages[:2] == [None, None]  # errors are counted, not folded in
    assert messages[2] and "reset" in messages[2] and "numpy.matmul" in messages[2]
    assert m.resets == 1
    # relearnt from the next measurement
    assert m.observe("numpy.matmul", "products", "f8", 1e9, 0.1) is None
    assert m.predict("numpy.matmul", "products", "f8", 1e9)[0] == pytest.approx(0.1)


def test_planner_reports_resets():
    events = []
    planner = Planner("auto", 1, on_event=events.append)
    call = matmul(512)
    for seconds in (0.01, 0.01, 0.1, 0.1, 0.1, 0.1):
        planner.observed_local(call, None, seconds)
    assert any("reset" in e for e in events)


def test_learning_never_raises_into_the_program():
    """The planner learns on the program's thread after its call: a bug there (here, a call it
    cannot take) is an event in the report, never an exception, keyword arguments included."""
    events = []
    planner = Planner("auto", 1, on_event=events.append)
    planner.observed_local(matmul(512), None, 0.01, inputs_up=None, unexpected=1)
    planner.observed_remote(0, matmul(512))
    assert len(events) == 2 and all(e.startswith("planner error in observed_") for e in events), events


def test_link_model_learns_bandwidth_and_round_trip():
    link = LinkModel()
    link.set_measured(1e-4, 1e9, 1e9)
    for _ in range(40):  # the real link moves 250 MB/s each way
        link.observe(50e6, 50e6, 1e-4 + 100e6 / 250e6)
    assert link.up_bps == pytest.approx(250e6, rel=0.05)
    messages = [link.observe(100, 100, 1e-3) for _ in range(40)]  # small messages: the round trip is 1 ms
    assert link.rtt == pytest.approx(1e-3, rel=0.05)
    assert link.up_bps == pytest.approx(250e6, rel=0.05)  # the bulk regime is untouched
    assert not any(messages)  # learnt, not reset: it had no samples in that regime yet
    # now the round trip jumps 10x for good: a run of errors resets that regime, then it relearns
    messages = [link.observe(100, 100, 1e-2) for _ in range(80)]
    assert sum(1 for m in messages if m and "round trip" in m) == 1
    assert link.rtt == pytest.approx(1e-2, rel=0.05)


def test_curves_interpolate_and_buckets_are_4x():
    m = RateModel("local")
    m.set_curve("products", "f8", [(1e6, 1e-4), (1e9, 1e-2)])  # 10 GFLOP/s small, 100 large
    assert m.predict("numpy.matmul", "products", "f8", 1e6)[0] == pytest.approx(1e-4)
    assert m.predict("numpy.matmul", "products", "f8", 1e12)[0] == pytest.approx(10.0)  # held at the end
    mid = m.predict("numpy.matmul", "products", "f8", math.sqrt(1e15))[0]
    assert 1e-4 * 10 ** 1.5 / 10 < mid < 1e-4 * 10 ** 1.5
    assert BUCKET == pytest.approx(math.log(4))
    # another op of the family reads the curve with more uncertainty; another dtype scales by speed
    assert m.predict("numpy.linalg.svd", "products", "f8", 1e9)[1] > m.predict("numpy.matmul", "products", "f8", 1e9)[1]
    assert m.predict("numpy.matmul", "products", "f4", 1e9)[0] == pytest.approx(0.5e-2)


# -- floors -------------------------------------------------------------------------------------------

def test_floors_follow_the_models():
    fast = floors(profile(local=100, worker=10_000, rtt=50e-6, bw=20e9), [0])
    slow = floors(profile(local=100, worker=10_000, rtt=5e-3, bw=1e8), [0])
    for op in ("numpy.matmul", "numpy.linalg.solve", "numpy.linalg.svd"):
        assert 0 < fast[op] < slow[op], op
    # on a same-speed worker over a slow link nothing can win: those ops never leave the fast path
    hopeless = floors(profile(local=100, worker=100, rtt=10e-3, bw=12.5e6), [0])
    assert hopeless["numpy.fft.fft"] == NEVER
    # denser ops have lower floors: svd does 13x a matmul's work on half its input
    assert fast["numpy.linalg.svd"] < fast["numpy.matmul"]


def test_ops_computed_together_get_the_floors_each_gets_alone():
    """floors_by_dtype computes ops that would compute alike in a dtype once; an op with measurements
    of its own in one dtype (a decomposition the worker timed in float64, a call measured here) is
    computed apart in that dtype and shares the others."""
    from fusion_shim.catalog import CATALOG
    from fusion_shim.plan.policy import floors_by_dtype

    p = profile(local=100, worker=300, rtt=3e-4, bw=2e9)
    p.workers[0].device.set_op_curve("numpy.linalg.svd", "f8", [(1e8, 1e-3)])  # 100 GFLOP/s there
    p.local.observe("numpy.linalg.qr", "linalg", "c16", 1e9, 1.0)                 # 1 GFLOP/s here
    p.local.observe("numpy.einsum", "products", "f4", 1e9, 0.25)  # 50x under its reading: offsets matmul (D331)
    p.local.observe("numpy.matmul", "products", "f4", 1e9, 1e-4)                  # 10 TFLOP/s here
    ops = {s.name: s.family for s in CATALOG}
    together = floors_by_dtype(p, [0], ops=ops)
    assert together == {op: floors_by_dtype(p, [0], ops={op: family})[op] for op, family in ops.items()}
    # the measured dtypes moved their op's floor away from the ops it otherwise computes with
    assert together["numpy.linalg.svd"]["f8"] != together["numpy.linalg.svdvals"]["f8"]
    assert together["numpy.linalg.svd"]["c16"] == together["numpy.linalg.svdvals"]["c16"]
    assert together["numpy.matmul"]["f4"] != together["numpy.tensordot"]["f4"]
    assert together["numpy.matmul"]["f8"] == together["numpy.tensordot"]["f8"]
    # np.dot has no calls of its own: it is priced off matmul's, the same kernel (model.SAME_KERNEL)
    assert together["numpy.dot"]["f4"] == together["numpy.matmul"]["f4"]
    unmeasured = floors_by_dtype(profile(local=100, worker=300, rtt=3e-4, bw=2e9), [0],
                                 ops={"numpy.linalg.qr": "linalg"})
    assert together["numpy.linalg.qr"]["c16"] != unmeasured["numpy.linalg.qr"]["c16"]
    assert together["numpy.linalg.qr"]["f8"] == unmeasured["numpy.linalg.qr"]["f8"]


def test_planner_publishes_floors_per_op():
    planner = Planner("auto", 1, profile=profile(local=100, worker=10_000, rtt=50e-6, bw=20e9))
    cell = planner.floor_cells["numpy.matmul"]
    assert cell[0] > 0  # the prior floor until the models say more
    planner.worker_ready(0, None, 50e-6, 20e9, 20e9)
    assert cell[0] == floors(planner.profile, [0])["numpy.matmul"]
    assert planner.floor_bytes == min(c[0] for c in planner.floor_cells.values())
    assert Planner("remote", 1).floor_cells["numpy.matmul"][0] == 0  # remote: every call is a candidate


def test_worker_ready_reads_both_benchmark_forms():
    planner = Planner("auto", 1)
    planner.worker_ready(0, {"products": 500.0, "linalg": 50.0, "fft": 20.0}, 1e-4, 1e9, 1e9)
    dev = planner.profile.workers[0].device
    assert dev.predict("numpy.matmul", "products", "f8", 1e9)[0] == pytest.approx(1e9 / 500e9)
    planner = Planner("auto", 1)
    planner.worker_ready(0, {"products": 1.0, "points": {"products/f4": [[1e9, 1e-3], [1e10, 5e-3]]}}, 1e-4, 1e9, 1e9)
    dev = planner.profile.workers[0].device
    assert dev.predict("numpy.matmul", "products", "f4", 1e10)[0] == pytest.approx(5e-3)
    assert planner.profile.workers[0].benchmarked


def test_a_prior_alone_needs_twice_the_margin():
    """A local side known only by its static prior (no curve, no call measured) is trusted at
    Z_PRIOR sigmas: a worker predicted 4x faster is not enough (the linalg prior read eigh 3.5x slow
    on the development machine), 40x is."""
    from fusion_shim.plan.model import PRIOR_GFLOPS

    p = Profile(1)
    p.workers[0].link.set_measured(1e-4, 1e12, 1e12)
    call = Call("numpy.linalg.eigh", "linalg", "f8", 9.0 * 768**3, 8 * 768 * 768, 8 * 768 * 768)
    prior = PRIOR_GFLOPS["linalg"]
    p.workers[0].device.set_curve("linalg", "f8", [(1e9, 1e9 / (4 * prior * 1e9))])  # 4x the prior
    d = decide("auto", call, p, READY)
    assert d.where == "local" and d.local_sigma >= 1.0 and d.remote_s * 3 < d.local_s
    p.workers[0].device.set_curve("linalg", "f8", [(1e9, 1e9 / (40 * prior * 1e9))])
    assert decide("auto", call, p, READY).where == "worker"
    # once this machine has a measured curve the ordinary margin applies: 4x is plenty
    p.workers[0].device.set_curve("linalg", "f8", [(1e9, 1e9 / (4 * prior * 1e9))])
    p.local.set_curve("linalg", "f8", [(1e9, 1e9 / (prior * 1e9))])
    assert decide("auto", call, p, READY).where == "worker"


def test_calls_that_cannot_win_raise_their_ops_floor_until_the_models_change():
    """A same-speed worker on a slow link: the models' floor for matmul is finite (a device priced
    1.5 sigma fast could win on the largest sizes), but calls that could not win even so raise it
    past themselves after HOPELESS_CALLS of them; a refresh from the models drops the raise."""
    from fusion_shim.plan import planner as planner_mod

    events = []
    planner = Planner("auto", 1, profile=profile(local=100, worker=100, rtt=1e-3, bw=1e9), on_event=events.append)
    planner.worker_ready(0, None, 1e-3, 1e9, 1e9)
    cell = planner.floor_cells["numpy.matmul"]
    model_floor = cell[0]
    call = matmul(1024)
    assert model_floor < call.bytes_in < NEVER
    for i in range(planner_mod.HOPELESS_CALLS):
        assert cell[0] == model_floor
        d = planner.decide(call, READY)
        assert d.where == "local" and not d.explore
        planner.observed_local(call, d, call.flops / 100e9)
    assert cell[0] == call.bytes_in + 1 and planner.raised == {"numpy.matmul": call.bytes_in + 1}
    assert planner.floor_bytes <= cell[0] and any("floor of numpy.matmul raised" in e for e in events)
    # a call that could win (a 20x faster worker) is no evidence
    fast = Planner("auto", 1, profile=profile(local=100, worker=2000, rtt=1e-4, bw=1e10))
    fast.worker_ready(0, None, 1e-4, 1e10, 1e10)
    for _ in range(3):  # decided local (say, no budget to explore), yet it could have won
        fast.observed_local(matmul(1024), Decision("local", "test", 0.02, 0.002), 0.02)
    assert fast.raised == {} and fast.floor_cells["numpy.matmul"][0] < matmul(1024).bytes_in
    planner.refresh_floors()  # the models changed (a link measured, a worker back, ...)
    assert cell[0] == model_floor and planner.raised == {}


def test_an_ops_floor_rises_only_as_far_as_every_dtype_it_came_in_has_shown_hopeless():
    """The floor is one number per op. Float64 products that could not win must not raise it past
    float32 ones that pay there (on a slow client, two hopeless float64 matmuls raised @'s floor to
    37.7 MB and hid the 33.5 MB float32 ones the worker ran faster). Once the float32 calls are
    hopeless too, it rises past the smaller of the two."""
    from fusion_shim.plan import planner as planner_mod

    planner = Planner("auto", 1, profile=profile(local=100, worker=100, rtt=1e-3, bw=1e9))
    planner.worker_ready(0, None, 1e-3, 1e9, 1e9)
    device = planner.profile.workers[0].device
    cell = planner.floor_cells["numpy.matmul"]
    model_floor = cell[0]
    f8, f4 = matmul(1536), matmul(2048, "f4", 4)  # 37.7 MB and 33.5 MB of inputs, as in that run
    assert model_floor < f4.bytes_in < f8.bytes_in
    planner.profile.local.set_curve("products", "f4", [(1e9, 1e9 / 100e9)])
    device.set_curve("products", "f4", [(1e9, 1e9 / 5000e9)])  # float32 50x faster there
    assert planner.decide(f4, READY).where == "worker"
    for _ in range(planner_mod.HOPELESS_CALLS + 1):
        d = planner.decide(f8, READY)
        assert d.where == "local" and not d.explore
        planner.observed_local(f8, d, f8.flops / 100e9)
    assert cell[0] < f4.bytes_in and planner.raised == {}  # (the models' floor moved with the curves)
    # an integer product no worker is priced for (here: none offers the kernel) can never be
    # evidence, and does not hold the floor down
    ints = matmul(1024, "i8", 8)
    assert planner.decide(ints, [WorkerState("without-kernel")]).remote_s is None
    # the float32 products turn out slower there too: now the op rises past both
    device.set_curve("products", "f4", [(1e9, 1e9 / 50e9)])
    for _ in range(planner_mod.HOPELESS_CALLS):
        d = planner.decide(f4, READY)
        assert d.where == "local" and not d.explore
        planner.observed_local(f4, d, f4.flops / 100e9)
    assert cell[0] == f4.bytes_in + 1 and planner.raised == {"numpy.matmul": f4.bytes_in + 1}


def test_an_ops_first_measurements_here_move_its_floor_as_a_full_refresh_would(monkeypatch):
    """After each of an op's first measurements here its floor is recomputed inline, for the dtype
    measured alone (the others' bounds are kept): the same floor a refresh of every dtype gives."""
    from fusion_shim.plan import planner as planner_mod
    from fusion_shim.plan import policy

    planner = Planner("auto", 1, profile=profile(local=100, worker=300, rtt=3e-4, bw=2e9))
    planner.worker_ready(0, None, 3e-4, 2e9, 2e9)
    asked = []
    monkeypatch.setattr(planner_mod, "floors_by_dtype",
                        lambda *a, **k: asked.append(k.get("dtypes")) or policy.floors_by_dtype(*a, **k))
    for op, family in {"numpy.matmul": "products", "numpy.linalg.svd": "linalg", "numpy.fft.fft": "fft"}.items():
        start = planner.floor_cells[op][0]
        # complex calls far slower here than the models say, float64 ones far faster, an integer one
        for dtype, seconds in (("c16", 9.0), ("f8", 1e-4), ("c16", 8.0), ("i8", 1.0)):
            call = Call(op, family, dtype, 2.0 * 512**3, 8 * 512 * 512, 8 * 512 * 512)
            planner.observed_local(call, None, seconds)
            whole = policy.floors_by_dtype(planner.profile, [0], ops={op: family})[op]
            assert planner.floor_cells[op][0] == min(whole.values())
        assert planner.floor_cells[op][0] != start  # the measurements moved it
    # one dtype at a time; nothing for a dtype no floor is made for (i8)
    assert asked == [("c16",), ("f8",), ("c16",)] * 3


def test_no_exploration_against_a_local_prior():
    """Explorations are charged against the local prediction: against a mere prior (which read
    decompositions 3.5x slow here) they look free. The call runs here first and measures it."""
    p = Profile(1)
    p.workers[0].link.set_measured(1e-4, 1e10, 1e10)
    p.workers[0].device.set_curve("linalg", "f8", [(1e9, 1e9 / 20e9)])  # benchmarked, 2x the local prior
    call = Call("numpy.linalg.eigh", "linalg", "f8", 9.0 * 768**3, 8 * 768 * 768, 8 * 768 * 768)
    d = decide("auto", call, p, READY, explore_left_s=10.0)
    assert d.where == "local" and not d.explore and d.local_sigma >= 1.0
    p.local.observe(call.op, call.family, call.dtype, call.flops, call.flops / 10e9)  # measured: as the prior said
    d = decide("auto", call, p, READY, explore_left_s=10.0)
    assert d.where == "worker" and d.explore  # now it may be tried there


def test_an_op_without_calls_of_its_own_is_priced_off_another_name_for_the_same_kernel():
    """A cold start (no calibration curve here): np.dot of two 2-D arrays is the matmul kernel, so
    once a matmul of that size and dtype has been measured its first call is priced off it, not off
    the static prior trusted at 2 sigma. The slow client's case: 2048^2 float32, 172 ms here, the
    worker benchmarked at 107 ms."""
    n = 2048
    flops = 2.0 * n**3
    dot = Call("numpy.dot", "products", "f4", flops, 2 * 4 * n * n, 4 * n * n)
    p = Profile(1)
    p.workers[0].link.set_measured(1e-4, 2e9, 2e9)
    p.workers[0].device.set_curve("products", "f4", [(flops, 0.107 - 3 * 4 * n * n / 2e9)])
    assert decide("auto", dot, p, READY).where == "local"  # the prior alone: twice the margin
    p.local.observe("numpy.matmul", "products", "f4", flops, 0.172)
    seconds, sigma, n_own = p.local.predict("numpy.dot", "products", "f4", flops)
    assert seconds == pytest.approx(0.172) and sigma < 0.5 and n_own == 0
    d = decide("auto", dot, p, READY)
    assert d.where == "worker" and not d.explore, d.reason
    # not across dtypes, nor to an op that is another loop (tensordot reshapes and copies first)
    assert p.local.predict("numpy.dot", "products", "f8", flops)[1] >= 1.0
    # (D331: tensordot reads the prior at the family's measured offset, as uncertain as another op's curve)
    assert p.local.predict("numpy.tensordot", "products", "f4", flops)[1] == SIGMA_CURVE + SIGMA_OTHER
    # a bucket a few sizes away lends less certainty, as one of the op's own would
    assert p.local.predict("numpy.dot", "products", "f4", flops / 64)[1] > sigma
    # once it has calls of its own, they decide
    p.local.observe("numpy.dot", "products", "f4", flops, 0.5)
    assert p.local.predict("numpy.dot", "products", "f4", flops)[0] == pytest.approx(0.5)
    assert p.local.predict("numpy.matmul", "products", "f4", flops)[0] == pytest.approx(0.172)


def test_a_workers_drift_from_its_self_benchmark_is_learnt_across_ops():
    """A worker's self-benchmark runs with the machine to itself; beside a program using BLAS on the
    same cores its kernels took twice as long. The first call of each op and size measures how far
    its real calls are from the curves, and predictions read off a curve for ops it has not run yet
    follow; an op's own measured calls are not moved, nor is the local model."""
    worker = Profile().workers[0].device
    assert worker.learn_drift and not Profile().local.learn_drift
    for op in ("numpy.linalg.svd", "numpy.linalg.qr", "numpy.linalg.eigh"):
        worker.set_op_curve(op, "f8", [(1e8, 1e-2), (1e10, 0.5)])
    worker.set_curve("linalg", "f8", [(1e8, 1e-2)])
    qr_before = worker.predict("numpy.linalg.qr", "linalg", "f8", 1e9)[0]
    worker.observe("numpy.linalg.svd", "linalg", "f8", 1e9, 2 * worker.predict("numpy.linalg.svd", "linalg", "f8", 1e9)[0])
    assert worker.drift == pytest.approx(-math.log(2))  # in log rate: half as fast
    assert worker.predict("numpy.linalg.qr", "linalg", "f8", 1e9)[0] == pytest.approx(2 * qr_before)
    assert worker.predict("numpy.linalg.solve", "linalg", "f8", 1e8)[0] == pytest.approx(2e-2)  # its family's curve too
    # the op it measured keeps its own measurement; a second call of it at that size says nothing of the drift
    svd = worker.predict("numpy.linalg.svd", "linalg", "f8", 1e9)[0]
    worker.observe("numpy.linalg.svd", "linalg", "f8", 1e9, svd)
    assert worker.drift_n == 1 and worker.predict("numpy.linalg.svd", "linalg", "f8", 1e9)[0] == pytest.approx(svd)
    # a lower bound from a call out of its deadline is no evidence of drift; neither is a prior
    worker.observe("numpy.linalg.eigh", "linalg", "f8", 1e9, 100.0, force=True)
    worker.observe("numpy.fft.fft", "fft", "c16", 1e9, 100.0)  # no fft curve: read off the prior
    assert worker.drift_n == 1
    # the local model learns its ops' own rates but has no drift
    local = Profile().local
    local.set_curve("linalg", "f8", [(1e8, 1e-2)])
    local.observe("numpy.linalg.solve", "linalg", "f8", 1e8, 5e-2)
    assert local.drift == 0.0 and local.predict("numpy.linalg.inv", "linalg", "f8", 1e8)[0] == pytest.approx(1e-2)


def test_an_op_timed_at_one_size_follows_its_familys_curve_elsewhere():
    """A worker times each decomposition at one size; elsewhere the op keeps its offset from the
    family's curve (rates grow with size: held flat, a qr of 768 was priced at the rate of one of 384)."""
    dev = RateModel("worker 0")
    dev.set_curve("linalg", "f8", [(1e8, 1e8 / 10e9), (1e9, 1e9 / 40e9)])   # 10, then 40 GFLOP/s
    dev.set_op_curve("numpy.linalg.qr", "f8", [(1e8, 1e8 / 5e9)])          # qr at half solve's rate there
    assert dev.predict("numpy.linalg.qr", "linalg", "f8", 1e8)[0] == pytest.approx(1e8 / 5e9)
    assert dev.predict("numpy.linalg.qr", "linalg", "f8", 1e9)[0] == pytest.approx(1e9 / 20e9)
    # without a family curve, its own points alone
    alone = RateModel("worker 1")
    alone.set_op_curve("numpy.linalg.qr", "f8", [(1e8, 1e8 / 5e9)])
    assert alone.predict("numpy.linalg.qr", "linalg", "f8", 1e9)[0] == pytest.approx(1e9 / 5e9)
    # read far from where it was timed, less certain
    assert dev.predict("numpy.linalg.qr", "linalg", "f8", 1e11)[1] > dev.predict("numpy.linalg.qr", "linalg", "f8", 1e8)[1]


def test_a_links_bulk_probe_is_wanted_only_where_a_free_link_could_change_the_decision():
    """A link's bandwidth is measured (a bulk probe, 4-8% of a 0.35 s program on a same-host worker)
    only for a call a worker would get or explore were its bytes free to move: the transfer is then
    all that stands between the worker and the call."""
    # a worker 10x faster, over a link not yet measured and priced slow: kept here for the link alone
    p = profile(local=100, worker=1000, bw=1e8, measured=False)
    call = matmul(1024)
    planner = Planner("auto", profile=p)
    assert planner.decide(call, READY).where == "local"
    assert planner.link_could_matter(call, READY)
    # the same speed there as here: no link, however fast, makes the worker worth it
    same = Planner("auto", profile=profile(local=100, worker=100, bw=1e8, measured=False))
    assert not same.link_could_matter(call, READY)
    # a worker that is not ready, or policy local: nothing to measure for
    assert not planner.link_could_matter(call, [WorkerState("warming")])
    assert not Planner("local", profile=p).link_could_matter(call, READY)


def test_a_worker_contended_by_the_programs_blas_needs_a_wider_margin_until_the_op_has_run_there():
    """Read off a benchmark the worker ran with the machine to itself, a same-host CPU worker beside
    the program's BLAS threads took 1-30x that (an svd benchmarked at 23 ms took 117 ms): a call it is
    predicted to win by 2x goes there only once calls there say so."""
    call = matmul(1024)
    p = profile(local=100, worker=400, bw=1e12)   # flat curves: the worker predicted ~4x faster
    assert decide("auto", call, p, READY).where == "worker"
    p = profile(local=100, worker=200, bw=1e12)   # 2x: enough on its own, not beside the program's BLAS
    shared = [WorkerState("ready", contended=True)]
    assert decide("auto", call, p, READY).where == "worker"
    d = decide("auto", call, p, shared)
    assert d.where == "local" and not d.explore
    other = Call("numpy.dot", "products", "f8", call.flops, call.bytes_in, call.bytes_out)
    assert decide("auto", other, p, shared).where == "local"
    for _ in range(3):  # its own calls there, as predicted
        p.workers[0].device.observe(call.op, call.family, call.dtype, call.flops, call.flops / 200e9)
    assert decide("auto", call, p, shared).where == "worker"
    # and the drift those calls measured (none here) now stands for the other ops' curves too
    assert p.workers[0].device.drift_n and decide("auto", other, p, shared).where == "worker"

"""The replay's device and link models: times from datasheet figures and efficiency curves."""
from __future__ import annotations

import math

import pytest

from fusion_shim.replay import hardware


def test_a_gemm_takes_its_flops_over_peak_times_efficiency_plus_one_launch():
    dev = hardware.device("h100-sxm", {})
    flops = 1e12  # past the curve's last point: efficiency held at 0.85
    expected = 5e-6 + flops / (67e12 * 0.85)
    assert dev.compute_s("numpy.matmul", "products", "f8", flops, 3 * 8 * 10_000**2) == pytest.approx(expected)


def test_a_gemm_between_curve_points_is_interpolated_in_log_flops():
    dev = hardware.device("h100-sxm", {})
    eff = 0.15 + (0.6 - 0.15) * 0.5  # halfway between 1e8 and 1e10
    assert dev.compute_s("numpy.matmul", "products", "f8", 1e9, 0) == pytest.approx(5e-6 + 1e9 / (67e12 * eff))


def test_a_memory_bound_call_takes_its_bytes_over_the_bandwidth():
    dev = hardware.device("l4", {})
    nbytes = 3e9
    got = dev.compute_s("numpy.fft.fft", "fft", "c8", 1e6, nbytes)
    assert got == pytest.approx(2 * 5e-6 + nbytes / 300e9)


def test_svd_is_priced_far_from_peak():
    dev = hardware.device("h200", {})
    gemm = dev.compute_s("numpy.matmul", "products", "f8", 1e11, 0)
    svd = dev.compute_s("numpy.linalg.svd", "linalg", "f8", 1e11, 0)
    assert svd > 10 * gemm


def test_a_link_transfer_is_overhead_round_trip_and_bytes_over_bandwidth():
    link = hardware.link("10gbe", {})
    assert link.transfer_s(1.17e9, 1.17e8) == pytest.approx(50e-6 + 100e-6 + 1.0 + 0.1)
    wan = hardware.link("wan", {})
    assert wan.transfer_s(12.5e6, 0) == pytest.approx(50e-6 + 20e-3 + 1.0)


def test_loopback_fits_per_call_cost_and_bandwidth_to_the_recorded_worker_calls():
    recs = [{"kind": "worker", "phases": {"kernel": 0.01}, "bytes_sent": b, "bytes_received": 0,
             "wall_s": 0.01 + 300e-6 + b / 1e9} for b in (1e5, 1e6, 4e6, 8e6)]
    link = hardware.loopback({"worker": {"info": {"link": {"rtt_s": 100e-6}}}, "records": recs})
    assert link.up_bps == pytest.approx(1e9)
    assert link.per_call_s + link.rtt_s == pytest.approx(300e-6)


def test_the_cpu_worker_is_its_own_self_benchmark():
    report = {"worker": {"info": {"bench": {"points": {"products/f8": [[1e6, 1e-4], [1e8, 1e-3]]}}}}}
    dev = hardware.device("cpu-worker", report)
    assert dev.compute_s("numpy.matmul", "products", "f8", 1e8, 0) == pytest.approx(1e-3)
    assert dev.compute_s("numpy.matmul", "products", "f8", 1e7, 0) == pytest.approx(1e7 / math.sqrt(1e10 * 1e11))


def test_a_user_toml_adds_a_device_and_unknown_names_list_the_known(tmp_path):
    path = tmp_path / "dev.toml"
    path.write_text('[mygpu]\npeak = {f8 = 1e13}\nmem_bps = 1e12\nmemory = 1e10\nlaunch_s = 1e-5\n'
                    'cold_start_s = 3.0\nsource = "mine"\n')
    dev = hardware.device("mygpu", {}, str(path))
    assert dev.compute_s("numpy.matmul", "products", "f8", 1e12, 0) == pytest.approx(1e-5 + 1e12 / (1e13 * 0.85))
    with pytest.raises(ValueError, match="h100-sxm"):
        hardware.device("nope", {})


def test_the_tables_hold_every_named_device_and_link():
    for name in ("h200", "h100-sxm", "h100-pcie", "a100", "l4", "rtx5090"):
        dev = hardware.device(name, {})
        assert dev.peak["f8"] > 0 and dev.mem_bps > 0 and dev.source and dev.noise > 0
    for name in ("pcie4", "pcie4-pageable", "pcie5", "pcie5-pageable", "nvlink-c2c", "100gbe", "25gbe", "10gbe",
                 "1gbe", "wan"):
        assert hardware.link(name, {}).source
    assert hardware.link("pcie4-pageable", {}).up_bps < hardware.link("pcie4", {}).up_bps


def test_the_rtx5090_is_fast_in_fp32_and_slow_in_fp64():
    dev = hardware.device("rtx5090", {})
    f8 = dev.compute_s("numpy.matmul", "products", "f8", 1e12, 0)
    f4 = dev.compute_s("numpy.matmul", "products", "f4", 1e12, 0)
    assert f8 == pytest.approx(5e-6 + 1e12 / (1.64e12 * 0.85)) and f8 > 50 * f4


def test_nvlink_c2c_moves_a_gigabyte_in_a_few_milliseconds():
    link = hardware.link("nvlink-c2c", {})
    assert link.transfer_s(1e9, 0) == pytest.approx(50e-6 + 5e-6 + 1e9 / 450e9)


def test_the_cpu_worker_prices_an_op_at_its_kernels_measured_in_the_recorded_run():
    bench = {"points": {"products/f8": [[1e6, 1e-4], [1e8, 1e-3]]}}
    recs = [{"kind": "worker", "op": "numpy.matmul", "cdtype": "f8", "flops": 1e8, "phases": {"kernel": s}}
            for s in (3e-3, 2e-3, 2.5e-3)]
    dev = hardware.device("cpu-worker", {"worker": {"info": {"bench": bench}}, "records": recs})
    assert dev.compute_s("numpy.matmul", "products", "f8", 1e8, 0) == pytest.approx(2.5e-3)  # the median
    assert dev.compute_s("numpy.dot", "products", "f8", 1e8, 0) == pytest.approx(1e-3)  # no kernel: its benchmark
    assert dev.bench()["points"] == bench["points"] and not dev.bench()["ops"]  # what the planner is told


def test_loopback_fits_each_way_and_a_size_seen_once_sets_no_rate():
    def rec(up, down, wall):
        return {"kind": "worker", "phases": {"kernel": 0.01}, "bytes_sent": up, "bytes_received": down,
                "wall_s": 0.01 + wall}
    recs = [rec(1e6, 0, 400e-6 + 1e6 / 2e9) for _ in range(3)] + [rec(1e6, 1e6, 400e-6 + 1e6 / 2e9 + 1e6 / 5e8)
                                                                  for _ in range(3)]
    recs += [rec(1e4, 0, 400e-6 + 1e4 / 2e9) for _ in range(3)] + [rec(2e7, 1e6, 0.1)]  # a slow first upload
    link = hardware.loopback({"worker": {"info": {"link": {"rtt_s": 100e-6}}}, "records": recs})
    assert link.up_bps == pytest.approx(2e9) and link.down_bps == pytest.approx(5e8)
    assert link.per_call_s + link.rtt_s == pytest.approx(400e-6)


def test_loopback_calls_that_cannot_tell_cost_from_rate_take_the_probes_rates_and_their_mean_cost():
    # two sizes, the larger far slower than its bytes explain (a loaded host): a straight line
    # through them would cost less than nothing per call
    recs = [{"kind": "worker", "phases": {"kernel": 0.01}, "bytes_sent": 1e6, "bytes_received": d,
             "wall_s": 0.01 + (0.001 if d == 0 else 0.02)} for d in (0, 1e6) for _ in range(4)]
    probe = {"rtt_s": 100e-6, "up_bytes_per_s": 2e9, "down_bytes_per_s": 4e9}
    link = hardware.loopback({"worker": {"info": {"link": probe}}, "records": recs})
    assert (link.up_bps, link.down_bps) == (2e9, 4e9)
    mean = (0.001 + 0.02) / 2 - 1e6 / 2e9 - 0.5 * 1e6 / 4e9
    assert link.per_call_s + link.rtt_s == pytest.approx(mean)


def test_the_loopback_link_tells_the_planner_what_the_recorded_probe_measured():
    # calls that cost 20 ms each beyond their bytes (a loaded host): priced so, yet the planner is
    # told at connect only what the run's probe measured, as the live one was
    recs = [{"kind": "worker", "phases": {"kernel": 0.01}, "bytes_sent": b, "bytes_received": 0,
             "wall_s": 0.01 + 0.02 + b / 1e9} for b in (1e5, 1e6, 4e6, 8e6)]
    link = hardware.loopback({"worker": {"info": {"link": {"rtt_s": 100e-6, "up_bytes_per_s": 3e9}}},
                              "records": recs})
    assert link.per_call_s + link.rtt_s == pytest.approx(0.02)
    assert link.probe() == (100e-6, 3e9, None)
    pcie = hardware.link("pcie5", {})
    assert pcie.probe() == (pcie.rtt_s + pcie.per_call_s, pcie.up_bps, pcie.down_bps)

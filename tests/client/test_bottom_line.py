"""The report's bottom line against running plainly: a point and an interval built from the run's own
measurements (D275-D277), on records made by hand."""
import math

import pytest

from fusion_shim.reporting.bottom import added_time, detail, plain_words


def here(pred: float, actual: float, family: str = "products") -> dict:
    """A call run here whose NumPy time was measured against the local model's prediction."""
    return {"kind": "local", "family": family, "op": "numpy.matmul", "site": "a.py:1", "wall_s": actual,
            "phases": {"local": actual}, "predicted_local_s": pred}


def worker(spent: float, pred: float | None, measured: float | None = None, family: str = "products",
           site: str = "a.py:2") -> dict:
    return {"kind": "worker", "family": family, "op": "numpy.matmul", "site": site, "wall_s": spent,
            "phases": {"kernel": spent}, "predicted_local_s": pred, "local_measured_s": measured}


def contains_point(added: dict) -> bool:
    return added["low_s"] <= added["added_s"] <= added["high_s"]


def test_no_saving_is_claimed_beyond_the_runs_own_wall_time():
    # 101 worker calls priced at 10.5 s each by a model measured (on small calls) as exact: a
    # "1,042 s saving" in a 24.4 s run
    records = [here(0.01, 0.01)] * 3 + [worker(0.2, 10.5)] * 101
    added = added_time(records, {}, {}, wall_s=24.4)
    assert added["evidence"]["uncapped_point_s"] < -1000
    assert added["low_s"] == -24.4 and added["added_s"] >= -24.4 and added["capped_at_wall"]
    # bounds that claim the impossible price nothing: each call cost NumPy from 0 up
    assert added["high_s"] == pytest.approx(101 * 0.2) and added["verdict"] == "cannot tell"
    assert contains_point(added)


def test_a_call_whose_local_time_was_never_measured_is_priced_by_the_model_with_its_measured_error():
    # the model's ratios measured here: x1, x2, x4 (median x2)
    records = [here(1.0, 1.0), here(1.0, 2.0), here(1.0, 4.0), worker(0.5, 1.0)]
    added = added_time(records, {}, {}, wall_s=100.0)
    assert added["parts_s"]["worker_calls_s"] == pytest.approx(0.5 - 2.0)
    assert added["low_s"] == pytest.approx(0.5 - 4.0) and added["high_s"] == pytest.approx(0.5 - 1.0)
    assert added["evidence"]["model_error"]["products"] == {"calls": 3, "low": 1.0, "median": 2.0, "high": 4.0}
    assert added["verdict"] == "faster" and contains_point(added)


def test_another_familys_error_prices_a_family_never_measured():
    records = [here(1.0, 1.0, "fft"), here(1.0, 2.0, "fft"), here(1.0, 3.0, "fft"), worker(0.5, 1.0)]
    added = added_time(records, {}, {}, wall_s=100.0)
    assert added["evidence"]["model_error"]["*"]["calls"] == 3
    assert added["low_s"] == pytest.approx(0.5 - 3.0) and added["high_s"] == pytest.approx(0.5 - 1.0)


def test_a_model_never_measured_here_gives_no_bound_below_and_the_line_says_it_cannot_tell():
    added = added_time([worker(0.5, 2.3), worker(0.4, 2.0)], {"wait_ready": 0.3}, {"launcher": 0.1}, wall_s=3.0)
    assert added["low_s"] == -3.0 and added["high_s"] == pytest.approx(0.5 + 0.4 + 0.3 + 0.1)
    assert added["verdict"] == "cannot tell" and added["evidence"]["model_unmeasured_calls"] == 2
    line = plain_words(2, 2, added, "remote")
    assert "cannot tell against running plainly (between -3.0 s and +1.3 s)" in line, line
    assert "never measured" in line and "faster than running plainly" not in line


def test_without_the_runs_wall_time_an_unmeasured_model_bounds_no_saving():
    added = added_time([worker(0.5, 2.3)], {}, {})
    assert added["low_s"] == -math.inf and contains_point(added)
    assert "any saving" in plain_words(1, 1, added, "auto")


@pytest.mark.parametrize("records,wall", [
    ([here(1.0, 1.0)] * 3 + [worker(0.5, 1.0)], 10.0),
    ([here(1.0, 0.2), here(1.0, 0.3), here(1.0, 5.0), worker(3.0, 1.0)], 10.0),
    ([worker(0.5, 900.0)], 2.0),
    ([worker(0.5, None), worker(1.0, 0.5, measured=0.2)], 5.0),
])
def test_the_interval_contains_the_point_estimate(records, wall):
    added = added_time(records, {"wait_ready": 0.2}, {"launcher": 0.05}, wall_s=wall)
    assert contains_point(added), added


def test_worker_calls_slower_than_numpy_are_reported_slower_even_where_the_raw_prediction_says_faster():
    # the model predicts 2.0 s for the worker's calls; measured here it overestimates NumPy 4x-5x, so
    # each 1.0 s worker call cost about 0.5 s of NumPy: a loss, not the raw prediction's saving
    records = [here(1.0, 0.2), here(1.0, 0.25), here(1.0, 0.22)] + [worker(1.0, 2.0)] * 5
    added = added_time(records, {}, {}, wall_s=20.0)
    assert added["added_s"] > 0 and added["low_s"] > 0 and added["verdict"] == "slower", added
    assert " slower than running plainly" in plain_words(5, 8, added, "auto")


def test_checked_worker_calls_slower_than_numpy_give_a_measured_loss():
    added = added_time([worker(1.0, 5.0, measured=0.4)] * 3, {}, {}, wall_s=10.0)
    assert added["low_s"] == pytest.approx(added["high_s"]) == pytest.approx(1.8)
    assert added["verdict"] == "slower" and added["measured_s"] == pytest.approx(1.8)


def test_a_same_host_workers_cpu_time_widens_the_interval_upward():
    records = [worker(0.5, 1.0, measured=0.4)]
    emb = {"embedded": True, "cpu_s": 2.5, "info": {"pid": 1}}
    added = added_time(records, {}, {}, wall_s=4.0, worker=emb)
    assert added["low_s"] == pytest.approx(0.1) and added["high_s"] == pytest.approx(0.1 + 2.5)
    assert added["evidence"]["same_host_load_up_to_s"] == pytest.approx(2.5)
    # never more than the run's time outside the worker's calls
    assert added_time(records, {}, {}, wall_s=1.5, worker=emb)["high_s"] == pytest.approx(0.1 + 1.0)


def test_a_kept_record_stands_for_its_sites_calls_of_its_kind():
    records = [worker(1.0, 5.0, measured=0.5)] * 2
    sites = {"a.py:2 numpy.matmul": {"calls": 10, "worker": 8}}
    added = added_time(records, {}, {}, wall_s=100.0, sites=sites)
    assert added["parts_s"]["worker_calls_s"] == pytest.approx(8 * 0.5)


def test_the_detail_line_gives_the_interval_and_the_models_measured_error():
    records = [here(1.0, 1.0), here(1.0, 2.0), here(1.0, 4.0), worker(0.5, 1.0)]
    line = detail(added_time(records, {}, {}, wall_s=100.0))
    assert "interval -3.5 s .. -500.0 ms" in line and "products x1.00..x4.00 over 3 calls" in line, line


def test_the_detail_line_says_the_reports_own_making_and_the_workers_stop_are_not_counted():
    line = detail(added_time([worker(0.5, 1.0)], {}, {}, wall_s=10.0))
    tail = line.partition("; not counted: ")[2]
    assert "the interpreter's start and exit" in tail, line
    assert "making and writing this report, and stopping the worker after it" in tail, line


def test_a_summary_saved_before_the_interval_still_reads():
    old = {"added_s": 1.2, "measured_s": 1.2, "estimated_s": 0.0, "parts_s": dict.fromkeys(
        ("waiting_for_worker_s", "calls_run_here_s", "worker_calls_s", "checks_s", "startup_s"), 0.24),
        "worker_calls_measured": 0, "worker_calls_estimated": 0, "calls_unpriced": 0, "not_counted": []}
    assert "against all-local: +1.2 s" in detail(old)
    assert plain_words(1, 1, old, "auto") == "offloaded 1 of 1 calls; about +1.2 s against running plainly"


def test_the_time_this_run_waited_for_a_cpu_widens_the_interval_both_ways_but_not_the_verdict():
    records = [worker(1.0, 5.0, measured=0.4)] * 3
    added = added_time(records, {}, {}, wall_s=10.0, machine_wait_s=2.0)
    assert added["low_s"] == pytest.approx(1.8 - 2.0) and added["high_s"] == pytest.approx(1.8 + 2.0)
    assert added["shim_low_s"] == pytest.approx(1.8) and added["verdict"] == "slower" and contains_point(added)
    assert "2.0 s waiting for a CPU" in plain_words(3, 3, added, "auto")


def test_the_report_reads_how_long_this_process_waited_for_a_cpu():
    from fusion_shim.reporting.bottom import machine_wait_s

    wait = machine_wait_s()
    assert wait is None or wait >= 0.0

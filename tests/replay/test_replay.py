"""The replay: auto is the real planner, the recording is bounded, the command prints SIMULATED tables."""
from __future__ import annotations

import json

import numpy as np
import pytest

import fusion_shim
from fusion_shim import ledger as ledger_mod
from fusion_shim.ledger import Buffers, Ledger, Record
from fusion_shim.plan import Call, WorkerState
from fusion_shim.replay import command, hardware, simulate

from tests.helpers.shims import installed


def _steps():
    """A program whose small calls stay here and whose big products reuse one matrix."""
    steps = []
    for i in range(30):
        n = 64 if i % 3 else 2048
        call = Call("numpy.matmul", "products", "f8", 2.0 * n**3, 2 * n * n * 8, n * n * 8)
        steps.append(simulate.Step(i, "p.py:3", "numpy.matmul", call, 2.0 * n**3 / 20e9, 1e-4,
                                   [(1, n * n * 8), (100 + i, n * n * 8)], [(1000 + i, n * n * 8)], 1.0))
    return steps


def test_auto_in_a_replay_decides_as_a_live_planner_fed_the_same_times():
    dev, link = hardware.device("h100-sxm", {}), hardware.link("pcie5", {})
    steps = _steps()
    seen = []
    out = simulate.run_auto(steps, dev, link, on_decision=lambda call, d: seen.append((call, d)))
    # the same planner class, driven by hand with the times the replay fed it
    live = simulate.make_planner({"numpy.matmul": "products"}, simulate.RecordedCalibration(steps))
    live.worker_ready(0, dev.bench(), link.rtt_s + link.per_call_s, link.up_bps, link.down_bps)
    sim = simulate.WorkerSim(dev.memory / 2)
    mine = []
    for st in steps:
        if st.call.bytes_in < live.floor_cells[st.call.op][0]:
            continue
        priced, reused = sim.priced_up(st)
        d = live.decide(st.call, [WorkerState("ready", bytes_in=priced, reused=reused)])
        sim.note(st)
        mine.append((st.call, d))
        if d.where == "worker":
            up = sim.up(st)
            seconds, kernel = simulate.remote_s(st, dev, link, up, sim)
            sim.ran(st)
            live.observed_remote(0, st.call, d, seconds, kernel, up, st.call.bytes_out)
        else:
            live.observed_local(st.call, d, st.local_s)
    assert [(c, d.where, d.reason) for c, d in seen] == [(c, d.where, d.reason) for c, d in mine]
    assert "worker" in out.where and "local" in out.where  # the big products move, the small ones stay


def test_the_oracle_is_never_slower_than_either_fixed_policy():
    dev, link = hardware.device("l4", {}), hardware.link("1gbe", {})
    steps = _steps()
    remote = simulate.run_fixed(steps, dev, link, "remote")
    local = simulate.run_fixed(steps, dev, link, "local")
    oracle = simulate.run_oracle(steps, remote)
    assert oracle.total(steps) <= min(local.total(steps), remote.total(steps)) + 1e-12


def test_a_reused_input_is_uploaded_once():
    dev, link = hardware.device("h100-sxm", {}), hardware.link("pcie5", {})
    steps = [s for s in _steps() if s.call.flops > 1e9]
    remote = simulate.run_fixed(steps, dev, link, "remote")
    n_bytes = 2048 * 2048 * 8
    assert remote.up == n_bytes * (len(steps) + 1)  # the shared matrix once, each other input once


def test_the_replay_prices_reuse_as_the_client_does_only_at_a_recurring_site():
    """D349, as residency.Reuse: a matrix passed by two lines once each is priced in full; passed
    again by a line that passed it, its upload is split over the calls seen."""
    n = 2048 * 2048 * 8
    call = Call("numpy.matmul", "products", "f8", 2.0 * 2048**3, 2 * n, n)

    def step(i, site):
        return simulate.Step(i, site, "numpy.matmul", call, 0.1, 0.0, [(1, n), (100 + i, n)], [(1000 + i, n)], 1.0)

    sim = simulate.WorkerSim(1e12)
    sim.note(step(0, "p.py:1"))
    assert sim.priced_up(step(1, "p.py:2")) == (2 * n, 0)
    sim.note(step(1, "p.py:2"))
    assert sim.priced_up(step(2, "p.py:1")) == (n // 3 + n, n)


def test_buffers_give_a_live_array_one_token_and_each_result_a_new_one():
    buffers = Buffers()
    a, b = np.ones((4, 4)), np.ones((4, 4))
    _, ins, outs = buffers.trace((a, b), {"axis": 1}, a @ b)
    params, ins2, _ = buffers.trace((a, a[:2]), {}, None)
    assert ins2[0] == ins[0] and ins2[1] != ins[0] and outs[0] not in ins
    assert params == {}
    p, _, _ = buffers.trace((a,), {"axis": 1, "norm": "ortho"}, None)
    assert p == {"axis": 1, "norm": "ortho"}


def test_the_recording_keeps_a_sample_per_site_and_says_so(monkeypatch):
    monkeypatch.setattr(ledger_mod, "MAX_PER_SITE", 5)
    led = Ledger(trace_io=True)
    for i in range(8):
        led.add(Record("numpy.matmul", "products", site="a.py:1", kind="local", wall_s=1e-3, start_s=i * 1e-2,
                       phases={"local": 1e-3}, cdtype="f8", flops=1e6, bytes_in=1000, bytes_out=500))
    snap = led.snapshot()
    assert len(snap["records"]) == 5 and snap["sample"]["dropped"] == 3 and snap["sample"]["traced"]
    steps, sample = simulate.steps_of(snap)
    assert all(s.scale == 8 / 5 for s in steps) and sample["scaled_sites"] == 5


def test_the_command_prints_simulated_tables_for_a_recorded_run(inproc_worker, tmp_path, capsys):
    rng = np.random.default_rng(3)
    with installed(inproc_worker, report=str(tmp_path / "run.json"), timeout=30.0):
        a = rng.standard_normal((300, 300))
        for _ in range(4):
            a = np.tanh(a @ a) / 10
        np.linalg.svd(a)
        rep = fusion_shim.report(format="json")
    recs = [r for r in rep["records"] if r["op"].endswith("matmul") or r["op"].endswith("__matmul__")]
    assert recs and all(r["flops"] and r["inputs"] and r["results"] for r in recs)
    assert recs[0]["inputs"][0] == recs[0]["inputs"][1]  # a @ a: one buffer, one token
    assert recs[1]["inputs"][0] not in recs[0]["inputs"]  # a new array: a new token
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(rep, default=str))
    assert command.main([str(path), "--device", "h100-sxm", "--link", "10gbe"]) == 0
    text = capsys.readouterr().out
    heads = [ln for ln in text.splitlines() if "ms" in ln]
    assert heads and all("SIMULATED" in ln for ln in heads)
    for name in ("all-local", "all-remote", "auto (the planner)", "oracle", "assumptions"):
        assert name in text
    assert command.main([str(path), "--device", "cpu-worker", "--link", "loopback", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["label"] == "SIMULATED" and set(got["totals_s"]) == {"local", "remote", "auto", "oracle"}


def test_a_report_without_the_recording_fields_is_refused(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"records": [{"op": "numpy.matmul", "family": "products", "site": "x",
                                             "phases": {"local": 1e-3}, "wall_s": 1e-3}]}))
    assert command.main([str(path), "--device", "l4", "--link", "wan"]) == 2
    assert "record it again" in capsys.readouterr().err


def test_an_array_like_the_recording_cannot_read_is_an_event_never_an_exception():
    class Odd:
        @property
        def __array_interface__(self):
            raise RuntimeError("no")

    led = Ledger(trace_io=True)
    rec = Record("numpy.matmul", "products")
    led.trace_io(rec, (Odd(),), {}, None)
    assert rec.inputs is None and "not traced" in led.events[-1][1]


def test_a_class_and_dtype_the_self_benchmark_did_not_run_pays_its_warm_up_once():
    dev, link = hardware.device("h200", {}), hardware.link("pcie5", {})
    call = Call("numpy.linalg.svd", "linalg", "f4", 1e9, 4 << 20, 4 << 20)
    steps = [simulate.Step(i, "s.py:1", call.op, call, 0.1, 0.0, [(i, 4 << 20)], [(100 + i, 4 << 20)], 1.0)
             for i in range(2)]
    sim = simulate.WorkerSim(dev.memory / 2)
    first = simulate.remote_s(steps[0], dev, link, 0, sim)[0]
    sim.ran(steps[0])
    second = simulate.remote_s(steps[1], dev, link, 0, sim)[0]
    assert first - second == pytest.approx(dev.first_call_s)
    products = [s for s in _steps() if s.call.flops > 1e9][0]  # benchmarked: warm from the start
    assert simulate.remote_s(products, dev, link, 0, simulate.WorkerSim(1e9))[0] == pytest.approx(
        simulate.remote_s(products, dev, link, 0)[0])


def test_the_noise_band_brackets_the_noisy_replays_and_repeats_for_a_seed():
    dev, link = hardware.device("l4", {}), hardware.link("wan", {})
    steps = _steps()
    band = simulate.noise_band(steps, dev, link)
    assert set(band) == set(simulate.STRATEGIES)
    lo, hi = band["remote"]
    assert lo < hi  # the link's noise spreads the remote total
    assert band["local"][0] == band["local"][1]  # local times are as recorded
    assert simulate.noise_band(steps, dev, link) == band


def test_break_even_is_where_the_modelled_worker_first_beats_this_host():
    dev, link = hardware.device("h200", {}), hardware.link("10gbe", {})
    steps = _steps()  # products at 20 GFLOP/s here
    got = simulate.break_even(steps, dev, link)["numpy.matmul/f8"]
    n = round((got["flops"] / 2) ** (1 / 3))
    call = Call("numpy.matmul", "products", "f8", 2.0 * n**3, 2 * n * n * 8, n * n * 8)
    there = link.transfer_s(call.bytes_in, call.bytes_out) + dev.compute_s(call.op, call.family, "f8", call.flops,
                                                                            call.bytes_in + call.bytes_out)
    assert there < call.flops / 20e9
    smaller = got["flops"] / 2 ** (3 / 8)  # one step of the search below it
    m = (smaller / 2) ** (1 / 3)
    there = link.transfer_s(16 * m * m, 8 * m * m) + dev.compute_s(call.op, call.family, "f8", smaller, 24 * m * m)
    assert there >= smaller / 20e9


def test_the_replayed_planner_starts_calibrated_from_the_recorded_local_times():
    steps = _steps()
    cal = simulate.RecordedCalibration(steps)
    pts = cal.get("products", "f8")
    assert pts and all(s == pytest.approx(f / 20e9) for f, s in pts)
    assert cal.get("fft", "f8") is None
    planner = simulate.make_planner({"numpy.matmul": "products"}, cal)
    dev, link = hardware.device("h200", {}), hardware.link("pcie5", {})
    planner.worker_ready(0, dev.bench(), link.rtt_s + link.per_call_s, link.up_bps, link.down_bps)
    big = steps[0].call
    d = planner.decide(big, [WorkerState("ready", bytes_in=big.bytes_in)])
    assert d.where == "worker" and d.local_s == pytest.approx(big.flops / 20e9, rel=0.05)


def test_repeated_calls_of_a_site_take_their_median_local_time():
    call = Call("numpy.matmul", "products", "f8", 1e7, 1 << 20, 1 << 19)
    other = Call("numpy.matmul", "products", "f8", 2e7, 1 << 20, 1 << 19)
    steps = [simulate.Step(i, "m.py:5", call.op, call, s, 0.0, [], [], 1.0) for i, s in enumerate((1e-3, 2e-3, 0.1))]
    steps += [simulate.Step(3 + i, "m.py:5", other.op, other, s, 0.0, [], [], 1.0) for i, s in enumerate((1e-3, 0.1))]
    assert simulate._smooth_local(steps) == 2
    assert [st.local_s for st in steps] == [2e-3, 2e-3, 2e-3, 1e-3, 0.1]  # a pair is left as recorded


def test_a_worker_on_the_recording_hosts_cpus_is_decided_as_contended():
    # a product the worker's (optimistic) self-benchmark makes 1.5x faster there: moved if the worker
    # had CPUs of its own, kept here when it shares the program's (its first call's margin, D86)
    n = 1024
    call = Call("numpy.matmul", "products", "f8", 2.0 * n**3, 2 * n * n * 8, n * n * 8)
    steps = [simulate.Step(i, "p.py:3", call.op, call, 0.03, 1e-4, [(1, n * n * 8), (2, n * n * 8)],
                           [(10 + i, n * n * 8)], 1.0) for i in range(3)]
    bench = {"points": {"products/f8": [[2.0 * n**3, 0.02]]}}
    report = {"worker": {"info": {"bench": bench, "link": {"rtt_s": 1e-4}}}}
    link = hardware.Link("fast", 1e-4, 1e12, 1e12, 0.0)
    dev = hardware.device("cpu-worker", report)
    assert dev.shares_cpus
    assert simulate.run_auto(steps, dev, link).where[0] == "local"
    dev.shares_cpus = False
    assert simulate.run_auto(steps, dev, link).where[0] == "worker"


def _rec(op, family, inputs, shapes, results, kind="worker", saved=0, t=0.0, **extra):
    nbytes = [8 * int(np.prod(s)) for s in shapes]
    return {"op": op, "family": family, "site": f"p.py:{len(op)}", "kind": kind, "cdtype": "f8", "flops": 1e8,
            "bytes_in": sum(nbytes), "bytes_out": nbytes[-1], "inputs": inputs, "results": results,
            "shapes": shapes, "dtypes": ["<f8"] * len(shapes), "start_s": t, "wall_s": 0.01,
            "phases": {"kernel": 0.005} if kind == "worker" else {"local": 0.005}, "bytes_saved": saved,
            "local_measured_s": 0.005, **extra}


def test_an_input_the_recorded_worker_was_sent_again_is_uploaded_again():
    # A @ X uploads X; norm(X) finds it held; X /= s changes it in place (same buffer, same token);
    # A @ X then sent X again
    a, x = [512, 512], [512, 64]
    records = [_rec("numpy.matmul", "products", [1, 2], [a, x], [3], t=0.0),
               _rec("numpy.linalg.norm", "linalg", [2], [x], [4], saved=8 * 512 * 64, t=0.1),
               _rec("numpy.matmul", "products", [1, 2], [a, x], [5], saved=8 * 512 * 512, t=0.2)]
    steps, sample = simulate.steps_of({"records": records})
    assert sample["inputs_changed"] == 1 and sample["inputs_aliased"] == 0
    assert steps[2].inputs[0][0] == 1 and steps[2].inputs[1][0] not in (2, 3, 4)
    dev, link = hardware.device("h100-sxm", {}), hardware.link("pcie5", {})
    assert simulate.run_fixed(steps, dev, link, "remote").up == 8 * (512 * 512 + 512 * 64 * 2)


def test_a_call_auto_keeps_here_pays_the_shims_own_time_the_recorded_call_took():
    x = [1024, 1024]  # above the floor, and 0.5 ms here: over 1 GbE it stays here
    rec = _rec("numpy.matmul", "products", [1, 2], [x, x], [3], kind="local")
    rec["wall_s"], rec["phases"] = 0.0035, {"local": 0.0005, "fingerprint": 0.001}
    steps, _ = simulate.steps_of({"records": [rec]})
    assert steps[0].decide_s == pytest.approx(0.003)
    dev, link = hardware.device("h100-sxm", {}), hardware.link("1gbe", {})
    out = simulate.run_auto(steps, dev, link)
    assert out.where == ["local"] and "here" in out.reasons[0] and out.seconds == [pytest.approx(0.0035)]
    # policy local decides nothing
    assert simulate.run_fixed(steps, dev, link, "local").seconds == [pytest.approx(0.0005)]


def test_a_view_the_recorded_worker_held_is_not_uploaded_again():
    # H @ W uploads H; H.T, a view with a token of its own, was found held by the worker
    h, w, g = [512, 128], [128, 128], [512, 64]
    records = [_rec("numpy.matmul", "products", [1, 2], [h, w], [3], t=0.0),
               _rec("numpy.matmul", "products", [4, 5], [h[::-1], g], [6], saved=8 * 512 * 128, t=0.1)]
    steps, sample = simulate.steps_of({"records": records})
    assert sample["inputs_aliased"] == 1 and steps[1].inputs[0][0] == 1
    dev, link = hardware.device("h100-sxm", {}), hardware.link("pcie5", {})
    assert simulate.run_fixed(steps, dev, link, "remote").up == 8 * (512 * 128 + 128 * 128 + 512 * 64)

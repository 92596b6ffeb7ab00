"""The report's default layout (D280) and its categories (D281): each call counted once, in the
category that says why it ran where it did; --full and --explain."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import fusion_shim
from fusion_shim import cli
from fusion_shim.ledger import Ledger, Record
from fusion_shim.reporting import SCHEMA, format_table, summarize, write_json
from fusion_shim.reporting.layout import EXPLAIN, SUMMARY_LINES, WIDTH, bottom_words

MORE = re.compile(r"\((\d+) more: fusion-shim report --full\)")
OPS = [f"numpy.linalg.a_rather_long_operation_name_{i:02d}" for i in range(30)]


def _report(ledger: Ledger, policy: str = "auto", worker: dict | None = None, **extra) -> dict:
    report = {"schema": SCHEMA, "pid": 4242, "argv": ["app.py"], "policy": policy, "verify": 0.5, "wall_s": 123.4,
              "operators": {"intercepted": True, "why": None, "fast_path": "C"}, "worker": worker,
              **ledger.snapshot(), **extra}
    report["summary"] = summarize(report)
    return report


def _busy_run() -> dict:
    """A long run: many ops with every kind of call, big counts, long reasons and events."""
    ledger = Ledger(unready=True)
    for i, op in enumerate(OPS):
        ledger.fast_path[op][0] += 1_234_567 * (i + 1)  # before any worker was ready
    ledger.worker_ready()
    for i, op in enumerate(OPS):
        ledger.fast_path[op][0] += 7 * i
        for kind in ("worker", "local", "unsupported", "fallback", "raised"):
            rec = Record(op, "linalg", site=f"/a/very/long/path/to/a/project/module_{i}.py:{i + 10}", kind=kind,
                         reason=f"{kind} because of a long explanation of why, number {i}, " + "x" * 80,
                         wall_s=0.5 + i, phases={"kernel": 0.25} if kind == "worker" else {"local": 0.25},
                         bytes_sent=3_000_000_000, bytes_received=2_000_000, predicted_local_s=0.4,
                         verify="ok" if kind == "worker" else None, raised="LinAlgError" if kind == "raised" else None)
            ledger.add(rec)
    ledger.event("floors: " + ", ".join(f"{op.removeprefix('numpy.')} {i}.5 MB" for i, op in enumerate(OPS)))
    ledger.event("worker ready at ipc:///tmp/fusion-shim-0/run-4026531836-28051-253144/worker-0.sock on cuda:0 "
                 "(NVIDIA H100 80GB HBM3, pid 28062, round trip 455 us) " + "and a long tail " * 10)
    for i in range(9):
        ledger.event(f"model products/worker (bucket {i}) reset: {i + 4} calls off")
    worker = {"url": "ipc:///tmp/fusion-shim-0/run-4026531836-28051-253144/worker-0.sock", "embedded": True,
              "state": "ready", "ready_after_s": 8.2, "restarts": 0, "info": {"device": "cuda:0"}}
    planner = {"explored_calls": 3, "explore_spent_s": 0.2, "intercepted_s": 9.0, "explorations_abandoned": 1,
               "explore_fraction": 0.05, "model_resets": 2, "floors_bytes": {op: 1 << 20 for op in OPS},
               "floors_raised_bytes": {}, "floor_raises": 0, "calibration": {}, "workers": []}
    ledger.add_startup("launcher", 0.27)
    for part in ("interception", "planner", "worker links", "call path"):
        ledger.add_startup(part, 0.1234)
    return _report(ledger, worker=worker, planner=planner)


def test_every_line_of_the_default_report_fits_100_columns_with_a_summary_of_six_lines():
    rep = _busy_run()
    lines = format_table(rep).splitlines()
    too_long = [ln for ln in lines if len(ln) > WIDTH]
    assert not too_long, too_long
    table = next(i for i, ln in enumerate(lines) if ln.startswith("  op "))
    title = 1 + sum(1 for ln in lines[1:table] if ln.startswith("    "))  # a folded title's second line
    assert len(lines[title:table]) <= SUMMARY_LINES, lines[:table]
    assert len(lines[table].split()) <= 11 and all(op.removeprefix("numpy.")[-12:] in "\n".join(lines) for op in OPS)
    floors = next(ln for ln in lines if "floors: " in ln)
    assert 0 < int(MORE.search(floors).group(1)) < len(OPS), floors  # abbreviated, the rest counted


def test_the_full_report_has_the_wide_table_every_event_and_every_floor():
    rep = _busy_run()
    full = format_table(rep, full=True)
    assert "  op " in full and " kernel " in full and " local " in full  # a column per phase
    assert all(ev["what"] in full for ev in rep["events"])  # every event, whole
    assert all(f"{op.removeprefix('numpy.')}" in full.split("floors (")[1] for op in OPS)
    assert not MORE.search(full)


def test_each_call_is_counted_once_in_the_category_that_says_why():
    rep = _busy_run()
    for i, op in enumerate(OPS):
        o = rep["ops"][op]
        assert o["no_worker"] == 1_234_567 * (i + 1) and o["below_floor"] == 7 * i
        assert o["raised"] == o["fallback"] == o["worker"] == o["local"] == o["unsupported"] == 1
        assert o["calls"] == 5
        assert not any(r.startswith("fallback: ") and "LinAlgError" in r for r in o["reasons"])
    calls = rep["summary"]["calls"]
    assert calls["raised"] == len(OPS) and calls["no_worker"] == sum(1_234_567 * (i + 1) for i in range(len(OPS)))
    head = next(ln for ln in format_table(rep).splitlines() if ln.startswith("  op "))
    assert head.split()[1:8] == ["calls", "worker", "here", "fallbk", "raised", "<floor", "no-wkr"], head


def test_a_clear_after_a_worker_was_ready_counts_below_the_floor_again():
    ledger = Ledger(unready=True)
    ledger.fast_path["numpy.matmul"][0] += 3
    assert ledger.snapshot_ops()["numpy.matmul"]["no_worker"] == 3  # no worker ready yet
    ledger.worker_ready()
    ledger.clear()
    ledger.fast_path["numpy.matmul"][0] += 2
    got = ledger.snapshot_ops()["numpy.matmul"]
    assert (got["no_worker"], got["below_floor"]) == (0, 2)


def test_a_ledger_without_a_worker_to_wait_for_counts_below_the_floor():
    ledger = Ledger()  # policy local or remote, or a deferred embedded worker (its evidence floors)
    ledger.fast_path["numpy.matmul"][0] += 4
    got = ledger.snapshot_ops()["numpy.matmul"]
    assert (got["no_worker"], got["below_floor"]) == (0, 4)


def test_warming_is_said_only_of_a_worker_that_became_ready():
    ledger = Ledger()
    ledger.add(Record("numpy.matmul", "products", kind="fallback", reason="Timeout", wall_s=2.0,
                      phases={"wait_ready": 1.9, "local": 0.05}))
    never = {"url": "tcp://127.0.0.1:1", "embedded": False, "state": "down", "ready_after_s": None, "restarts": 0,
             "info": {}}
    for worker in (never, None):
        rep = _report(ledger, "remote", worker)
        assert "for a worker that never became ready" in rep["summary"]["bottom_line"], rep["summary"]["bottom_line"]
        for text in (format_table(rep), format_table(rep, full=True)):
            assert "warm" not in text and "cold worker" not in text, text
    ready = _report(ledger, "remote", {**never, "ready_after_s": 3.0, "state": "ready"})
    assert "for the worker to warm" in ready["summary"]["bottom_line"]
    assert bottom_words("x waiting 1 s for the worker to warm", None) == "x waiting 1 s for a worker that never became ready"


def test_the_cli_prints_the_full_report_and_explains_every_column(tmp_path, capsys):
    path = str(tmp_path / "run.json")
    write_json(_busy_run(), path)
    assert cli.main(["report", path, "--explain"]) == 0
    out = capsys.readouterr().out
    table, _, explained = out.partition("What the report shows")
    head = next(ln for ln in table.splitlines() if ln.startswith("  op "))
    for column in head.split():
        assert re.search(rf"^  {re.escape(column)} ", explained, re.M), column
    for figure in ("offloaded X of Y", "time ", "moved ", "vs plain ", "shim start-up ", "ESTIMATED"):
        assert figure in explained, figure
    assert all(len(ln) <= WIDTH for ln in explained.splitlines())
    assert cli.main(["report", path, "--full"]) == 0
    full = capsys.readouterr().out
    assert "floors (" in full and not MORE.search(full) and any(len(ln) > WIDTH for ln in full.splitlines())


def test_the_library_gives_the_full_report_too(shim):
    np.matmul(np.ones((64, 64)), np.ones((64, 64)))
    short, full = fusion_shim.report(), fusion_shim.report(full=True)
    assert all(len(ln) <= WIDTH for ln in short.splitlines())
    head = next(ln for ln in full.splitlines() if ln.startswith("  op "))
    assert " kernel " in head and len(head) > len(next(ln for ln in short.splitlines() if ln.startswith("  op ")))


def test_a_singular_matrix_raises_as_numpy_raises_it_and_is_counted_raised_not_a_fallback(shim):
    """Differential, --policy remote: the worker refuses a singular matrix (NumPy decides), NumPy
    raises LinAlgError here; the program gets NumPy's exception, the report a raised call."""
    singular = np.ones((64, 64))
    with pytest.raises(np.linalg.LinAlgError) as plain:
        np.linalg.inv.__wrapped__(singular)
    shim.ledger.clear()
    with pytest.raises(np.linalg.LinAlgError) as shimmed:
        np.linalg.inv(singular)
    assert type(shimmed.value) is type(plain.value) and str(shimmed.value) == str(plain.value)
    assert "fusion_shim" not in str(shimmed.value)
    rep = fusion_shim.report(format="json")
    o = rep["ops"]["numpy.linalg.inv"]
    assert (o["raised"], o["fallback"], o["calls"]) == (1, 0, 1), o
    assert list(o["reasons"]) == ["raised: LinAlgError: Singular matrix"], o["reasons"]
    assert rep["summary"]["calls"]["raised"] == 1 and rep["summary"]["calls"]["fallback"] == 0
    for text in (fusion_shim.report(), fusion_shim.report(full=True)):
        assert "WorkerFault" not in text and "fallback:" not in text, text

"""Stages against a worker that runs code: every answer compared with running the function plainly."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fusion_shim.stages import Stage
from tests.helpers.shims import install
from tests.stage import stagefns

M = "tests.stage.stagefns"


def _stages(*names):
    return tuple(f"{M}:{n}" for n in names)


def _last(rt, op):
    return [r for r in rt.ledger.records if r.op == f"stage {M}:{op}"][-1]


def test_array_scalar_and_container_arguments_give_what_the_plain_function_gives(code_worker):
    rng = np.random.default_rng(1)
    A, X = rng.standard_normal((64, 64)), rng.standard_normal((64, 8))
    a = rng.standard_normal(100).astype(np.float32)
    want_chain, want_summary = stagefns.chain(A, X.copy(), 5), stagefns.summary(a, scale=3.0)
    rt = install(code_worker[0], stages=_stages("chain", "summary"))
    got_chain, got_summary = stagefns.chain(A, X.copy(), 5), stagefns.summary(a, scale=3.0)
    assert _last(rt, "chain").kind == _last(rt, "summary").kind == "worker"
    np.testing.assert_array_equal(got_chain, want_chain)
    assert got_summary["sum"] == want_summary["sum"] and got_summary["n"] == 100
    np.testing.assert_array_equal(got_summary["parts"][0], want_summary["parts"][0])
    assert got_summary["parts"][0].dtype == np.float32 and got_summary["parts"][1] == ((100,), "float32")


def test_an_argument_changed_in_place_on_the_worker_is_changed_here(code_worker):
    rt = install(code_worker[0], stages=_stages("fill"))
    C = np.zeros((300, 300))
    view = np.zeros((10, 20))[:, ::2]  # not contiguous: travels as a copy, changed back through the view
    assert stagefns.fill(C, 3.0) is None
    stagefns.fill(view, 2.0)
    assert _last(rt, "fill").kind == "worker", (_last(rt, "fill"), rt.ledger.events)
    assert (C == 3.0).all() and (view == 2.0).all()


def test_the_stages_exception_reaches_the_caller_with_its_type_and_message(code_worker):
    rt = install(code_worker[0], stages=_stages("fails"))
    with pytest.raises(ValueError, match=r"^no good: \(3, 4\)$"):
        stagefns.fails(np.zeros((3, 4)))
    assert _last(rt, "fails").kind == "worker"


def test_a_closure_and_a_lambda_go_by_value(code_worker):
    rt = install(code_worker[0])
    offset = np.arange(5.0)

    def shifted(a):
        return a + offset

    closure, lam = Stage(shifted), Stage(lambda a, k=2: a * k)
    a = np.ones(5)
    np.testing.assert_array_equal(closure(a), a + offset)
    np.testing.assert_array_equal(lam(a, k=3), a * 3)
    stages = [r for r in rt.ledger.records if r.op.startswith("stage ")]
    assert [r.kind for r in stages] == ["worker", "worker"]
    assert "<locals>" in stages[0].op and "<lambda>" in stages[1].op


def test_a_stage_calling_another_stage(code_worker):
    rng = np.random.default_rng(2)
    A, X = rng.standard_normal((50, 50)), rng.standard_normal((50, 3))
    want = stagefns.outer(A, X)
    rt = install(code_worker[0], stages=_stages("outer", "inner_step"))
    np.testing.assert_array_equal(stagefns.outer(A, X), want)
    assert _last(rt, "outer").kind == "worker"
    assert not [r for r in rt.ledger.records if r.op.endswith("inner_step")]  # it ran inside, on the worker


def test_a_matrix_used_by_many_stage_calls_crosses_once(code_worker):
    rt = install(code_worker[0], stages=_stages("scaled_sum"))
    A = np.random.default_rng(3).standard_normal((512, 512))  # 2 MiB
    x = np.ones(512)
    answers = [stagefns.scaled_sum(A, x) for _ in range(3)]
    assert answers == [float((A @ x).sum())] * 3
    recs = [r for r in rt.ledger.records if r.op.endswith("scaled_sum")]
    assert [r.kind for r in recs] == ["worker"] * 3
    assert recs[0].bytes_sent > A.nbytes and recs[1].bytes_sent < A.nbytes / 100
    assert recs[1].resident_hits == 1 and recs[1].bytes_saved == A.nbytes


def test_a_method_marked_by_its_qualname(code_worker):
    rt = install(code_worker[0], stages=_stages("Model.apply"))
    w = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(stagefns.Model(w).apply(np.ones(4)), w @ np.ones(4))
    assert _last(rt, "Model.apply").kind == "worker"


def test_uninstall_puts_the_functions_back():
    import fusion_shim

    original = stagefns.summary
    fusion_shim.install(policy="local", stages=_stages("summary"), quiet=True)
    assert isinstance(stagefns.summary, Stage)
    fusion_shim.uninstall()
    assert stagefns.summary is original


def test_a_worker_without_allow_code_refuses_and_the_stage_runs_here(plain_worker):
    rt = install(plain_worker[0], stages=_stages("where"))
    assert stagefns.where(os.getpid()) == "here"
    rec = _last(rt, "where")
    assert rec.kind == "fallback" and "--allow-code" in rec.reason
    assert stagefns.where(os.getpid()) == "here"
    assert "pinned here" in _last(rt, "where").reason


def test_an_unauthenticated_client_cannot_run_code():
    from tests.stage.conftest import stage_worker

    url = f"inproc://stage-anon-{os.getpid()}"
    _, thread, stop = stage_worker(url)
    try:
        rt = install(url, stages=_stages("where"))
        assert stagefns.where(os.getpid()) == "here"
        assert "unauthenticated" in _last(rt, "where").reason
    finally:
        import fusion_shim

        fusion_shim.uninstall()
        stop.set()
        thread.join(10)


def test_a_stage_that_segfaults_on_the_worker_is_rerun_here_and_the_worker_serves_on(code_worker):
    rt = install(code_worker[0], stages=_stages("crash_elsewhere", "where"))
    assert stagefns.crash_elsewhere(os.getpid()) == "here"
    rec = _last(rt, "crash_elsewhere")
    assert rec.kind == "fallback" and "StageCrashed" in rec.reason and rec.fallback == "worker_fault"  # D323
    assert stagefns.where(os.getpid()) == "worker"  # a new stage process
    a = np.ones((300, 300))
    np.testing.assert_array_equal(a @ a, np.full((300, 300), 300.0))
    assert rt.ledger.records[-1].kind == "worker"


def test_a_stage_that_never_returns_costs_its_deadline_and_the_worker_serves_on(code_worker):
    rt = install(code_worker[0], stages=_stages("hang_elsewhere", "where"), timeout=3.0)
    assert stagefns.hang_elsewhere(os.getpid()) == "here"
    rec = _last(rt, "hang_elsewhere")
    assert rec.kind == "fallback" and "StageTimeout" in rec.reason and rec.fallback == "timeout"  # D323
    assert stagefns.where(os.getpid()) == "worker"
    a = np.ones((300, 300))
    np.testing.assert_array_equal(a @ a, np.full((300, 300), 300.0))
    assert rt.ledger.records[-1].kind == "worker"


def test_verify_pins_a_stage_whose_worker_answer_differs_and_names_it(code_worker):
    rt = install(code_worker[0], stages=_stages("differs_elsewhere"), verify=1.0)
    a = np.zeros(4)
    np.testing.assert_array_equal(stagefns.differs_elsewhere(os.getpid(), a), a)
    rec = _last(rt, "differs_elsewhere")
    assert rec.kind == "worker" and rec.verify.startswith("mismatch")
    assert any("differs_elsewhere pinned here" in text for _, text in rt.ledger.events)
    np.testing.assert_array_equal(stagefns.differs_elsewhere(os.getpid(), a), a)
    assert _last(rt, "differs_elsewhere").kind == "local"


def test_verify_passes_a_stage_whose_answers_agree(code_worker):
    rt = install(code_worker[0], stages=_stages("fill"), verify=1.0)
    C = np.zeros(8)
    stagefns.fill(C, 5.0)
    assert (C == 5.0).all() and _last(rt, "fill").verify == "ok"


def test_a_curve_client_on_the_allow_list_runs_code(tmp_path):
    import socket

    from fusion_shim import auth
    from tests.stage.conftest import NumpyBackend, _matmul

    from fusion_shim.worker.server import Worker, serve_in_thread

    keys = tmp_path / "keys"
    auth.make_keys(str(keys), ["alice"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    worker = Worker(backend=NumpyBackend(), kernels={"matmul": _matmul}, max_bytes=1 << 30, allow_code="any")
    thread, stop = serve_in_thread(url, worker=worker, keys=str(keys))
    try:
        rt = install(url, stages=_stages("where"), server_key=str(keys / "server.key"),
                     client_keys=str(keys / "alice.key_secret"))
        assert stagefns.where(os.getpid()) == "worker"
        assert _last(rt, "where").kind == "worker"
    finally:
        import fusion_shim

        fusion_shim.uninstall()
        stop.set()
        thread.join(10)


def test_strict_mode_raises_where_a_stage_would_fall_back(plain_worker):
    from fusion_shim import FallbackError

    install(plain_worker[0], stages=_stages("where"), strict=True)
    with pytest.raises(FallbackError, match="allow-code") as raised:
        stagefns.where(os.getpid())
    assert raised.value.kind == "refused"  # D323: the worker refuses code

"""D323, D324: every fallback has a kind (``errors.FallbackKind``) beside its reason in words: on its
record, in the report's counts (``fallbacks_by_kind``, additive: an older report still renders), and
on strict mode's ``FallbackError``. The faults that produce each kind end to end are in tests/faults
(bad replies, error replies, busy, refused, a late reply, a dead worker, a pinned op, no worker
ready), tests/catalog (unencodable, NumPy's error state, a kernel's refusal) and tests/stage; here:
what the rest need, the mapping of every transport exception, and the report."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import fusion_shim
from fusion_shim import transport
from fusion_shim.client import call as call_mod, remote
from fusion_shim.errors import FallbackError, FallbackKind, VerificationError
from fusion_shim.reporting import format_table, summarize
from fusion_shim.reporting.layout import EXPLAIN

from tests.helpers.shims import installed


STRICT_ONLY = {FallbackKind.UNSUPPORTED, FallbackKind.VERIFICATION_MISMATCH}


# -- the kinds and the error --------------------------------------------------------------------------

def test_a_kind_is_its_value_as_a_string_a_key_and_in_json():
    assert FallbackKind.TIMEOUT == "timeout" and str(FallbackKind.TIMEOUT) == "timeout"
    assert f"{FallbackKind.WORKER_LOST}" == "worker_lost"
    assert {"timeout": 1}[FallbackKind.TIMEOUT] == 1 and {FallbackKind.BUSY: 2}["busy"] == 2
    assert json.loads(json.dumps({FallbackKind.PINNED: [FallbackKind.BUSY]})) == {"pinned": ["busy"]}
    assert FallbackKind("refused") is FallbackKind.REFUSED


def test_strict_modes_error_carries_kind_and_detail_and_stays_a_runtime_error():
    err = FallbackError(FallbackKind.TIMEOUT, "numpy.matmul at app.py:3 ran locally (fallback): Timeout: 5 s")
    assert isinstance(err, RuntimeError)
    assert err.kind is FallbackKind.TIMEOUT and err.detail.startswith("numpy.matmul at app.py:3")
    assert str(err) == "timeout: numpy.matmul at app.py:3 ran locally (fallback): Timeout: 5 s"
    assert FallbackError("busy").kind is FallbackKind.BUSY and str(FallbackError("busy")) == "busy"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is FallbackError and again.kind is err.kind and str(again) == str(err)
    with pytest.raises(ValueError):
        FallbackError("no such kind", "x")


def test_a_verification_error_is_a_fallback_error_of_kind_verification_mismatch():
    err = VerificationError("numpy.matmul at app.py:3: the worker's answer differed from NumPy's: 1e-3")
    assert isinstance(err, FallbackError) and err.kind is FallbackKind.VERIFICATION_MISMATCH
    assert str(err).startswith("verification_mismatch: numpy.matmul at app.py:3") and "differed" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is VerificationError and str(again) == str(err)
    with pytest.raises(FallbackError):  # an existing `except FallbackError` still catches it
        raise err


# -- which fault is which kind --------------------------------------------------------------------------

FAULTS = [
    (transport.Timeout("no reply within the deadline"), "timeout"),
    (transport.WorkerDied("worker exited"), "worker_lost"),
    (transport.WorkerLost("connection is down"), "worker_lost"),
    (transport.NoListener("nothing accepted", "refused"), "worker_lost"),
    (transport.TransportError("socket error: x"), "worker_lost"),
    (transport.BadReply("result float32"), "bad_reply"),
    (transport.Refused("handshake failed"), "refused"),
    (transport.Unauthenticated("no keys", "no keys", "fusion-shim keys"), "refused"),
    (remote.WorkerFault("worker raised RuntimeError (kernel_error)", "kernel_error", "RuntimeError"), "worker_fault"),
    (remote.WorkerFault("worker raised HealthCheck (unhealthy)", "unhealthy", "HealthCheck"), "worker_fault"),
    (remote.WorkerFault("worker raised NotReproducible", "kernel_error", "NotReproducible"), "not_reproducible"),
    (remote.WorkerFault("worker raised WorkerBusy (busy)", "busy", "WorkerBusy"), "busy"),
    (remote.WorkerFault("worker raised CodeRefused (refused)", "refused", "CodeRefused"), "refused"),
    (remote.WorkerFault("worker raised OutOfMemoryError", "out_of_memory", "OutOfMemoryError"), "out_of_memory"),
    (remote.WorkerFault("an error reply from an older client's path"), "worker_fault"),
    (remote.WontFit("1 GiB of inputs and results exceed the worker's message budget"), "out_of_memory"),
]


@pytest.mark.parametrize("exc,kind", FAULTS, ids=[f"{type(e).__name__}-{k}" for e, k in FAULTS])
def test_each_fault_on_the_way_to_the_worker_has_its_kind(exc, kind):
    assert call_mod.fault_kind(exc) == kind


def test_the_worker_error_kinds_that_are_not_worker_faults_have_kinds():
    from fusion_shim.protocol import wire

    assert set(call_mod._REPLY_KINDS) <= set(wire.ERROR_KINDS)


# -- kinds no fault test makes: produced here, on the record and counted ----------------------------------

def test_a_planner_error_under_policy_remote_is_an_internal_error_not_a_missing_worker(inproc_worker, monkeypatch):
    with installed(inproc_worker, timeout=30.0) as rt:
        planner = rt.planner
        monkeypatch.setattr(planner, "_price", lambda *a, **k: (_ for _ in ()).throw(ZeroDivisionError("x")))
        a = np.ones((64, 64))
        np.testing.assert_array_equal(np.matmul(a, a), np.full((64, 64), 64.0))
        rec = rt.ledger.records[-1]
        assert rec.kind == "fallback" and rec.reason.startswith("planner error"), rec
        assert rec.fallback is FallbackKind.INTERNAL_ERROR
        assert rt.ledger.snapshot_ops()["numpy.matmul"]["fallbacks_by_kind"] == {"internal_error": 1}


def test_a_bug_on_the_remote_path_is_an_internal_error_and_strict_raises_it(inproc_worker, monkeypatch):
    with installed(inproc_worker, timeout=30.0, strict=True) as rt:
        monkeypatch.setattr(remote, "send", lambda *a, **k: (_ for _ in ()).throw(KeyError("a shim bug")))
        a = np.ones((64, 64))
        with pytest.raises(FallbackError) as raised:
            np.matmul(a, a)
        assert raised.value.kind is FallbackKind.INTERNAL_ERROR and "a shim bug" in raised.value.detail
        rec = rt.ledger.records[-1]
        assert rec.kind == "fallback" and rec.fallback is FallbackKind.INTERNAL_ERROR, rec
        assert rec.reason.startswith("internal error: KeyError"), rec.reason


def test_a_call_the_kernel_cannot_reproduce_is_not_a_worker_fault(inproc_worker):
    with installed(inproc_worker, timeout=30.0) as rt:
        a = np.eye(8)
        a[3, 3] = np.nan  # non-finite input: the kernel declines, NumPy decides here
        with np.errstate(all="ignore"):
            got = np.linalg.inv(a)
        assert np.isnan(got).any()
        rec = rt.ledger.records[-1]
        assert rec.kind == "fallback" and rec.fallback is FallbackKind.NOT_REPRODUCIBLE, rec
        assert "NotReproducible" in rec.reason, rec.reason
        rep = fusion_shim.report(format="json")
        assert rep["summary"]["fallbacks_by_kind"] == {"not_reproducible": 1}
        assert rep["records"][-1]["fallback"] == "not_reproducible"


def test_numpys_own_error_after_a_fallback_is_raised_and_no_fallback(inproc_worker):
    with installed(inproc_worker, timeout=30.0) as rt:
        with pytest.raises(np.linalg.LinAlgError):
            np.linalg.inv(np.zeros((8, 8)))
        rec = rt.ledger.records[-1]
        assert rec.kind == "raised" and rec.fallback is None, rec
        assert rt.ledger.snapshot_ops()["numpy.linalg.inv"]["fallbacks_by_kind"] == {}


# -- the report -------------------------------------------------------------------------------------------

def _report(by_op: dict[str, dict[str, int]]) -> dict:
    """A small report of ops whose calls all fell back, by kind (the shape build() writes)."""
    ops = {}
    for op, kinds in by_op.items():
        ops[op] = {"family": "products", "calls": sum(kinds.values()), "worker": 0, "local": 0, "unsupported": 0,
                   "fallback": sum(kinds.values()), "raised": 0, "below_floor": 0, "no_worker": 0, "verified": 0,
                   "mismatches": 0, "repeated": 0, "bytes_sent": 0, "bytes_received": 0, "wall_s": 0.01,
                   "phases": {"local": 0.01}, "reasons": {f"fallback: {k} in words": n for k, n in kinds.items()},
                   "fallbacks_by_kind": dict(kinds)}
    report = {"schema": "fusion_shim.report/1", "pid": 1, "argv": ["app.py"], "policy": "remote", "verify": 0.0,
              "wall_s": 0.1, "operators": {"intercepted": True}, "worker": None, "ops": ops, "sites": {},
              "events": [], "records": [], "records_dropped": 0, "startup": {}}
    report["summary"] = summarize(report)
    return report


def test_the_report_counts_fallbacks_by_kind_over_its_ops_commonest_first():
    report = _report({"numpy.matmul": {"timeout": 2, "busy": 1}, "numpy.dot": {"busy": 3}})
    assert report["summary"]["fallbacks_by_kind"] == {"busy": 4, "timeout": 2}
    assert list(report["summary"]["fallbacks_by_kind"]) == ["busy", "timeout"]
    for full in (False, True):
        text = format_table(report, full=full)
        assert "fallbacks by kind: busy 4, timeout 2" in text, text


def test_a_report_older_than_the_kinds_still_renders_without_them():
    report = _report({"numpy.matmul": {"timeout": 2}})
    for o in report["ops"].values():
        del o["fallbacks_by_kind"]
    del report["summary"]  # a saved report is summarised again where its summary is missing
    for full in (False, True):
        text = format_table(report, full=full)
        assert "fallbacks by kind" not in text and "timeout in words" in text, text
    old = dict(report, summary={k: v for k, v in summarize(report).items() if k != "fallbacks_by_kind"})
    assert "fallbacks by kind" not in format_table(old) and summarize(report)["fallbacks_by_kind"] == {}


def test_explain_names_every_kind_a_record_can_have():
    text = " ".join(EXPLAIN.split())
    missing = [k.value for k in FallbackKind if k not in STRICT_ONLY and k.value not in text]
    assert not missing, missing

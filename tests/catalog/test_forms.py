"""What a rule admits its kernel can compute (D305): an input past a kernel's range runs here, and a
header this side cannot encode is recorded as a fallback that leaves the worker up."""
from __future__ import annotations

import numpy as np
import pytest

from fusion_shim.catalog import linalg as linalg_rules
from fusion_shim.protocol import wire
from tests.helpers.shims import last_record

pytest.importorskip("torch")

A = np.eye(3) * 0.5 + np.triu(np.ones((3, 3)), 1) * 0.1


def test_an_exponent_past_64_bits_runs_here_as_numpy_and_the_next_call_goes_to_the_worker(shim):
    for n in (2**100 + 1, -(2**64), 2**63):
        got = np.linalg.matrix_power(np.eye(3), n)
        np.testing.assert_array_equal(got, np.eye(3))
        rec = last_record(shim)
        assert rec.kind == "unsupported" and "64-bit exponent" in rec.reason, rec
    got = np.linalg.matrix_power(A, 5)
    np.testing.assert_allclose(got, A @ A @ A @ A @ A, rtol=1e-12)
    assert last_record(shim).kind == "worker", last_record(shim)


def test_a_header_that_cannot_be_encoded_is_a_fallback_and_no_worker_fault(shim, monkeypatch):
    """A rule that admitted what msgpack cannot hold (here: the exponent guard lifted) costs that
    call only: it is computed here, recorded with the reason, and the worker serves the next one."""
    monkeypatch.setattr(linalg_rules, "EXPONENT_MAX", 1 << 80)
    got = np.linalg.matrix_power(np.eye(3), 2**70)
    np.testing.assert_array_equal(got, np.eye(3))
    rec = last_record(shim)
    assert rec.kind == "fallback" and "cannot be encoded" in rec.reason, rec
    faults = [e for _, e in shim.ledger.events if "worker fault" in e]
    assert faults == [] and shim.link.ready.is_set(), f"the worker was marked down: {faults}"
    np.testing.assert_allclose(np.linalg.matrix_power(A, 3), A @ A @ A, rtol=1e-12)
    assert last_record(shim).kind == "worker", last_record(shim)


def test_encoding_an_int_past_64_bits_raises_encode_error():
    with pytest.raises(wire.EncodeError, match="cannot be encoded"):
        wire.encode({"t": "call", "id": 1, "op": "matmul", "params": {"n": 2**70}})

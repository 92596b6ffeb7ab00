"""D75: a repeated plain call is answered from the plan its first call made, exactly as a worker
without plans answers it; anything else about a request is decoded and checked in full."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.transport.principal import Principal
from fusion_shim.worker import plans as plans_mod
from fusion_shim.worker import server
from tests.helpers.faultlab import numpy_worker

_decode = wire.decode  # the test's own reading of replies, never counted
ALICE, BOB = Principal("uid:1001", 1001), Principal("uid:1002", 1002)


@pytest.fixture
def worker():
    return numpy_worker()


def _request(rid: int, a: np.ndarray, b: np.ndarray, **extra) -> list:
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [(np.float64, (a.shape[0], b.shape[1]))])
    return wire.encode({**header, **extra}, [a, b])


def _answer(w, frames, who=ALICE):
    return _decode(w.handle(frames, who))


def _counting_decode(monkeypatch) -> list:
    calls: list = []
    real = wire.decode

    def decode(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(server.wire, "decode", decode)
    return calls


def test_a_repeated_call_skips_decoding_and_answers_as_before(worker, monkeypatch):
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    first, (r1,) = _answer(worker, _request(7, a, b))
    decoded = _counting_decode(monkeypatch)
    for rid in (8, 200, 70_000, 2**40, 2**64 - 1):  # each msgpack width of an unsigned int
        header, (r,) = _answer(worker, _request(rid, a, b))
        assert header["id"] == rid and header["t"] == "result"
        np.testing.assert_array_equal(r, a @ b)
        assert {k: v for k, v in header.items() if k not in ("id", "timing")} == \
            {k: v for k, v in first.items() if k not in ("id", "timing")}
    assert not decoded  # every one answered from the plan
    np.testing.assert_array_equal(r1, a @ b)


def test_the_largest_id_makes_a_plan_too(worker):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    header, _ = _answer(worker, _request(2**64 - 1, a, b))
    assert header["t"] == "result"
    assert worker.plans.find(ALICE.name, _request(5, a, b), worker.max_bytes) is not None


def test_frames_that_do_not_fit_the_plan_are_refused_as_without_it(worker):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b))
    frames = _request(2, a, b)
    fresh = numpy_worker()
    for bad in ([frames[0], frames[1], bytes(frames[2])[:-8]], frames[:2], [*frames, b"x" * 8]):
        planned, _ = _answer(worker, bad)
        plain, _ = _answer(fresh, bad)
        assert planned["t"] == "error" and planned["kind"] == "bad_request"
        assert planned == plain


def test_a_plan_is_its_principals_own(worker, monkeypatch):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b), ALICE)
    decoded = _counting_decode(monkeypatch)
    _answer(worker, _request(2, a, b), BOB)
    assert decoded  # Bob's same request is decoded in full
    assert worker.plans.find(BOB.name, _request(3, a, b), worker.max_bytes) is not None
    assert worker.plans.find("uid:9", _request(3, a, b), worker.max_bytes) is None


@pytest.mark.parametrize("extra", [{"keep": True}, {"shm_drop": []}, {"other": 1}])
def test_only_plain_calls_get_a_plan(worker, extra):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b, **extra))
    assert worker.plans.find(ALICE.name, _request(2, a, b, **extra), worker.max_bytes) is None


def test_an_input_with_a_fingerprint_gets_no_plan(worker):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    header = messages.call_header(1, "matmul", {"cdtype": "<f8"}, ["C"], [(np.float64, (2, 4))])
    frames = wire.encode(header, [a, b], fps=["0" * 32, None])
    _answer(worker, frames)
    assert worker.plans.find(ALICE.name, frames, worker.max_bytes) is None


def test_another_call_of_the_same_length_is_not_taken_for_the_plan(worker):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b))
    header, _ = _answer(worker, _request(2, a.T.copy(), b.T.copy()))  # (3, 2) @ (4, 3): refused
    assert header["t"] == "error"
    header, (r,) = _answer(worker, _request(3, np.ones((2, 3)), np.full((3, 4), 2.0)))
    np.testing.assert_array_equal(r, np.full((2, 4), 6.0))


def test_an_id_key_that_is_not_the_headers_id_makes_no_plan():
    header = {"v": 1, "t": "call", "id": 5, "op": "matmul", "params": {"cdtype": "<f8"}, "layouts": ["C"],
              "results": [], "arrays": []}
    raw = msgpack.packb(header)
    twice = b"\x89" + raw[1:] + msgpack.packb("id") + msgpack.packb(5)  # a second "id" after the first
    assert wire.decode_header(twice)["id"] == 5
    p = plans_mod.Plans()
    p.learn("uid:1", twice, wire.decode_header(twice), [], ([], [], []), 1 << 20)
    assert p.find("uid:1", [twice.replace(b"\xa2id\x05", b"\xa2id\x06", 1)], 1 << 20) is None


def test_plans_are_bounded(worker):
    worker.plans.limit = 3
    for n in range(1, 6):
        _answer(worker, _request(n, np.ones((n, 2)), np.ones((2, 2))))
    assert len(worker.plans._plans) == 3
    assert worker.plans.find(ALICE.name, _request(9, np.ones((5, 2)), np.ones((2, 2))), worker.max_bytes)
    assert worker.plans.find(ALICE.name, _request(9, np.ones((1, 2)), np.ones((2, 2))), worker.max_bytes) is None


def test_a_budget_changed_since_makes_the_plan_unused(worker, monkeypatch):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b))
    worker.max_bytes = 100  # the inputs alone are 112 bytes
    header, _ = _answer(worker, _request(2, a, b))
    assert header["t"] == "error" and header["kind"] == "bad_request"


def test_a_header_frame_past_the_plans_bound_is_decoded_and_refused_as_before(worker):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    _answer(worker, _request(1, a, b))
    assert worker.plans.find(ALICE.name, [bytearray(plans_mod.HEADER_MAX + 1)], worker.max_bytes) is None
    header, _ = _answer(worker, [zmq.Frame(b"\x00" * (wire.MAX_HEADER + 1))])
    assert header["t"] == "error" and header["kind"] == "bad_request"


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_plans_inputs_are_the_views_the_decoder_makes(worker, order):
    a, b = np.asarray(np.arange(6.0).reshape(2, 3), order=order), np.ones((3, 4))
    _answer(worker, _request(1, a, b))
    frames = [zmq.Frame(bytes(memoryview(f))) for f in _request(2, a, b)]
    _, planned, _ = worker.plans.find(ALICE.name, frames, worker.max_bytes)
    _, decoded = wire.decode(frames)
    for p, d in zip(planned, decoded):
        assert (p.dtype, p.shape, p.strides, p.ctypes.data) == (d.dtype, d.shape, d.strides, d.ctypes.data)
        assert (p.flags.writeable, p.flags.aligned) == (d.flags.writeable, d.flags.aligned)
    np.testing.assert_array_equal(planned[0], a)

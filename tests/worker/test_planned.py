"""D76: a planned plain call on a device-level backend is answered in one pass, with the bytes the
general path sends; whatever does not fit its plan, or fails, is answered as without it."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.forms import ResultForm
from fusion_shim.transport.principal import Principal
from fusion_shim.worker import planned, server
from fusion_shim.worker.backend import TorchBackend
from fusion_shim.worker.kernels import KERNELS

ALICE = Principal("uid:1001", 1001)


def _worker(kernels: dict | None = None) -> server.Worker:
    return server.Worker("cpu", backend=TorchBackend("cpu"), kernels=kernels or dict(KERNELS))


def _request(rid: int, a: np.ndarray, b: np.ndarray, layout: str = "C") -> list:
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, [layout], [(np.float64, (a.shape[0], b.shape[1]))])
    return wire.encode(header, [a, b])


def _bytes(frames: list) -> list:
    return [bytes(memoryview(f)) for f in frames]


def _no_clock(monkeypatch) -> None:
    """Every phase 0.0 on both paths, so that their replies can be compared byte for byte."""
    monkeypatch.setattr(server.time, "perf_counter", lambda: 0.0)  # the time module: the backend's clock too


def _count_passes(monkeypatch) -> list:
    passes: list = []
    real = planned.answer

    def answer(*args):
        out = real(*args)
        passes.append(out is not None)
        return out

    monkeypatch.setattr(planned, "answer", answer)
    return passes


@pytest.mark.parametrize("layout", ["C", "F"])
def test_a_planned_reply_has_the_general_paths_bytes(monkeypatch, layout):
    _no_clock(monkeypatch)
    w = _worker()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 4))
    passes = _count_passes(monkeypatch)
    general = _bytes(w.handle(_request(7, a, b, layout), ALICE))
    fast = _bytes(w.handle(_request(7, a, b, layout), ALICE))
    assert passes == [True]  # the first call made the plan, the second was answered from it
    assert fast == general
    header, (r,) = wire.decode(fast)
    assert header["t"] == "result" and header["arrays"][0]["order"] == ("C" if layout == "C" else "F")
    np.testing.assert_allclose(r, a @ b)


def test_each_planned_reply_carries_its_own_id_and_phases():
    w = _worker()
    a, b = np.ones((2, 3)), np.ones((3, 4))
    w.handle(_request(1, a, b), ALICE)
    for rid in (2, 300, 2**40):
        header, (r,) = wire.decode(w.handle(_request(rid, a, b), ALICE))
        assert header["id"] == rid
        assert set(header["timing"]) == {"h2d", "kernel", "d2h"}
        assert all(isinstance(v, float) and v >= 0 for v in header["timing"].values())
        assert header["evicted"] == [] and header["kept"] == []
        np.testing.assert_array_equal(r, np.full((2, 4), 3.0))


def test_the_fixed_bytes_are_what_msgpack_makes_of_the_header():
    declared = [(np.dtype("<f8"), (2, 4)), (np.dtype("<i8"), ())]
    out = [np.zeros((2, 4)), np.asarray(5)]
    timing = {"h2d": 1e-6, "kernel": 2.5e-5, "d2h": 3e-7}
    for resident, extra in ((True, {"evicted": [], "kept": []}), (False, {})):
        frames = ResultForm(declared, resident).frames(123456, timing, out)
        expected = messages.result(123456, timing, out, **extra).frames()
        assert _bytes(frames) == _bytes(expected)
        assert msgpack.unpackb(frames[0])["id"] == 123456


@pytest.mark.parametrize("n,poison", [(32, None), (32, np.nan), (32, np.inf), (64, None), (8, None), (512, None)])
def test_finite_is_said_exactly_where_every_result_is_finite_and_in_the_window_on_both_paths(monkeypatch, n, poison):
    """D354: the general path's reply and the planned one's agree byte for byte, ``finite`` or not."""
    _no_clock(monkeypatch)
    w, passes = _worker(), _count_passes(monkeypatch)
    a, b = np.ones((n, n)), np.ones((n, n))
    if poison is not None:
        a[n - 1, n - 1] = poison
    general = _bytes(w.handle(_request(7, a, b), ALICE))
    fast = _bytes(w.handle(_request(7, a, b), ALICE))
    assert passes == [True] and fast == general
    header, (r,) = wire.decode(fast)
    in_window = messages.FINITE_SCAN_MIN <= r.nbytes <= messages.FINITE_SCAN_MAX
    assert header.get("finite") is (True if in_window and np.isfinite(r).all() else None), (n, poison)
    np.testing.assert_array_equal(r, a @ b)


def test_results_other_than_declared_are_left_to_the_general_path():
    reply = ResultForm([(np.dtype("<f8"), (2, 2))], True)
    timing = {"h2d": 0.0, "kernel": 0.0, "d2h": 0.0}
    assert reply.frames(1, timing, [np.zeros((2, 3))]) is None
    assert reply.frames(1, timing, [np.zeros((2, 2), np.float32)]) is None
    assert reply.frames(1, timing, [np.zeros((2, 4))[:, ::2]]) is None  # neither C nor F ordered
    assert reply.frames(1, timing, []) is None


def test_a_planned_call_that_raises_is_answered_as_the_general_path_answers_it():
    calls: list = []

    def flaky(t: list, p: dict) -> list:
        calls.append(1)
        if len(calls) >= 2:
            raise RuntimeError("the second call fails")
        return [torch.matmul(t[0], t[1])]

    w = _worker({"matmul": flaky})
    a, b = np.ones((2, 3)), np.ones((3, 4))
    assert wire.decode(w.handle(_request(1, a, b), ALICE))[0]["t"] == "result"
    header, _ = wire.decode(w.handle(_request(2, a, b), ALICE))
    assert header["t"] == "error" and header["kind"] == "kernel_error" and header["id"] == 2
    assert "second call fails" in header["msg"]


def test_frames_that_do_not_fit_the_plan_are_refused_as_without_it():
    w, fresh = _worker(), _worker()
    a, b = np.ones((2, 3)), np.ones((3, 4))
    w.handle(_request(1, a, b), ALICE)
    frames = _request(2, a, b)
    for bad in ([frames[0], frames[1], bytes(frames[2])[:-8]], frames[:2], [*frames, b"x" * 8]):
        planned_reply = wire.decode(w.handle(bad, ALICE))[0]
        general = wire.decode(fresh.handle(bad, ALICE))[0]
        assert planned_reply["t"] == "error" and planned_reply["kind"] == "bad_request"
        assert planned_reply == general


def test_a_plan_is_its_principals_own(monkeypatch):
    w = _worker()
    a, b = np.ones((2, 3)), np.ones((3, 4))
    w.handle(_request(1, a, b), ALICE)
    passes = _count_passes(monkeypatch)
    w.handle(_request(2, a, b), Principal("uid:1002", 1002))
    assert passes == []  # the other principal's request met no plan, so it was decoded in full

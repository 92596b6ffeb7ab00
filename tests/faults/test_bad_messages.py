"""A worker sent garbage, and one that answers garbage, a wrong result, a stray or late reply, an
error or out of memory, or fails its health check: each call still returns NumPy's answer, recorded
as ``fallback`` with its reason. NumPy's own errors reach the program unchanged; strict mode turns a
fallback into FallbackError.

The worker that misbehaves on purpose is a fake ZeroMQ ROUTER in a thread of this process, or the
real server loop with a broken kernel (tests/helpers/faultlab.py's NumPy worker).
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter

import msgpack
import numpy as np
import pytest
import zmq

import fusion_shim
from fusion_shim import transport
from fusion_shim.protocol import messages, wire
from fusion_shim.errors import FallbackKind
from fusion_shim.protocol.skeleton import Skeleton
from fusion_shim.intercept import bypassed

from tests.helpers import faultlab as _faultlab
from tests.helpers.faults import events, install, last, operands, records, rng_matrix
from tests.helpers.shims import READY_S


pytestmark = pytest.mark.usefixtures("no_shim_after")  # conftest: no shim before or after each test


# -- garbage sent to a worker -----------------------------------------------------------------------

def _header(**fields) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def _call(rid: int, op: str = "matmul", arrays=None, params=None, layouts=None, **extra) -> list:
    a = np.ones((2, 3))
    b = np.ones((3, 2))
    metas = [{"dtype": "<f8", "shape": [2, 3], "order": "C"}, {"dtype": "<f8", "shape": [3, 2], "order": "C"}]
    header = {"v": 1, "t": "call", "id": rid, "op": op,
              "params": {"cdtype": "<f8"} if params is None else params,
              "layouts": ["C"] if layouts is None else layouts,
              "arrays": metas if arrays is None else arrays,
              "results": [{"dtype": "<f8", "shape": [2, 2]}], **extra}
    return [_header(**header), a.tobytes(), b.tobytes()]


GARBAGE = {
    "empty frame": [b""],
    "not msgpack": [b"\xc1\xc1 this is not msgpack \xff\x00"],
    "header is a list": [msgpack.packb([1, "call", 3])],
    "header is an int": [msgpack.packb(7)],
    "binary in header": [msgpack.packb({"v": 1, "t": "hello", "id": 1, "x": b"\x00" * 10}, use_bin_type=True)],
    "oversized header": [msgpack.packb({"v": 1, "t": "hello", "id": 1, "pad": "x" * (wire.MAX_HEADER + 10)})],
    "wrong version": [_header(v=2, t="hello", id=11)],
    "no version": [_header(t="hello", id=12)],
    "no type": [_header(v=1, id=13)],
    "unknown type": [_header(v=1, t="shutdown", id=14)],
    "a reply type": [_header(v=1, t="result", id=15)],
    "no id": [_header(v=1, t="hello")],
    "negative id": [_header(v=1, t="hello", id=-1)],
    "string id": [_header(v=1, t="hello", id="1")],
    "huge shape, tiny buffer": [_header(v=1, t="call", id=20, op="matmul", params={"cdtype": "<f8"}, layouts=["C"],
                                        arrays=[{"dtype": "<f8", "shape": [1 << 40, 1 << 40], "order": "C"}]),
                                b"\x00" * 16],
    "negative shape": _call(21, arrays=[{"dtype": "<f8", "shape": [-2, -3], "order": "C"},
                                        {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "rank over limit": _call(22, arrays=[{"dtype": "<f8", "shape": [1] * 65, "order": "C"},
                                         {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "shape not a list": _call(23, arrays=[{"dtype": "<f8", "shape": "2x3", "order": "C"},
                                          {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "object dtype": _call(24, arrays=[{"dtype": "|O", "shape": [2, 3], "order": "C"},
                                      {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "float128 dtype": _call(25, arrays=[{"dtype": "<f16", "shape": [1, 3], "order": "C"},
                                        {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "big-endian dtype": _call(26, arrays=[{"dtype": ">f8", "shape": [2, 3], "order": "C"},
                                          {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "bad order": _call(27, arrays=[{"dtype": "<f8", "shape": [2, 3], "order": "Z"},
                                   {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "meta not a map": _call(28, arrays=["<f8", {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "more metas than buffers": _call(29)[:2],
    "arrays not a list": _call(30, arrays={"dtype": "<f8"}),
    "unknown op": _call(31, op="linalg.frobnicate"),
    "op missing": [_header(v=1, t="call", id=32, params={"cdtype": "<f8"}, layouts=["C"])],
    "op unhashable": _call(33, op=["matmul"]),
    "params missing": [_header(v=1, t="call", id=34, op="matmul", layouts=["C"])],
    "cdtype missing": _call(35, params={}),
    "cdtype object": _call(36, params={"cdtype": "|O"}),
    "cdtype unhashable": _call(37, params={"cdtype": ["<f8"]}),
    "layouts missing": [_header(v=1, t="call", id=38, op="matmul", params={"cdtype": "<f8"})],
    "layout not a permutation": _call(39, layouts=[[0, 0]]),
    "layout garbage": _call(40, layouts=[["a", "b"]]),
    "too many layouts": _call(41, layouts=["C", "C"]),
    "shapes not aligned": _call(42, arrays=[{"dtype": "<f8", "shape": [3, 2], "order": "C"},
                                            {"dtype": "<f8", "shape": [3, 2], "order": "C"}]),
    "one operand only": [_header(v=1, t="call", id=43, op="matmul", params={"cdtype": "<f8"}, layouts=["C"],
                                 arrays=[{"dtype": "<f8", "shape": [2, 3], "order": "C"}]),
                         np.ones((2, 3)).tobytes()],
}


def _raw_request(sock: zmq.Socket, frames: list, timeout_s: float = 60) -> tuple[dict, list]:
    sock.send_multipart(frames)
    assert sock.poll(int(timeout_s * 1000)), "the worker did not answer"
    return wire.decode(sock.recv_multipart())


def test_garbage_to_worker_gets_error_replies(live_worker):
    proc, url = live_worker
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    try:
        header, _ = _raw_request(sock, [_header(v=1, t="hello", id=1)], READY_S)  # waits out the warm-up
        assert header["t"] == "ready" and header["id"] == 1 and header["pid"] == proc.pid
        for name, frames in GARBAGE.items():
            header, arrays = _raw_request(sock, frames)
            assert header["t"] == "error", (name, header)
            assert header["kind"] in wire.ERROR_KINDS and header["msg"], (name, header)
            assert arrays == []
            assert proc.poll() is None, f"the worker died on {name!r}"
        # ids of readable requests come back, so a client can match the error to its call
        assert _raw_request(sock, GARBAGE["unknown op"])[0]["kind"] == "unknown_op"
        assert _raw_request(sock, GARBAGE["unknown op"])[0]["id"] == 31
        assert _raw_request(sock, GARBAGE["wrong version"])[0]["kind"] == "version"
        # and a good raw call still gets a right answer
        header, arrays = _raw_request(sock, _call(99))
        assert header["t"] == "result" and header["id"] == 99
        np.testing.assert_array_equal(arrays[0], np.full((2, 2), 3.0))
    finally:
        sock.close(0)
        ctx.term()
    assert proc.poll() is None

    # a good call through the shim still runs on the worker
    rt = install(url)
    a, b, want = operands(5)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker", records(rt)[-1]


# -- NumPy's own errors under policy remote ----------------------------------------------------------

def test_numpy_user_errors_reach_the_program_unchanged(live_worker):
    _, url = live_worker
    singular = np.zeros((4, 4))
    with pytest.raises(np.linalg.LinAlgError) as plain:
        np.linalg.solve(singular, np.ones(4))
    with pytest.raises(ValueError) as plain_shape:
        np.matmul(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(np.linalg.LinAlgError) as plain_inv:
        np.linalg.inv(np.ones((3, 3)))

    rt = install(url)
    assert rt.link.wait_ready(READY_S)
    with pytest.raises(np.linalg.LinAlgError) as shimmed:
        np.linalg.solve(singular, np.ones(4))
    assert type(shimmed.value) is type(plain.value) and str(shimmed.value) == str(plain.value)
    rec = records(rt, "numpy.linalg.solve")[-1]
    assert rec.raised == "LinAlgError" and rec.kind == "raised", rec  # the program's error, not a fallback (D281)

    with pytest.raises(np.linalg.LinAlgError) as shimmed_inv:
        np.linalg.inv(np.ones((3, 3)))
    assert str(shimmed_inv.value) == str(plain_inv.value)

    with pytest.raises(ValueError) as shimmed_shape:
        np.matmul(np.ones((2, 3)), np.ones((2, 3)))
    assert type(shimmed_shape.value) is type(plain_shape.value)
    assert str(shimmed_shape.value) == str(plain_shape.value)
    rec = records(rt)[-1]
    assert rec.kind == "raised" and rec.raised == "ValueError", rec

    # the worker is still up and serving
    a, b, want = operands(6)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker"


# -- a worker that answers wrongly ----------------------------------------------------------------

class FakeWorker:
    """A ROUTER that says ``ready`` like a real worker and answers ``call`` as ``mode`` says."""

    def __init__(self, url: str):
        self.url = url
        self.mode = "ok"
        self.calls = 0
        self.held: tuple[int, np.ndarray] | None = None  # "late" mode: a reply kept back
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-worker", daemon=True)
        self._thread.start()
        assert self._bound.wait(10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _serve(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.url)
        self._bound.set()
        try:
            with bypassed():  # its own `@` must not go through the shim under test (to itself)
                self._loop(sock)
        finally:
            sock.close(0)
            ctx.term()

    def _loop(self, sock) -> None:
        while not self._stop.is_set():
            if not sock.poll(20):
                continue
            ident, *frames = sock.recv_multipart()
            try:
                header, arrays = wire.decode(frames)
            except wire.WireError:
                continue  # the shim only sends well-formed requests; nothing to answer here
            for reply in self._answer(header, arrays):
                sock.send_multipart([ident, *[bytes(memoryview(f)) for f in reply]])

    def _answer(self, header: dict, arrays: list) -> list[list]:
        rid = header["id"]
        if header["t"] == "hello":
            return [wire.encode({"t": "ready", "id": rid, "pid": os.getpid(), "device": "cpu", "torch": "x",
                                 "bench": {}})]
        self.calls += 1
        if header["op"] != "matmul":
            return [wire.encode({"t": "error", "id": rid, "kind": "kernel_error", "exc": "RuntimeError",
                                 "msg": "fake worker: matmul only"})]
        right = arrays[0] @ arrays[1]
        mode = self.mode
        if mode == "ok":
            return [wire.encode({"t": "result", "id": rid, "timing": {}}, [right])]
        if mode == "garbage":
            return [[b"\xc1 garbage \xff"]]
        if mode == "wrong_shape":
            return [wire.encode({"t": "result", "id": rid}, [np.zeros(right.shape[::-1] + (1,))])]
        if mode == "wrong_dtype":
            return [wire.encode({"t": "result", "id": rid}, [right.astype(np.float32)])]
        if mode == "two_results":
            return [wire.encode({"t": "result", "id": rid}, [right, right])]
        if mode == "no_results":
            return [wire.encode({"t": "result", "id": rid})]
        if mode == "short_buffer":
            meta, _ = wire.to_wire(right)
            return [[msgpack.packb({"v": 1, "t": "result", "id": rid, "arrays": [meta]}), b"\x00" * 8]]
        if mode == "wrong_version":
            return [[msgpack.packb({"v": 9, "t": "result", "id": rid, "arrays": []})]]
        if mode == "ready_to_call":
            return [wire.encode({"t": "ready", "id": rid, "pid": 1, "device": "cpu", "torch": "x", "bench": {}})]
        if mode == "error":
            return [wire.encode({"t": "error", "id": rid, "kind": "kernel_error", "exc": "RuntimeError",
                                 "msg": "fake worker failed on purpose"})]
        if mode == "out_of_memory":
            return [wire.encode({"t": "error", "id": rid, "kind": "out_of_memory", "exc": "OutOfMemoryError",
                                 "msg": "CUDA out of memory (fake)"})]
        if mode in ("busy", "refused"):  # the worker's own error kinds for a full inbox, a refused request
            return [wire.encode({"t": "error", "id": rid, "kind": mode, "exc": "Fake", "msg": f"fake {mode}"})]
        if mode == "decoy":  # a stray reply with an earlier id and a wrong answer, then the real one
            return [wire.encode({"t": "result", "id": rid - 1}, [right + 1.0]),
                    wire.encode({"t": "result", "id": rid}, [right])]
        if mode == "late":  # the first call is never answered in time; its reply comes with the next
            if self.held is None:
                self.held = (rid, right)
                return []
            old_rid, old_right = self.held
            self.held = None
            return [wire.encode({"t": "result", "id": old_rid}, [old_right]),
                    wire.encode({"t": "result", "id": rid}, [right])]
        raise AssertionError(f"unknown mode {mode}")


@pytest.fixture
def fake(sock_dir):
    f = FakeWorker(f"ipc://{sock_dir}/fake.sock")
    yield f
    f.close()


BAD_REPLIES = {
    "garbage": "BadReply",
    "wrong_shape": "BadReply: result float64[30, 30, 1], expected float64[30, 30]",
    "wrong_dtype": "BadReply: result float32",
    "two_results": "BadReply: 2 results, expected 1",
    "no_results": "BadReply: 0 results, expected 1",
    "short_buffer": "BadReply: buffer holds 8 bytes",
    "wrong_version": "BadReply: wire version 9",
    "ready_to_call": "BadReply: a call answered with 'ready'",
    "error": "WorkerFault: worker raised RuntimeError (kernel_error): fake worker failed on purpose",
    "out_of_memory": "WorkerFault: worker raised OutOfMemoryError (out_of_memory)",
    "busy": "WorkerFault: worker raised Fake (busy): fake busy",
    "refused": "WorkerFault: worker raised Fake (refused): fake refused",
}
# D323: each bad reply's fallback kind, on its record and in the report's counts
BAD_REPLY_KINDS = {**{mode: "bad_reply" for mode in BAD_REPLIES}, "error": "worker_fault",
                   "out_of_memory": "out_of_memory", "busy": "busy", "refused": "refused"}


def test_wrong_answers_from_a_worker_are_computed_locally(fake):
    rt = install(fake.url, timeout=5.0, ready_timeout=10.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(7, n=30, m=20)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
    assert records(rt)[-1].kind == "worker"  # the fake works when it means to
    for i, (mode, reason) in enumerate(BAD_REPLIES.items()):
        fake.mode = mode
        a, b, want = operands(100 + i, n=30, m=20)
        t = time.monotonic()
        got = np.matmul(a, b)
        assert time.monotonic() - t < 5.0, mode  # a bad reply is recognised before the deadline, no timeout
        np.testing.assert_array_equal(got, want)
        rec = records(rt)[-1]
        assert rec.kind == "fallback", (mode, rec)
        assert rec.reason.startswith(reason), (mode, rec.reason)
        assert rec.fallback == BAD_REPLY_KINDS[mode], (mode, rec.fallback)
        # the link recovers: once the background probe has its answer, calls go to the worker again
        # (a call never waits for a worker that faulted, issue 8; it runs locally meanwhile)
        fake.mode = "ok"
        assert rt.link.wait_ready(READY_S), (mode, events(rt))
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
        assert records(rt)[-1].kind == "worker", (mode, records(rt)[-1])
    rep = fusion_shim.report(format="json")
    assert rep["ops"]["numpy.matmul"]["fallback"] == len(BAD_REPLIES)
    assert len(rep["ops"]["numpy.matmul"]["reasons"]) == len(BAD_REPLIES)
    by_kind = {"bad_reply": 8, "worker_fault": 1, "out_of_memory": 1, "busy": 1, "refused": 1}
    assert rep["ops"]["numpy.matmul"]["fallbacks_by_kind"] == by_kind == Counter(BAD_REPLY_KINDS.values())
    assert rep["summary"]["fallbacks_by_kind"] == by_kind
    assert events(rt).count("worker fault: BadReply") == sum(r.startswith("BadReply") for r in BAD_REPLIES.values())


REPEATED_BAD = ("garbage", "wrong_shape", "wrong_dtype", "two_results", "short_buffer", "wrong_version", "error")


@pytest.fixture
def skeleton_reads(monkeypatch) -> list:
    """Per reply offered to a skeleton, whether it was read from it."""
    read, reads = Skeleton.read, []

    def counted(self, frames, rid):
        got = read(self, frames, rid)
        reads.append(got is not None)
        return got

    monkeypatch.setattr(Skeleton, "read", counted)
    return reads


def test_wrong_answers_to_repeated_calls_are_computed_locally(fake, skeleton_reads):
    """D48: a template's calls, their replies read from its skeleton once one is learnt; a reply
    that is not the skeleton's is decoded in full and refused there, as any call's."""
    reads = skeleton_reads
    rt = install(fake.url, timeout=5.0, ready_timeout=10.0, residency=False)
    assert rt.link.wait_ready(READY_S), events(rt)
    for seed in range(3):
        a, b, want = operands(500 + seed, n=30, m=20)
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
        assert records(rt)[-1].kind == "worker"
    assert reads == [False, True]  # the second call's reply taught it, the third's was read from it
    for i, mode in enumerate(REPEATED_BAD):
        fake.mode = mode
        a, b, want = operands(600 + i, n=30, m=20)
        np.testing.assert_array_equal(np.matmul(a, b), want)
        assert reads[-1] is False, mode  # not read from the skeleton: decoded in full
        rec = records(rt)[-1]
        assert rec.kind == "fallback" and rec.reason.startswith(BAD_REPLIES[mode]), (mode, rec)
        fake.mode = "ok"
        assert rt.link.wait_ready(READY_S), (mode, events(rt))
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
        assert records(rt)[-1].kind == "worker" and records(rt)[-1].repeated, (mode, records(rt)[-1])
        assert reads[-1] is True, mode


@pytest.mark.parametrize("mode", ["wrong_shape", "wrong_dtype"])
def test_a_skeleton_learns_only_from_an_accepted_result(fake, skeleton_reads, mode):
    """D49: a reply read from a skeleton skips the result checks, so a skeleton learns only from a
    reply that passed them: a template whose every reply has the wrong results never gets one."""
    reads = skeleton_reads
    rt = install(fake.url, timeout=5.0, ready_timeout=10.0, residency=False)
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(700, n=30, m=20)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)  # makes the template
    fake.mode = mode
    for seed in range(4):
        a, b, want = operands(710 + seed, n=30, m=20)
        np.testing.assert_array_equal(np.matmul(a, b), want)
        rec = records(rt)[-1]
        assert rec.kind == "fallback" and rec.reason.startswith(BAD_REPLIES[mode]), (seed, rec)
        assert rt.link.wait_ready(READY_S), events(rt)
    assert reads and not any(reads)  # every one decoded in full and refused there
    fake.mode = "ok"
    for seed in range(2):
        a, b, want = operands(720 + seed, n=30, m=20)
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
        assert records(rt)[-1].kind == "worker" and records(rt)[-1].repeated
    assert reads[-2:] == [False, True]  # the first good reply taught it, the next was read from it


def test_replies_are_matched_by_id(fake):
    rt = install(fake.url, timeout=5.0, ready_timeout=10.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    fake.mode = "decoy"
    for seed in range(3):
        a, b, want = operands(200 + seed, n=30, m=20)
        np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)
        assert records(rt)[-1].kind == "worker"


# -- a reply that comes too late ---------------------------------------------------------------------

def test_late_reply_does_not_answer_the_next_call(fake):
    rt = install(fake.url, timeout=0.5, ready_timeout=10.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    fake.mode = "late"
    a, b, want = operands(300, n=30, m=20)
    np.testing.assert_array_equal(np.matmul(a, b), want)
    rec = records(rt)[-1]
    assert rec.kind == "fallback" and rec.reason.startswith("Timeout") and rec.fallback == "timeout", rec
    assert fusion_shim.report(format="json")["summary"]["fallbacks_by_kind"] == {"timeout": 1}
    # the next call, same shapes: its reply comes right after the late reply to the first call
    assert rt.link.wait_ready(READY_S), events(rt)  # after a fault calls run locally until the probe answers
    c, d, want2 = operands(301, n=30, m=20)
    np.testing.assert_allclose(np.matmul(c, d), want2, rtol=1e-12)
    assert records(rt)[-1].kind == "worker"
    assert fake.held is None  # the late reply was sent, and dropped


def test_channel_drops_replies_to_abandoned_requests(fake):
    fake.mode = "late"
    chan = transport.Channel(fake.url)
    try:
        a, b, want = operands(400, n=8, m=5)
        req = messages.Request({"t": "call", "id": 1, "op": "matmul", "params": {"cdtype": "<f8"}, "layouts": ["C"]},
                               [wire.to_wire(a), wire.to_wire(b)])
        with pytest.raises(transport.Timeout):
            chan.request(req, time.monotonic() + 0.3)
        req = messages.Request({"t": "call", "id": 2, "op": "matmul", "params": {"cdtype": "<f8"}, "layouts": ["C"]},
                               [wire.to_wire(b.T.copy()), wire.to_wire(a.T.copy())])
        header, arrays = chan.request(req, time.monotonic() + 5)[:2]
        assert header["id"] == 2
        np.testing.assert_allclose(arrays[0], want.T, rtol=1e-12)
    finally:
        chan.close()


# -- strict mode ----------------------------------------------------------------------------------------

def test_strict_mode_turns_a_fallback_into_an_error(fake, sock_dir):
    from fusion_shim.errors import FallbackError

    assert fusion_shim.FallbackError is FallbackError
    rt = install(fake.url, strict=True, timeout=5.0, ready_timeout=10.0)
    assert rt.link.wait_ready(READY_S), events(rt)
    a, b, want = operands(10, n=30, m=20)
    np.testing.assert_allclose(np.matmul(a, b), want, rtol=1e-12)  # no fallback, no error
    fake.mode = "error"
    with pytest.raises(fusion_shim.FallbackError, match="fallback") as raised:
        np.matmul(a, b)
    assert records(rt)[-1].kind == "fallback"
    # D323: the error carries the fallback's kind and its detail, and reads as both
    err = raised.value
    assert isinstance(err, RuntimeError) and err.kind is FallbackKind.WORKER_FAULT, err.kind
    assert "fake worker failed on purpose" in err.detail and "numpy.matmul at " in err.detail, err.detail
    assert str(err) == f"worker_fault: {err.detail}"
    # NumPy's own errors stay NumPy's: strict only speaks for calls that would have succeeded
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(np.zeros((3, 3)), np.ones(3))
    fusion_shim.uninstall()

    install(f"ipc://{sock_dir}/nobody.sock", strict=True, ready_timeout=0.5)
    with pytest.raises(fusion_shim.FallbackError) as raised:
        np.matmul(a, b)
    assert raised.value.kind is FallbackKind.NO_WORKER_READY, raised.value
    # an argument the worker cannot take is a fallback too, under strict
    fusion_shim.uninstall()
    rt = install(fake.url, strict=True, timeout=5.0, ready_timeout=10.0)
    assert rt.link.wait_ready(READY_S)
    with pytest.raises(fusion_shim.FallbackError, match="unsupported") as raised:
        np.matmul(a.astype(object), b)
    assert raised.value.kind is FallbackKind.UNSUPPORTED and "object" in raised.value.detail, raised.value


# -- out of memory (SIMULATED: the backend raises torch's OutOfMemoryError) ------------------------------

def test_out_of_memory_is_retried_once_then_runs_locally():
    import torch

    from fusion_shim.worker import serve_in_thread

    worker = _faultlab.numpy_worker()
    backend = worker.backend
    run = backend.run
    state = {"fail": 0, "freed": 0}

    def flaky_run(*args):
        if state["fail"]:
            state["fail"] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return run(*args)

    def free_memory():
        state["freed"] += 1

    backend.run, backend.free_memory = flaky_run, free_memory
    url = f"inproc://oom-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=worker)
    a = rng_matrix(6)
    want = a @ a
    try:
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=20.0, ready_timeout=10.0)
        assert rt.link.wait_ready(READY_S), events(rt)
        state["fail"] = 1  # the retry after freeing succeeds
        np.testing.assert_allclose(np.matmul(a, a), want)
        rec = last(rt)
        assert rec.kind == "worker" and state["freed"] == 1, (rec, state)
        assert "retry succeeded" in events(rt)
        state["fail"] = 2  # the retry fails too: an error reply, and the call runs here
        np.testing.assert_allclose(np.matmul(a, a), want)
        rec = last(rt)
        assert rec.kind == "fallback" and "(out_of_memory)" in rec.reason, rec.reason
        assert state["freed"] == 2 and state["fail"] == 0
        # an error reply is about that call: the worker stays ready and takes the next one
        np.testing.assert_allclose(np.matmul(a, a), want)
        assert last(rt).kind == "worker"
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(5)


def test_out_of_memory_detection():
    import torch

    from fusion_shim.worker.memory import is_oom as _is_oom

    assert _is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert _is_oom(MemoryError())
    assert _is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not _is_oom(RuntimeError("linalg.inv: The diagonal element 2 is zero"))


# -- the health probe does device work --------------------------------------------------------------------

def test_health_probe_catches_a_worker_that_computes_wrong():
    import msgpack
    import zmq

    from fusion_shim.protocol import wire
    from fusion_shim.worker import serve_in_thread

    worker = _faultlab.numpy_worker()
    good = worker.kernels["matmul"]
    worker.kernels["matmul"] = lambda t, p: [good(t, p)[0] + 1e-9]  # SIMULATED silently broken device
    url = f"inproc://sick-{os.getpid()}"
    thread, stop = serve_in_thread(url, worker=worker)
    try:
        sock = transport.context().socket(zmq.DEALER)
        sock.connect(url)
        sock.send(msgpack.packb({"v": 1, "t": "hello", "id": 5}))
        assert sock.poll(10000)
        header, _ = wire.decode(sock.recv_multipart())
        assert header["t"] == "error" and header["kind"] == "unhealthy" and header["id"] == 5, header
        assert "health check" in header["msg"]

        a = rng_matrix(7)
        with bypassed():
            want = a @ a
        rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=5.0, ready_timeout=1.0)
        assert not rt.link.wait_ready(1.5)
        np.testing.assert_array_equal(np.matmul(a, a), want)  # computed here, right
        assert last(rt).kind == "fallback"
        assert "unhealthy" in events(rt), events(rt)

        worker.kernels["matmul"] = good  # repaired: the background probe finds a healthy worker
        assert rt.link.wait_ready(READY_S), events(rt)
        sock.send(msgpack.packb({"v": 1, "t": "hello", "id": 6}))
        assert sock.poll(10000)
        header, _ = wire.decode(sock.recv_multipart())
        assert header["t"] == "ready" and header["health_s"] > 0
        sock.close(0)
    finally:
        fusion_shim.uninstall()
        stop.set()
        thread.join(5)

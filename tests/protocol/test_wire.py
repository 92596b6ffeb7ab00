"""The wire format: round trips over awkward arrays (dask's list), and validation before trust."""
import msgpack
import numpy as np
import pytest

from fusion_shim.protocol import wire


def _awkward():
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5)
    yield base
    yield np.asfortranarray(base)
    yield base[:, ::2, 1:]                      # strided view
    yield base.transpose(2, 0, 1)               # permuted view
    yield base.astype(">f8")                    # byte-swapped
    yield np.broadcast_to(np.arange(3.0), (4, 3))  # zero stride
    yield np.array(3.5)                         # 0-d
    yield np.empty((0, 3))                      # empty
    yield (np.arange(8) + 1j * np.arange(8)).astype(np.complex64)
    yield np.array([True, False, True])
    yield np.arange(10, dtype=np.int32)[::3]


@pytest.mark.parametrize("arr", list(_awkward()), ids=lambda a: f"{a.dtype}{a.shape}")
def test_round_trip(arr):
    frames = wire.encode({"t": "result", "id": 7}, [arr])
    frames = [bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in frames]  # as received
    header, (back,) = wire.decode(frames)
    assert header["id"] == 7 and header["t"] == "result"
    assert back.shape == arr.shape
    assert back.dtype == arr.dtype.newbyteorder("=")
    np.testing.assert_array_equal(back, arr)


def test_contiguous_arrays_are_sent_without_copy():
    a = np.zeros((256, 256))
    f = np.asfortranarray(a)
    for arr in (a, f):
        meta, buf = wire.to_wire(arr)
        assert np.shares_memory(np.frombuffer(buf, np.uint8), arr)
    assert wire.to_wire(f)[0]["order"] == "F"


def test_received_arrays_are_writable_views():
    import zmq

    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://wire-test")
    b.connect("inproc://wire-test")
    try:
        arr = np.arange(1 << 16, dtype=np.float64)
        for frame in wire.encode({"t": "result", "id": 1}, [arr])[:-1]:
            a.send(frame, zmq.SNDMORE)
        a.send(wire.encode({"t": "result", "id": 1}, [arr])[-1], copy=False)
        _, (back,) = wire.decode(b.recv_multipart(copy=False))
        assert back.flags.writeable
        back[0] = 42.0
        assert back[0] == 42.0
    finally:
        a.close(0)
        b.close(0)


def _header(**fields):
    return msgpack.packb({"v": wire.VERSION, "t": "call", "id": 1, **fields})


@pytest.mark.parametrize("frames, message", [
    ([], "empty"),
    ([b"\xc1garbage"], "msgpack"),
    ([msgpack.packb([1, 2])], "not a map"),
    ([msgpack.packb({"v": 99, "t": "call", "id": 1})], "version"),
    ([msgpack.packb({"v": wire.VERSION, "t": "shutdown", "id": 1})], "unknown"),
    ([msgpack.packb({"v": wire.VERSION, "t": "call", "id": -1})], "request id"),
    ([_header(arrays=[{"dtype": "<f8", "shape": [2], "order": "C"}])], "1 array metas with data but 0"),
    ([_header(arrays=[{"dtype": "|O", "shape": [1], "order": "C"}]), b"\0" * 8], "dtype"),
    ([_header(arrays=[{"dtype": "<f8", "shape": [1 << 40, 1 << 40], "order": "C"}]), b"\0" * 8], "needs"),
    ([_header(arrays=[{"dtype": "<f8", "shape": [-1], "order": "C"}]), b"\0" * 8], ">= 0"),
    ([_header(arrays=[{"dtype": "<f8", "shape": [1], "order": "X"}]), b"\0" * 8], "order"),
    ([_header(arrays=[{"dtype": "<f8", "shape": [1] * 65, "order": "C"}]), b"\0" * 8], "at most"),
    ([_header(arrays="nope")], "must be a list"),
])
def test_invalid_messages_are_refused_before_allocation(frames, message):
    with pytest.raises(wire.WireError, match=message):
        wire.decode(frames)


def test_size_limit():
    frames = wire.encode({"t": "call", "id": 1}, [np.zeros(1024)])
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.decode(frames, max_bytes=1000)


def test_default_wire_path_imports_no_pickle():
    import subprocess
    import sys

    code = ("import sys, numpy, fusion_shim.protocol.wire, fusion_shim.transport, fusion_shim.client.runtime;"
            "bad = [m for m in ('pickle', 'cloudpickle', 'dill') if m in sys.modules and m not in before];"
            "print(bad)")
    pre = "import sys; before = set(sys.modules); import numpy; before = set(sys.modules);"
    out = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the messages: built and read in one place ---------------------------------------------------------

def _as_received(frames):
    return [bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in frames]


def test_a_hello_carries_its_shared_memory_offer_only_when_made():
    from fusion_shim.protocol import messages

    header, arrays = wire.decode(messages.hello(3).frames())
    assert header == {"v": wire.VERSION, "t": "hello", "id": 3, "arrays": []} and arrays == []
    offer = {"boot": "b", "probe": "fshm-1-2-3-p4", "token": "0" * 32}
    assert wire.decode(messages.hello(4, offer).frames())[0]["shm"] == offer


def test_a_call_header_declares_each_result_in_the_axis_order_it_travels():
    from fusion_shim.protocol import messages

    header = messages.call_header(9, "matmul", {"cdtype": "<f8"}, ["C", [1, 0, 2]],
                                  [(np.dtype("f8"), (2, 3)), (np.dtype("c16"), (4, 5, 6))])
    assert header == {"t": "call", "id": 9, "op": "matmul", "params": {"cdtype": "<f8"}, "layouts": ["C", [1, 0, 2]],
                      "results": [{"dtype": "<f8", "shape": [2, 3]}, {"dtype": "<c16", "shape": [5, 4, 6]}]}
    assert messages.call_header(9, "matmul", {}, ["C"], [("f4", (1,))], keep=True)["keep"] is True
    assert "keep" not in header
    decoded, _ = wire.decode(wire.encode(header, [np.zeros(2)]))
    assert wire.declared_results(decoded["results"], 1 << 20) == [(np.dtype("f8"), (2, 3)), (np.dtype("c16"), (5, 4, 6))]


def test_a_stats_request_names_the_segments_to_drop_only_when_there_are_some():
    from fusion_shim.protocol import messages

    assert "shm_drop" not in wire.decode(messages.stats_request(1).frames())[0]
    assert wire.decode(messages.stats_request(2, ["fshm-1-2-3-i4"]).frames())[0]["shm_drop"] == ["fshm-1-2-3-i4"]


def test_the_workers_replies_round_trip_and_take_late_keys_once():
    from fusion_shim.protocol import messages

    ready = messages.ready(1, {"pid": 5, "device": "cpu"}, 0.25, {"ok": True})
    header, _ = wire.decode(ready.frames(shm_mapped=["fshm-1-2-3-p4"]))
    assert header["t"] == "ready" and header["pid"] == 5 and header["shm"] == {"ok": True}
    assert header["health_s"] == 0.25 and header["shm_mapped"] == ["fshm-1-2-3-p4"]
    assert "shm" not in wire.decode(messages.ready(1, {}, 0.0).frames())[0]
    header, _ = wire.decode(messages.error(2, "missing", "KeyError", "gone", missing=["a" * 32]).frames())
    assert (header["t"], header["kind"], header["exc"], header["msg"], header["missing"]) == \
        ("error", "missing", "KeyError", "gone", ["a" * 32])
    header, _ = wire.decode(messages.stats(3, {"calls": 4}).frames())
    assert header["t"] == "stats" and header["calls"] == 4
    out = np.arange(6.0).reshape(2, 3)
    reply = messages.result(4, {"kernel": 0.5}, [out, out.T], fps=["b" * 32, None], kept=["c" * 32], evicted=[])
    header, (a, b) = wire.decode(_as_received(reply.frames()))
    assert header["t"] == "result" and header["timing"] == {"kernel": 0.5} and header["kept"] == ["c" * 32]
    assert header["arrays"][0]["fp"] == "b" * 32 and "fp" not in header["arrays"][1]
    np.testing.assert_array_equal(a, out)
    np.testing.assert_array_equal(b, out.T)


def test_a_result_placed_in_shared_memory_names_its_slot_instead_of_a_frame():
    from fusion_shim.protocol import messages

    slot = {"name": "fshm-1-2-3-o4", "offset": 0}
    frames = messages.result(5, {}, [np.zeros(4), np.ones(2)], locs=[slot, None]).frames()
    header = wire.decode_header(frames[0])
    assert header["arrays"][0]["shm"] == slot and "shm" not in header["arrays"][1]
    assert len(frames) == 2  # the header and the one result that travels as a frame


def test_read_timing_gives_the_workers_phases_kept_and_evicted():
    from fusion_shim.protocol import messages

    out = np.zeros((300, 300))
    header, _ = wire.decode(messages.result(
        6, {"h2d": 0.1, "kernel": 0.2, "d2h": 0.3, "fingerprint": 0.05, "oom_retry": 1.0, "other": 9.0},
        [out, out], fps=["d" * 32, None], kept=["e" * 32], evicted=["f" * 32]).frames())
    t = messages.read_timing(header)
    assert t.phases == {"h2d": 0.1, "kernel": 0.2, "d2h": 0.3} and t.fingerprint == 0.05 and t.oom_retry
    assert t.kept == {"e" * 32} and t.evicted == ("f" * 32,) and t.result_fps == ("d" * 32, None)
    bare = messages.read_timing({"t": "result", "id": 7, "timing": {"kernel": "fast"}})
    assert bare.phases == {} and bare.fingerprint == 0.0 and not bare.oom_retry
    assert bare.kept == frozenset() and bare.evicted == () and bare.result_fps == ()
    assert messages.read_timing({"t": "result", "id": 8, "timing": None}).phases == {}


def _variants():
    """Messages of one or two arrays, valid and each broken in one way the checks name."""
    good = {"dtype": "<f8", "shape": [2, 3], "order": "C"}
    buf = np.arange(6.0).tobytes()
    fp = "0123456789abcdef" * 2
    yield "valid", [good], [buf], 1 << 40
    yield "valid F, fp", [{**good, "order": "F", "fp": fp}], [buf], 1 << 40
    yield "valid two", [good, {"dtype": "|b1", "shape": [4], "order": "C"}], [buf, b"\x01\x00\x01\x00"], 1 << 40
    yield "valid 0-d", [{"dtype": "<i8", "shape": [], "order": "C"}], [np.int64(5).tobytes()], 1 << 40
    yield "valid empty", [{"dtype": "<f4", "shape": [0, 3], "order": "C"}], [b""], 1 << 40
    yield "ref false", [{**good, "ref": False}], [buf], 1 << 40
    for key, value in [("dtype", "<f16"), ("dtype", 8), ("shape", [2, -3]), ("shape", [True, 6]), ("shape", [2.0, 3]),
                       ("shape", (2, 3)), ("shape", [1] * 65), ("order", "A"), ("order", None), ("fp", "ABC"),
                       ("fp", fp.upper()), ("fp", 7)]:
        yield f"{key}={value!r}"[:40], [{**good, key: value}], [buf], 1 << 40
    yield "short frame", [good], [buf[:-8]], 1 << 40
    yield "missing frame", [good, good], [buf], 1 << 40
    yield "extra frame", [good], [buf, buf], 1 << 40
    yield "not a map", [["<f8", [6], "C"]], [buf], 1 << 40
    yield "over max_bytes", [good], [buf], 47
    yield "arrays not a list", {"0": good}, [buf], 1 << 40
    yield "a ref", [{**good, "ref": True, "fp": fp}], [], 1 << 40
    yield "shm unnegotiated", [{**good, "shm": {"name": "x", "offset": 0}}], [], 1 << 40


@pytest.mark.parametrize("kind", ["result", "call"])
@pytest.mark.parametrize("case", list(_variants()), ids=lambda c: c[0])
def test_the_one_pass_decode_answers_as_the_full_checks_do(case, kind, monkeypatch):
    """D41: where the one-pass path decodes a message, the full checks decode it the same; where
    they refuse one, it does too, with their words."""
    _, metas, bufs, max_bytes = case
    frames = [msgpack.packb({"v": 1, "t": kind, "id": 3, "arrays": metas}, use_bin_type=True), *bufs]

    def outcome():
        try:
            header, arrays = wire.decode(frames, max_bytes=max_bytes)
        except wire.WireError as exc:
            return "refused", str(exc)
        return header, [a if isinstance(a, wire.Ref) else (a.dtype, a.shape, a.flags.f_contiguous, a.tobytes())
                        for a in arrays]

    fast = outcome()
    monkeypatch.setattr(wire, "_plain_arrays", lambda *a: None)
    assert fast == outcome()

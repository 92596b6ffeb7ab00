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

"""D48: a template's reply read from its skeleton is what the full decode makes of it, or not read.

Differential: every reply here is also decoded in full (``wire.decode``, ``messages.read_timing``);
a reply the skeleton reads must give the same header fields, the same arrays (dtype, shape, strides,
flags, values) and the same Timing, and every reply it refuses is left to that decode.
"""
from __future__ import annotations

import math
import struct

import msgpack
import numpy as np
import pytest

from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.skeleton import LEARN_TRIES, Skeleton
from fusion_shim.protocol.forms import ResultForm

IDS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63]  # each msgpack width, both sides


def _planned(rid: int, timing: dict, out: list, resident: bool = True) -> list:
    """The worker's planned reply (the bytes a template's repeated call gets)."""
    return ResultForm([(r.dtype, r.shape) for r in out], resident).frames(rid, timing, out)


def _general(rid: int, timing: dict, out: list) -> list:
    """The worker's general reply to the same call."""
    return messages.result(rid, timing, out, evicted=[], kept=[]).frames()


def _learnt(frames: list) -> Skeleton:
    header, arrays = wire.decode(frames)
    skel = Skeleton()
    skel.learn(frames, header, arrays)
    assert skel.header is not None, header
    return skel


def _same_as_decoded(skel: Skeleton, frames: list, rid: int) -> bool:
    """Whether the skeleton reads ``frames`` (and then exactly as the full decode does)."""
    read = skel.read(frames, rid)
    if read is None:
        return False
    header, arrays = wire.decode(frames)
    assert header["id"] == rid and header["t"] == read[0]["t"] == "result"
    assert {k: v for k, v in header.items() if k not in ("id", "timing")} == {
        k: v for k, v in read[0].items() if k not in ("id", "timing")}
    assert read[2] == messages.read_timing(header)
    assert len(read[1]) == len(arrays)
    for got, want in zip(read[1], arrays):
        assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides)
        assert got.flags.writeable == want.flags.writeable and got.flags.aligned == want.flags.aligned
        np.testing.assert_array_equal(got, want)
    return True


RESULTS = {
    "0-d": [np.array(2.5)],
    "64x64": [np.arange(4096.0).reshape(64, 64)],
    "F-ordered": [np.asfortranarray(np.arange(12.0).reshape(3, 4))],
    "empty": [np.empty((0, 3))],
    "two": [np.arange(6, dtype=np.int32), np.ones((2, 2), np.complex64)],
}


@pytest.mark.parametrize("make", [_planned, _general], ids=["planned", "general"])
@pytest.mark.parametrize("name", list(RESULTS))
def test_a_repeated_reply_is_read_as_decoded(make, name):
    out = RESULTS[name]
    rng = np.random.default_rng(0)
    skel = _learnt(make(5, {"h2d": 1e-5, "kernel": 2e-4, "d2h": 3e-6}, out))
    for rid in IDS:
        times = {"h2d": float(rng.exponential(1e-4)), "kernel": float(rng.exponential(1e-3)), "d2h": 0.0}
        assert _same_as_decoded(skel, make(rid, times, out), rid), rid
        assert skel.read(make(rid, times, out), rid + 1) is None  # another request's reply


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1e-9, -0.0])
def test_an_impossible_time_is_left_to_the_full_decode(bad):
    out = RESULTS["64x64"]
    skel = _learnt(_planned(1, {"h2d": 1e-5, "kernel": 2e-4, "d2h": 3e-6}, out))
    frames = _planned(9, {"h2d": 1e-5, "kernel": bad, "d2h": 3e-6}, out)
    if bad == 0.0:  # -0.0 is >= 0: read_timing keeps it, and so does the skeleton
        assert _same_as_decoded(skel, frames, 9)
    else:
        assert skel.read(frames, 9) is None
        assert messages.read_timing(wire.decode(frames)[0]).rejected


def test_every_changed_byte_is_read_as_decoded_or_not_read():
    """One byte of the header changed anywhere, to each of a few values: a reply the skeleton still
    reads decodes (in full) to the same thing; the rest are not read."""
    out = RESULTS["64x64"]
    skel = _learnt(_planned(3, {"h2d": 1e-5, "kernel": 2e-4, "d2h": 3e-6}, out))
    header, body = _planned(300, {"h2d": 4e-5, "kernel": 1e-3, "d2h": 5e-6}, out)
    read = 0
    for i in range(len(header)):
        for value in (0x00, 0x7F, 0xCB, 0xFF, header[i] ^ 0x01):
            changed = header[:i] + bytes([value]) + header[i + 1:]
            if changed == header:
                continue
            try:
                wire.decode([changed, body])
            except wire.WireError:
                assert skel.read([changed, body], 300) is None
                continue
            read += _same_as_decoded(skel, [changed, body], 300)
    assert read > 0  # some bytes are a time's own: those replies are read, and as decoded


def test_a_frame_of_another_size_is_not_read():
    out = RESULTS["64x64"]
    skel = _learnt(_planned(3, {"kernel": 2e-4}, out))
    header, body = _planned(4, {"kernel": 2e-4}, out)
    assert skel.read([header, body], 4) is not None
    assert skel.read([header, bytes(memoryview(body))[:-8]], 4) is None
    assert skel.read([header], 4) is None
    assert skel.read([header, body, b""], 4) is None


NOT_LEARNT = {
    "an error": lambda: messages.error(1, "kernel_error", "RuntimeError", "no").frames(),
    "a fingerprint time": lambda: _general(1, {"kernel": 1e-4, "fingerprint": 1e-5}, RESULTS["0-d"]),
    "an int time": lambda: _general(1, {"kernel": 1}, RESULTS["0-d"]),
    "a time out of range": lambda: _general(1, {"kernel": -1.0}, RESULTS["0-d"]),
    "an oom retry": lambda: _general(1, {"kernel": 1e-4, "oom_retry": True}, RESULTS["0-d"]),
    "inputs kept": lambda: messages.result(1, {"kernel": 1e-4}, RESULTS["0-d"], kept=["ab" * 16]).frames(),
    "a result's fingerprint": lambda: messages.result(1, {}, RESULTS["0-d"], fps=["cd" * 16]).frames(),
    "another encoding": lambda: [b"\xde\x00\x04" + msgpack.packb({"v": 1, "t": "result", "id": 1, "arrays": []})[1:]],
}


@pytest.mark.parametrize("name", list(NOT_LEARNT))
def test_a_reply_that_is_not_plain_makes_no_skeleton(name):
    frames = NOT_LEARNT[name]()
    header, arrays = wire.decode(frames)
    skel = Skeleton()
    skel.learn(frames, header, arrays)
    assert skel.header is None and skel.tries == 1 and skel.learning
    assert skel.read(frames, 1) is None
    for _ in range(LEARN_TRIES - 1):
        skel.learn(frames, header, arrays)
    assert not skel.learning  # given up: its replies are decoded in full


def test_the_skeleton_cuts_at_the_values_own_bytes():
    """A time whose float64 bytes hold an id's or a key's bytes still reads as the time it is."""
    out = RESULTS["0-d"]
    tricky = struct.unpack(">d", b"?\xa2id\x05\xa6ti")[0]  # holds the id's key and value
    assert 0 < tricky < math.inf
    skel = _learnt(_planned(5, {"kernel": tricky}, out))
    assert _same_as_decoded(skel, _planned(6, {"kernel": 1e-3}, out), 6)
    assert _same_as_decoded(skel, _planned(7, {"kernel": tricky}, out), 7)


def test_a_skeleton_that_learnt_finite_reads_no_reply_that_does_not_say_it():
    """D354: the client skips its scan on ``finite`` read from a skeleton: only a reply saying it repeats it."""
    timing = {"h2d": 1e-5, "kernel": 2e-4, "d2h": 3e-6}
    clean, poisoned = np.ones((64, 64)), np.ones((64, 64))
    poisoned[5, 7] = np.nan
    said = _planned(1, timing, [clean])
    assert wire.decode(said)[0]["finite"] is True and "finite" not in wire.decode(_planned(2, timing, [poisoned]))[0]
    skel = _learnt(said)
    assert _same_as_decoded(skel, _planned(3, timing, [clean]), 3)
    assert skel.read(_planned(4, timing, [poisoned]), 4) is None

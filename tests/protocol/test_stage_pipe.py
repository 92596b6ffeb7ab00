"""The stage pipe is read as a client's message is: the worker checks what its stage process
answers before it reads or allocates a buffer (wire.py, "The stage pipe")."""
from __future__ import annotations

from multiprocessing import Pipe

import numpy as np
import pytest

from fusion_shim.protocol import messages, wire

MIB = 1 << 20


def _answer(metas, buffers):
    return {"ok": True, "raised": False, "nres": len(metas), "changed": [], "stage_s": 0.0, "note": "",
            "metas": metas}


def test_an_answer_round_trips_its_arrays_in_their_order():
    ours, theirs = Pipe()
    a, b = np.arange(12.0).reshape(3, 4), np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    wired = [wire.to_wire(x) for x in (a, b)]
    messages.send_stage_answer(theirs, _answer([m for m, _ in wired], None), [b"value", *(buf for _, buf in wired)])
    got = messages.recv_stage_answer(ours, MIB)
    assert got.value == b"value" and got.header["nres"] == 2
    np.testing.assert_array_equal(got.arrays[0], a)
    np.testing.assert_array_equal(got.arrays[1], b)
    assert got.arrays[1].dtype == np.int32 and got.arrays[1].flags.f_contiguous


def test_an_answer_declaring_more_than_the_budget_is_refused_before_a_buffer_is_read():
    ours, theirs = Pipe()
    huge = {"dtype": "<f8", "shape": [1 << 20, 1 << 10], "order": "C"}  # 8 GiB declared, nothing sent
    messages.send_stage_answer(theirs, _answer([huge], None), [])
    with pytest.raises(wire.WireError, match="over the limit"):
        messages.recv_stage_answer(ours, 64 * MIB)


def test_a_buffer_longer_or_shorter_than_its_meta_is_refused():
    meta = {"dtype": "<f8", "shape": [4], "order": "C"}
    ours, theirs = Pipe()
    messages.send_stage_answer(theirs, _answer([meta], None), [b"v", b"\0" * 4 * 8 * 1000])
    with pytest.raises(OSError):  # the pipe refuses a message past the length asked for
        messages.recv_stage_answer(ours, 64 * MIB)
    ours, theirs = Pipe()
    messages.send_stage_answer(theirs, _answer([meta], None), [b"v", b"\0" * 8])
    with pytest.raises(wire.WireError, match="needs 32"):
        messages.recv_stage_answer(ours, 64 * MIB)


def test_a_header_that_is_not_a_checked_map_is_refused():
    ours, theirs = Pipe()
    theirs.send_bytes(b"\x93\x01\x02\x03")  # a msgpack list
    with pytest.raises(wire.WireError, match="not a map"):
        messages.recv_stage_answer(ours, MIB)
    ours, theirs = Pipe()
    theirs.send_bytes(b"\x81\xa1k" + b"\xc6" + (2 * MIB).to_bytes(4, "big"))  # a bin of 2 MiB announced
    with pytest.raises((wire.WireError, OSError)):
        messages.recv_stage_answer(ours, MIB)

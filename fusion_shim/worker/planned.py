"""A planned plain call run and answered in one pass (D76).

A request that a plan answers (:mod:`.plans`, D75) needs nothing of the general path but its
kernel: every input is a frame or in a segment already open for its principal (read afresh by
:func:`segment_inputs`, D79) and none is tagged, so nothing is looked up, checked against a fingerprint or
kept, no segment is newly opened and no result has a slot. Its reply's header differs from
the last one of its plan in the id and the phases alone, so it is encoded from bytes made once per
plan: the same bytes ``msgpack.packb`` makes of the header the general path builds (a test
compares them). A call that raises, or whose results are not the declared ones in C or F order, is
left to the general path, which answers it as it answers any call.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from ..protocol import wire

_KEY = {k: msgpack.packb(k) for k in ("v", "t", "id", "timing", "evicted", "kept", "arrays")}
_EMPTY_LIST = msgpack.packb([])


class ReplyBytes:
    """The fixed bytes of a planned call's ``result`` header: its keys in the general path's order
    (``v``, ``t``, ``id``, ``timing``, then ``evicted`` and ``kept`` on a resident worker, ``arrays``)."""

    __slots__ = ("_metas", "declared", "head", "tail")

    def __init__(self, declared: list, resident: bool):
        self.declared = declared
        keys = 7 if resident else 5
        self.head = (bytes([0x80 | keys]) + _KEY["v"] + msgpack.packb(wire.VERSION) + _KEY["t"]
                     + msgpack.packb("result") + _KEY["id"])
        kept = _KEY["evicted"] + _EMPTY_LIST + _KEY["kept"] + _EMPTY_LIST if resident else b""
        self.tail = kept + _KEY["arrays"]
        self._metas: dict[tuple, bytes] = {}  # the packed metas per results' orders, made on first use

    def frames(self, rid: int, timing: dict, out: list) -> list | None:
        """The reply's frames, or None where a result is not as declared, C or F ordered and native."""
        if len(out) != len(self.declared):
            return None
        orders, bufs = [], []
        for r, (dt, shape) in zip(out, self.declared):
            if r.dtype != dt or r.shape != shape or not dt.isnative:
                return None
            flags = r.flags
            if flags.c_contiguous:  # wire.to_wire's order and buffer
                orders.append("C")
                bufs.append(np.frombuffer(r, np.uint8) if r.size else b"")
            elif flags.f_contiguous:
                orders.append("F")
                bufs.append(r.reshape(-1, order="A").view(np.uint8) if r.size else b"")
            else:
                return None
        key = tuple(orders)
        metas = self._metas.get(key)
        if metas is None:
            metas = msgpack.packb([{"dtype": dt.str, "shape": list(shape), "order": o}
                                   for (dt, shape), o in zip(self.declared, orders)])
            self._metas[key] = metas
        header = self.head + msgpack.packb(rid) + _KEY["timing"] + msgpack.packb(timing) + self.tail + metas
        return [header, *bufs]


def segment_inputs(shm: Any, who: Any, plan: Any, arrays: list) -> list | None:
    """D79: a plan's inputs in their order, those in segments read now through the mapper's checks
    (the principal's own segment, its role, its size, a short read) between the frames' ``arrays``;
    None where a segment is no longer open for ``who`` or cannot give its input: the general path
    answers that (opening one is said in its reply, ``shm_mapped``)."""
    if shm is None or not all(shm.holds(loc["name"], who) for _, loc, *_ in plan.segments):
        return None
    out = list(arrays)
    try:
        for i, loc, dt, shape, order in plan.segments:  # by index: each lands where its meta is
            out.insert(i, shm.array(loc, dt, shape, order, who))
    except wire.WireError:
        return None
    return out


def answer(backend: Any, kernel: Any, plan: Any, rid: int, arrays: list, shm: Any = None,
           who: Any = None) -> list | None:
    """The planned call's reply frames on a device-level backend, or None: leave it to the general
    path (a segment input could not be read for ``who`` through ``shm``, the kernel raised, or its
    results are not as declared)."""
    if plan.segments and (arrays := segment_inputs(shm, who, plan, arrays)) is None:
        return None
    staged = {"staged": frozenset(i for i, *_ in plan.segments)} if plan.segments else {}  # D79
    try:
        out, timing = backend.run(kernel, arrays, plan.header["params"], plan.header["layouts"], **staged)
    except Exception:  # noqa: BLE001 - the general path runs it again and answers the fault
        return None
    return plan.reply.frames(rid, timing, out)

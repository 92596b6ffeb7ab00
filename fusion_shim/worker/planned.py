"""A planned plain call run and answered in one pass (D76).

A request that a plan answers (:mod:`.plans`, D75) needs nothing of the general path but its
kernel: every input is a frame and none is tagged, so nothing is looked up, checked against a
fingerprint or kept, no segment is mapped and no result has a slot. Its reply's header differs from
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


def answer(backend: Any, kernel: Any, plan: Any, rid: int, arrays: list) -> list | None:
    """The planned call's reply frames on a device-level backend, or None: leave it to the general
    path (it raised, or its results are not as declared)."""
    try:
        out, timing = backend.run(kernel, arrays, plan.header["params"], plan.header["layouts"])
    except Exception:  # noqa: BLE001 - the general path runs it again and answers the fault
        return None
    return plan.reply.frames(rid, timing, out)

"""Headers made once and repeated but for a few values: the pre-encoded forms of the wire (D45, D75, D76).

A program's calls repeat, and so do their headers: the same bytes but for the request id (a call's,
the id its last key) and, in a reply, the id and the worker's seconds in ``timing``. Both sides cut
such a header around those values once and splice the new values in afterwards, relying on what
``msgpack.packb`` makes of a map: its items in their order, each key and value encoded on its own.

- :class:`RequestForm` (the client, :mod:`fusion_shim.client.repeat`): a call's header with its id
  last, sent as its bytes up to the id's value and the new id's encoding.
- :func:`id_at`, :func:`find_id` and :func:`is_the_id` (the worker, :mod:`fusion_shim.worker.plans`):
  where the id's value lies in a header that came, and whether another id there decodes to the same
  header but for the id.
- :class:`ResultForm` (the worker, :mod:`fusion_shim.worker.planned`): a planned call's ``result``
  header, its keys in the general path's order; the client reads such replies back with
  :class:`fusion_shim.protocol.skeleton.Skeleton`.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from . import messages, wire

ID_KEY = msgpack.packb("id")
_ID_ZERO = ID_KEY + msgpack.packb(0)  # a header's last key and value, the id's a fixint of one byte
_UINT_LEN = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}  # msgpack's unsigned ints past a positive fixint
_packb = msgpack.packb


class RequestForm:
    """A call's header (its id last) and its bytes up to the id's value."""

    __slots__ = ("header", "prefix")

    def __init__(self, header: dict, prefix: bytes):
        self.header, self.prefix = header, prefix

    @classmethod
    def of(cls, header: dict) -> "RequestForm | None":
        """The form of ``header`` (with id 0, its last key); None where its encoding does not end in it."""
        packed = _packb(header, use_bin_type=True)
        return cls(header, packed[:-1]) if packed.endswith(_ID_ZERO) else None

    def encode(self, rid: int) -> bytes:
        return self.prefix + _packb(rid)

    def encode_with(self, rid: int, **extra: Any) -> bytes:
        """The header with ``extra`` keys before the id, encoded in full."""
        return _packb({**self.header, **extra, "id": rid}, use_bin_type=True)


def id_at(raw: bytes, off: int) -> tuple[int, int] | None:
    """The msgpack unsigned int starting at ``off`` and where it ends; None if none starts there."""
    try:  # D351: the bound checked by the index itself
        b = raw[off]
    except IndexError:
        return None
    start = off + 1
    if b < 0x80:
        return b, start
    n = _UINT_LEN.get(b)
    end = start + (n or 0)
    if n is None or end > len(raw):
        return None
    return int.from_bytes(raw[start:end], "big"), end


def find_id(raw: bytes, rid: int) -> int | None:
    """Where the value of the key ``id`` holding ``rid`` starts in ``raw``; None if nowhere."""
    at = raw.find(ID_KEY + _packb(rid))
    return None if at < 0 else at + len(ID_KEY)


def is_the_id(prefix: bytes, suffix: bytes, header: dict) -> bool:
    """Whether another int between ``prefix`` and ``suffix`` decodes to ``header`` with that id."""
    other = header["id"] + 1 if header["id"] < 1 << 63 else header["id"] - 1  # a uint64 either way
    try:
        return wire.decode_header(prefix + _packb(other) + suffix) == {**header, "id": other}
    except wire.WireError:
        return False


_KEY = {k: _packb(k) for k in ("v", "t", "id", "timing", "evicted", "kept", "finite", "arrays")}
_EMPTY_LIST = _packb([])
_TIMING, _frombuffer, _U8 = _KEY["timing"], np.frombuffer, np.uint8  # D351: one global each, per reply


class ResultForm:
    """The fixed bytes of a planned call's ``result`` header: its keys in the general path's order
    (``v``, ``t``, ``id``, ``timing``, then ``evicted`` and ``kept`` on a resident worker, ``finite``
    where said, ``arrays``)."""

    __slots__ = ("_metas", "declared", "head", "tail", "scan")

    def __init__(self, declared: list, resident: bool):
        self.declared = declared
        keys = 7 if resident else 5
        self.scan = messages.scans_finite(declared)  # D354: its results are scanned, said with ``finite``
        # per whether the reply says ``finite`` (after ``kept``, as the general path's extra keys)
        self.head = tuple(bytes([0x80 | (keys + f)]) + _KEY["v"] + _packb(wire.VERSION) + _KEY["t"]
                          + _packb("result") + _KEY["id"] for f in (0, 1))
        kept = _KEY["evicted"] + _EMPTY_LIST + _KEY["kept"] + _EMPTY_LIST if resident else b""
        self.tail = kept + _KEY["arrays"], kept + _KEY["finite"] + _packb(True) + _KEY["arrays"]
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
                bufs.append(_frombuffer(r, _U8) if r.size else b"")
            elif flags.f_contiguous:
                orders.append("F")
                bufs.append(r.reshape(-1, order="A").view(np.uint8) if r.size else b"")
            else:
                return None
        key = tuple(orders)
        metas = self._metas.get(key)
        if metas is None:
            metas = _packb([{"dtype": dt.str, "shape": list(shape), "order": o}
                            for (dt, shape), o in zip(self.declared, orders)])
            self._metas[key] = metas
        f = self.scan and messages.all_finite(out)
        header = self.head[f] + _packb(rid) + _TIMING + _packb(timing) + self.tail[f] + metas
        return [header, *bufs]

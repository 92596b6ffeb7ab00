"""A ``result`` that repeats an earlier one's bytes but for its id and its times, read from that one (D48).

The replies to a template's calls (:mod:`fusion_shim.client.repeat`) are one header with another
id and other seconds in ``timing``: the worker builds them from the same bytes
(:mod:`fusion_shim.worker.planned`), and its frames have the same sizes. A :class:`Skeleton` keeps
the first such reply's header cut around those values, once the full decode and the caller's
checks of its results accepted it, and only where that header is exactly what ``msgpack.packb``
makes of its items in their order (so the cut is at the values' own bytes). A later reply is read
from it where its header is those bytes with the request's id and float64 seconds that are each
finite and >= 0, and its frames are the sizes its metas declare: it decodes to the skeleton's
header with that id and those times, which the full decode accepts and reads the same
(``read_timing`` keeps every such time), and its results are of the dtypes and shapes accepted
before. Anything else is decoded in full.
"""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import msgpack
import numpy as np

from . import messages, wire

PLAIN_KEYS = frozenset(("v", "t", "id", "timing", "evicted", "kept", "finite", "arrays"))  # as the worker's planned replies
HEADER_MAX = 4096  # bytes: a larger header is decoded every time
LEARN_TRIES = 3    # replies offered to learn from before giving up (one is enough: a template's are alike)
_inf = math.inf
_packb = msgpack.packb
_FLOAT = b"\xcb"  # msgpack's float64
_NOTHING_KEPT: frozenset = frozenset()


class _Learnt(NamedTuple):
    fixed: tuple    # the bytes before the id, between it and each time, and after the last
    keys: tuple     # the times' keys, in their order
    frames: tuple   # per result: (dtype, shape, order, nbytes)
    views: tuple    # per result, None: the result_fps of every Timing read
    header: dict    # the header learnt from (its id and its times are that reply's)
    structs: dict   # per length of the id's encoding, the struct that cuts a header of it


class Skeleton:
    """One template's reply header, cut around its id and its seconds; empty until :meth:`learn`.
    What it learnt is one value, set once: a thread reading meanwhile sees all of it or none."""

    __slots__ = ("_learnt", "tries")

    def __init__(self) -> None:
        self.tries = 0  # replies offered to learn from
        self._learnt: _Learnt | None = None

    @property
    def learning(self) -> bool:
        """Whether the next reply decoded in full should be offered to :meth:`learn`."""
        return self._learnt is None and self.tries < LEARN_TRIES

    @property
    def header(self) -> dict | None:
        """The header learnt from, or None."""
        return self._learnt.header if self._learnt is not None else None

    def learn(self, frames: list, header: dict, arrays: list) -> None:
        """Keep ``header`` (decoded from ``frames[0]`` with ``arrays``, and accepted) cut around its
        values, if it is a plain ``result``: its times float64 seconds of the worker's phases, each
        finite and >= 0, every array a frame."""
        self.tries += 1
        timing, metas = header.get("timing"), header.get("arrays")
        if (header.get("t") != "result" or not PLAIN_KEYS.issuperset(header) or header.get("kept")
                or header.get("evicted") or type(timing) is not dict or type(metas) is not list
                or len(frames) != len(metas) + 1 or len(arrays) != len(metas)):
            return
        if not all(k in messages.WORKER_PHASES and type(v) is float and 0 <= v < _inf for k, v in timing.items()):
            return
        if not all(type(m) is dict and wire.PLAIN_META.issuperset(m) for m in metas):
            return
        raw = bytes(wire.frame_view(frames[0]))
        pre, fixed, piece = b"", [], b""
        for key, value in header.items():
            if key == "id":
                pre, piece = piece + _packb(key), b""
            elif key == "timing":
                piece += _packb(key) + msgpack.Packer().pack_map_header(len(value))
                for name in value:
                    fixed.append(piece + _packb(name) + _FLOAT)
                    piece = b""
            else:
                piece += _packb(key, use_bin_type=True) + _packb(value, use_bin_type=True)
        fixed.append(piece)
        pre = msgpack.Packer().pack_map_header(len(header)) + pre
        times = [struct.pack(">d", v) for v in timing.values()]
        rebuilt = pre + _packb(header["id"]) + b"".join(f + t for f, t in zip(fixed, [*times, b""]))
        if rebuilt != raw or len(raw) > HEADER_MAX:
            return
        self._learnt = _Learnt((pre, *fixed), tuple(timing),
                               tuple((a.dtype, a.shape, m["order"], a.nbytes) for a, m in zip(arrays, metas)),
                               (None,) * len(metas), header, {})

    def read(self, frames: list, rid: int) -> tuple[dict, list, messages.Timing] | None:
        """(the learnt header, the arrays, the reply's Timing) for a reply to request ``rid`` that
        repeats the learnt one; None for any other (decode it in full)."""
        learnt = self._learnt
        if learnt is None or len(frames) != len(learnt.frames) + 1:
            return None
        fixed = learnt.fixed
        idb = _packb(rid)
        st = learnt.structs.get(len(idb))
        if st is None:
            st = learnt.structs[len(idb)] = struct.Struct(
                f">{len(fixed[0])}s{len(idb)}s" + "".join(f"{len(f)}sd" for f in fixed[1:-1]) + f"{len(fixed[-1])}s")
        raw = wire.frame_view(frames[0])
        if raw.nbytes != st.size:
            return None
        vals = st.unpack(raw)  # (pre, id, fixed, time, fixed, ..., time, fixed)
        if vals[1] != idb or vals[::2] != fixed:
            return None
        times = vals[3::2]
        if times and not (0.0 <= sum(times) < _inf and min(times) >= 0.0):  # a nan makes the sum nan
            return None
        arrays = []
        for frame, (dt, shape, order, nbytes) in zip(frames[1:], learnt.frames):
            buf = wire.frame_view(frame)
            if buf.nbytes != nbytes:
                return None
            # as wire.decode lays it out: one view over the frame (or a fresh empty array)
            arrays.append(np.ndarray(shape, dt, buf, 0, None, order) if nbytes
                          else np.empty(0, dt).reshape(shape, order=order))
        timing = messages.Timing(dict(zip(learnt.keys, times)), 0.0, False, _NOTHING_KEPT, (), learnt.views)
        return learnt.header, arrays, timing


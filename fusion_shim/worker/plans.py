"""Admitted calls remembered by their header, so that the next call of the same shape skips the
header's decoding, validation and admission (D75).

A client repeating a call sends the same header bytes but for its request id. A *plan* is what
:func:`fusion_shim.protocol.wire.decode` and the worker's admission made of one such header: the
decoded header, its inputs' dtypes, shapes, orders and byte counts, its declared results and their
slots. It is keyed by its principal and by the header's bytes around the id's value: a request whose
bytes before the id are the plan's, whose id is one msgpack unsigned int there, and whose bytes after
it are the plan's decodes to the plan's header with that id (msgpack reads left to right, so the same
prefix leaves the reader in the same place, one int there is one item, and the same suffix reads the
same). A plan is made only after its header was decoded with another id at that place and read the
same but for the id, so the int there is the header's own ``id``.

Only plain calls get a plan: every input travels as a frame or in a client's segment (no reference
or fingerprint), and the header carries nothing but the call (no ``keep``, result slots or segments
to drop). A plan's segment inputs are named by its header's bytes; they are read afresh at every
call, through the worker's mapper and its checks (:func:`.planned.segment_inputs`, D79). A request that
matches a plan but not its frames (their count, each one's length) is decoded in full, and refused
there. Plans are read, never changed: the header they hold is shared by their calls.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import zmq

from ..protocol import wire
from ..protocol.forms import find_id, id_at, is_the_id

PLANS_MAX = 256      # plans kept, the oldest dropped first
HEADER_MAX = 4096    # bytes: a larger header is decoded every time (a plan keeps its bytes)
OFFSETS_MAX = 4      # distinct places of the id (one per client encoding) looked at per request
PLAIN_KEYS = frozenset(("v", "t", "id", "op", "params", "layouts", "results", "arrays"))
PLAIN_KEYS_SHM = PLAIN_KEYS | {"out_shm"}  # D79: with result slots offered, none taken (all None)
PLAIN_META = wire.PLAIN_META
SHM_META = PLAIN_META | {"shm"}


class Plan(NamedTuple):
    header: dict
    inputs: tuple          # per buffer frame: (dtype, shape, order, nbytes)
    admitted: tuple        # declared results, result destinations, slots (the kernel is looked up per call)
    max_bytes: int         # the budget it was admitted under
    reply: Any = None      # D76: its reply header's fixed bytes (protocol.forms.ResultForm)
    segments: tuple = ()   # D79: per input in a segment, (its index, its locator, dtype, shape, order)


class Plans:
    """A worker's plans, at most ``limit``."""

    def __init__(self, limit: int = PLANS_MAX):
        self.limit = limit
        self._plans: dict[tuple, Plan] = {}
        self._offsets: list[int] = []  # where the id's value starts in the headers planned

    def forget(self, who: str) -> None:
        """Drop ``who``'s plans (its run ended)."""
        for key in [k for k in self._plans if k[0] == who]:
            del self._plans[key]

    def find(self, who: str, frames: list, max_bytes: int) -> tuple[int, list, Plan] | None:
        """``(id, arrays, plan)`` for a request of ``who`` that one of its plans answers, else None
        (decode it in full). The plan's header is its first call's: the id is the request's own."""
        if not self._offsets or not frames:
            return None
        raw = _raw(frames[0])
        if raw is None:
            return None
        offsets = self._offsets
        for i, off in enumerate(offsets):
            got = id_at(raw, off)
            if got is None:
                continue
            rid, end = got
            plan = self._plans.get((who, off, raw[:off], raw[end:]))
            if plan is not None and plan.max_bytes == max_bytes:
                if i:  # the place that answered is looked at first next time (a client's calls repeat)
                    offsets.insert(0, offsets.pop(i))
                arrays = _arrays(frames, plan.inputs)
                return None if arrays is None else (rid, arrays, plan)
        return None

    def learn(self, who: str, frame: Any, header: dict, arrays: list, admitted: tuple, max_bytes: int,
              reply: Any = None) -> None:
        """Remember an admitted call of ``who`` (``header`` decoded from ``frame``) if it is plain;
        ``reply()`` makes the plan's fixed reply bytes, only for a plan kept."""
        raw = _raw(frame)
        if raw is None or not _plain(header) or any(d is not None for d in admitted[1]):
            return
        rid = header["id"]
        off = find_id(raw, rid)
        if off is None:
            return
        got = id_at(raw, off)
        if got is None or got[0] != rid:
            return
        prefix, suffix = raw[:off], raw[got[1]:]
        if (off not in self._offsets and len(self._offsets) >= OFFSETS_MAX) or not is_the_id(prefix, suffix, header):
            return
        if off not in self._offsets:
            self._offsets.append(off)
        if len(self._plans) >= self.limit:
            del self._plans[next(iter(self._plans))]
        metas = header["arrays"]
        inputs = tuple((a.dtype, a.shape, m["order"], a.nbytes) for a, m in zip(arrays, metas) if "shm" not in m)
        segments = tuple((i, m["shm"], a.dtype, a.shape, m["order"]) for i, (a, m) in enumerate(zip(arrays, metas))
                         if "shm" in m)
        self._plans[(who, off, prefix, suffix)] = Plan(header, inputs, admitted, max_bytes,
                                                       reply() if reply is not None else None, segments)


def _raw(frame: Any) -> bytes | None:
    """A header frame's bytes; None for one longer than ``HEADER_MAX``, never copied."""
    if isinstance(frame, bytes):
        return frame if len(frame) <= HEADER_MAX else None
    if isinstance(frame, zmq.Frame):
        return frame.bytes if len(frame) <= HEADER_MAX else None
    view = memoryview(frame)
    return view.tobytes() if view.nbytes <= HEADER_MAX else None


def _plain(header: dict) -> bool:
    """A call whose inputs are frames or segment inputs, and which asks for nothing but its results."""
    metas = header.get("arrays")
    if header.get("t") != "call" or not isinstance(metas, list):
        return False
    slots = header.get("out_shm")
    if "out_shm" in header and not (isinstance(slots, list) and all(x is None for x in slots)):
        return False
    return PLAIN_KEYS_SHM.issuperset(header) and all(SHM_META.issuperset(m) for m in metas)


def _arrays(frames: list, inputs: tuple) -> list | None:
    """The inputs as views on their frames, laid out as :func:`wire.decode` lays them out (one
    ``np.ndarray`` over each frame: a third of ``frombuffer`` and ``reshape``'s time); None where
    the frames are not the plan's (their count, a length). A plan's segment inputs are not among
    them (:func:`.planned.segment_inputs`)."""
    if len(frames) != len(inputs) + 1:
        return None
    arrays: list = []
    for frame, (dt, shape, order, nbytes) in zip(frames[1:], inputs):
        if (len(frame) if frame.__class__ is _Frame else memoryview(frame).nbytes) != nbytes:
            return None
        # no bytes: a fresh empty array, as the decoder makes
        arrays.append(_ndarray(shape, dt, frame, 0, None, order) if nbytes else np.empty(0, dt).reshape(shape, order=order))
    return arrays


_Frame, _ndarray = zmq.Frame, np.ndarray  # D351: one global each in _arrays' loop

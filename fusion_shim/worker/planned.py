"""A planned plain call run and answered in one pass (D76).

A request that a plan answers (:mod:`.plans`, D75) needs nothing of the general path but its
kernel: every input is a frame or in a segment already open for its principal (read afresh by
:func:`segment_inputs`, D79) and none is tagged, so nothing is looked up, checked against a fingerprint or
kept, no segment is newly opened and no result has a slot. Its reply's header differs from
the last one of its plan in the id and the phases alone, so it is encoded from bytes made once per
plan (:class:`fusion_shim.protocol.forms.ResultForm`): the same bytes the general path's header
encodes to (a test compares them). A call that raises, or whose results are not the declared ones in C or F order, is
left to the general path, which answers it as it answers any call.
"""
from __future__ import annotations

from typing import Any

from ..protocol import wire


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
    header = plan.header
    try:
        if plan.segments:  # D79
            out, timing = backend.run(kernel, arrays, header["params"], header["layouts"],
                                      staged=frozenset(i for i, *_ in plan.segments))
        else:  # D351: no keyword dict made per call
            out, timing = backend.run(kernel, arrays, header["params"], header["layouts"])
    except Exception:  # noqa: BLE001 - the general path runs it again and answers the fault
        return None
    return plan.reply.frames(rid, timing, out)

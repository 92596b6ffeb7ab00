"""One stage call on a worker: the ``stage`` message (its arrays as raw frames, by reference where
the worker's stage process holds them), the one resend (by value, or the function by value), and
the answer read back: the return value, the arguments changed in place, the stage's exception."""
from __future__ import annotations

import os
import secrets
import time
from typing import Any, NamedTuple

import numpy as np

from .. import transport
from ..client.remote import WorkerFault
from ..protocol import code, messages, wire
from ..protocol.fingerprint import fingerprint, worth_keeping

DEADLINE_SLACK_S = 1.0  # the worker's own deadline ends first: its answer says the stage ran out


_RUN: dict[int, str] = {}  # pid -> this program run's name: a forked child is a run of its own


def run_name() -> str:
    """D190: names this run to the worker, which gives it a stage process of its own."""
    pid = os.getpid()
    if pid not in _RUN:
        _RUN.clear()
        _RUN[pid] = secrets.token_hex(12)
    return _RUN[pid]


class Refused(Exception):
    """The worker will not run this stage (no --allow-code, not authenticated, other versions)."""


class Failed(WorkerFault):
    """The worker answered with an error (the stage crashed, ran out of time): computed here; its
    kind as a call's (D335: ``client.call.fault_kind``)."""


class Packed(NamedTuple):
    payload: bytes          # the arguments pickled, each travelling array an index
    arrays: list            # the arrays, in the order of their indices
    items: list             # each through wire.to_wire
    fps: list               # each's fingerprint, where worth keeping


def pack(fn: Any, args: tuple, kwargs: dict, by_value: bool, residency: bool) -> Packed:
    """The call's payload: the function too when it goes by value."""
    payload, arrays = code.dumps((code.by_value(fn) if by_value else None, args, kwargs))
    items = [wire.to_wire(a) for a in arrays]
    fps = [fingerprint(m, b) if residency and worth_keeping(a.nbytes) else None for a, (m, b) in zip(arrays, items)]
    return Packed(payload, arrays, items, fps)


class Outcome(NamedTuple):
    value: Any
    raised: bool
    worker_s: float
    sent: int       # bytes on the socket, each way
    received: int
    by_ref: int     # inputs the worker already held
    saved: int      # ... and their bytes
    note: str = ""  # the worker's word on where the stage's NumPy ran (D307)


def send(link: Any, fn: Any, ref: dict | None, packed: Packed, held: set, deadline_s: float) -> Outcome:
    """Run the stage on ``link``'s worker; ``held``: the fingerprints its stage process is believed
    to hold (updated from the answer). Raises :class:`Refused`, ``code_missing`` as :class:`Failed`
    with ``kind``, or another :class:`transport.TransportError`."""
    chan = link.channel()
    payload = np.frombuffer(packed.payload, np.uint8)
    items = [wire.to_wire(payload), *packed.items]
    fps = [None, *packed.fps]
    refs = [i + 1 for i, fp in enumerate(packed.fps) if fp is not None and fp in held]
    header = messages.stage_header(link.next_id(), ref, code.versions(), deadline_s, run_name())
    req = messages.Request(header, items, fps, refs, by_socket=True)  # the worker reads a stage from its frames only
    ans = chan.request(req, time.monotonic() + deadline_s + DEADLINE_SLACK_S)
    sent, received = chan.last_bytes_sent, chan.last_bytes_received
    if ans.header["t"] == "error" and ans.header.get("kind") == "missing":
        held.difference_update(ans.header.get("missing") or ())
        header["id"] = link.next_id()
        refs = []
        ans = chan.request(req._replace(refs=()), time.monotonic() + deadline_s + DEADLINE_SLACK_S)
        sent, received = sent + chan.last_bytes_sent, received + chan.last_bytes_received
    reply = ans.header
    if reply["t"] == "error":
        kind, msg = reply.get("kind"), f"{reply.get('exc')}: {reply.get('msg')}"[:300]
        if kind == "refused":
            raise Refused(str(reply.get("msg"))[:300])
        raise Failed(f"worker: {msg}", kind, reply.get("exc"))
    if reply["t"] != "result":
        raise transport.BadReply(f"a stage answered with {reply['t']!r}")
    try:
        got = messages.read_stage(reply, ans.arrays)
    except wire.WireError as exc:
        raise transport.BadReply(str(exc)) from None
    results = [a if a.flags.aligned else a.copy(order="K") for a in got.results]
    try:
        value = code.loads_answer(got.payload, results, frozenset({getattr(fn, "__module__", None), "__main__"}))
    except Exception as exc:  # a worker's answer is data: whatever it holds, the stage is computed here
        raise transport.BadReply(f"a stage's answer does not load: {type(exc).__name__}: {exc}"[:300]) from None
    changes = _changes(got.changed, packed.arrays)  # all checked before any argument is touched
    for dst, new in changes:  # arguments the stage changed in place, changed here too
        np.copyto(dst, new)
    changed = {index for index, _ in got.changed}
    for i, fp in enumerate(packed.fps):
        if fp is not None:
            (held.discard if i in changed else held.add)(fp)
    saved = sum(packed.arrays[i - 1].nbytes for i in refs)
    return Outcome(value, got.raised, got.worker_s, sent, received, len(refs), saved, got.note)


def _changes(changed: list, arrays: list) -> list:
    """(the caller's array, its new contents) for each argument the answer says changed; a change
    that is not one of the arguments sent, in its size and dtype, is a bad reply."""
    out = []
    for index, new in changed:
        if not (isinstance(index, int) and 0 <= index < len(arrays)):
            raise transport.BadReply(f"changed argument {index!r} is not among the {len(arrays)} sent")
        dst = arrays[index]
        if new.dtype != dst.dtype or new.size != dst.size or not dst.flags.writeable:
            raise transport.BadReply(f"changed argument {index} came back as {new.dtype}[{new.size}], "
                                     f"not {dst.dtype}[{dst.size}] (or it cannot be written here)")
        out.append((dst, new.reshape(dst.shape)))
    return out

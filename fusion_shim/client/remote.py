"""One call sent to a worker: the ``call`` message, its request (shared memory on a same-host
link), the one resend after a stale mirror, and the reply read back into what NumPy returns.
Every fault raises a :class:`transport.TransportError` (the caller computes the call here)."""
from __future__ import annotations

import cmath
import math
import time
from typing import Any

import numpy as np

from .. import transport
from ..catalog import Prepared
from ..ledger import Record
from ..protocol import messages, wire
from ..transport import shm_client
from .link import WorkerLink
from .repeat import Template
from .residency import Mirror, Wired

# the worker's own times must fit in the round trip that carried them (two clocks: a little slack)
ROUND_TRIP_SLACK = 1.05
ROUND_TRIP_SLACK_S = 1e-3
NONFINITE_SLICE = 1 << 20  # D200: elements looked at per slice: a 1 MiB mask whatever the result's size
_all = np.logical_and.reduce  # D343: what ndarray.all calls, without its Python wrapper
# D346: a 1-element result's check by its dtype's char, one lookup; long double ('g', 'G') is wider than a Python number
_ONE_BY_CHAR = {"e": math.isfinite, "f": math.isfinite, "d": math.isfinite, "F": cmath.isfinite, "D": cmath.isfinite}


class WorkerFault(transport.TransportError):
    """The worker answered with an error instead of a result; ``kind``: its error kind (``wire.ERROR_KINDS``),
    ``exc``: its exception's type name."""

    def __init__(self, text: str, kind: str | None = None, exc: str | None = None):
        super().__init__(text)
        self.kind, self.exc = kind, exc


class ReportedHere(Exception):
    """The worker's result holds a value NumPy's error state asks to hear of (D198): the call is
    computed here, where NumPy raises, warns or calls as that state says. Not a fault."""


class WontFit(WorkerFault):
    """A call's memory would not fit this host's or the worker's budget: refused before anything
    is allocated for it, and computed here (where NumPy raises its own error), the worker not at fault."""


# D203: calls smaller than this are not weighed against the budgets (reading them costs more than
# such a call risks); tests lower it
FIT_CHECK_MIN = 64 << 20


def host_available() -> int | None:
    """This host's available memory in bytes (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(prep: Prepared, link: WorkerLink, refs: Any = ()) -> None:
    """D203: raise :class:`WontFit` where the call's declared results (which land here) and, on a
    same-host link, the worker's copies of its inputs and results exceed this host's available
    memory, or its inputs and results exceed the message budget the worker advertised. Checked
    before any segment, buffer or frame exists."""
    results = sum(math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize for dtype, shape in prep.results)
    refs = set(refs)
    inputs = sum(a.nbytes for i, a in enumerate(prep.arrays) if i not in refs)
    if results + inputs < FIT_CHECK_MIN:
        return
    worker_budget = link.info.get("max_bytes")
    if isinstance(worker_budget, int) and not isinstance(worker_budget, bool) and inputs + results > worker_budget:
        raise WontFit(f"{_size(inputs + results)} of inputs and results exceed the worker's message budget "
                      f"({_size(worker_budget)}): refused before sending, computed here")
    same_host = link.url is None or transport.is_loopback(link.url)  # the worker's memory is this host's too
    need = results + (inputs + results if same_host else 0)
    avail = host_available()
    if avail is not None and need > avail:
        raise WontFit(f"{prep.spec.name} needs {_size(need)} here (results{' and the worker' if same_host else ''}"
                      f"), this host has {_size(avail)} available: refused before allocating, computed here")


def _size(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.3g} MiB"


def call_header(rid: int, prep: Prepared, keep: bool = False) -> dict:
    """The header of the ``call`` message for a prepared call (results travel in their layouts' axes,
    see :func:`assemble`)."""
    return messages.call_header(rid, prep.spec.kernel_id, prep.params, prep.layouts, prep.results, keep)


def call_message(rid: int, prep: Prepared) -> list:
    """The ``call`` message for a prepared call, every input by value."""
    return wire.encode(call_header(rid, prep), prep.arrays)


def send(prep: Prepared, rec: Record, link: WorkerLink, wired: Wired | None,
         deadline_s: float, tmpl: Template | None = None, watch: bool = False) -> tuple[Any, float, float | None]:
    """Send the call on ``link`` and wait up to ``deadline_s`` for its reply: (NumPy's return value,
    seconds from encoding to decoding, the worker's kernel seconds). The record gets the bytes, the
    phases and the residency counts. ``tmpl``: the call repeats its layout and is encoded from it,
    unless shared memory would carry it. ``watch``: the error state reports non-finite results, and
    a result holding one raises :class:`ReportedHere` before anything is written to ``out=``."""
    chan = link.channel()
    t0 = time.perf_counter()
    lane = link.lane.pool()  # D351: link.shm()'s read, without its call
    if tmpl is not None and (lane is None or tmpl.largest < shm_client.MIN_BYTES):
        req: Any = tmpl.request(link.next_id(), prep, lane.drops() if lane is not None else ())  # D45: by the socket
    else:  # a call from a template repeats a layout whose first call was weighed here
        check_fits(prep, link, wired.refs_in(link.mirror) if wired is not None else ())
        header = call_header(link.next_id(), prep, keep=wired is not None)
        if wired is None:
            items, fps, refs = [wire.to_wire(a) for a in prep.arrays], None, ()
        else:
            wired.refs = wired.refs_in(link.mirror)
            items, fps, refs = wired.items, wired.fps, wired.refs
        req = messages.Request(header, items, fps, refs, prep.results)
    reply, arrays, t1, timing, learn_from = _exchange(link, chan, req, rec, deadline_s)
    if reply["t"] == "error" and reply.get("kind") == "missing" and wired is not None and wired.refs:
        # the mirror was stale (an eviction it did not hear of, another client): resend by value, once
        link.mirror.discard(reply.get("missing") or ())
        rec.resends += len(wired.refs)
        header["id"] = link.next_id()
        before = chan.last_bytes_sent, chan.last_bytes_received
        reply, arrays, _, timing, _ = _exchange(link, chan, req._replace(refs=()), rec, deadline_s)
        chan.last_bytes_sent += before[0]  # both round trips were on the socket
        chan.last_bytes_received += before[1]
        wired.refs = []
    t2 = time.perf_counter()
    rec.bytes_sent, rec.bytes_received = chan.last_bytes_sent, chan.last_bytes_received
    if reply["t"] == "error":
        raise WorkerFault(f"worker raised {reply.get('exc')} ({reply.get('kind')}): {reply.get('msg')}"[:300],
                          reply.get("kind"), reply.get("exc"))
    if reply["t"] != "result":
        raise transport.BadReply(f"a call answered with {reply['t']!r}")
    # D354: a worker that scanned its results (in its cache; here they are not yet) says ``finite``
    if watch and reply.get("finite") is not True and nonfinite(arrays):
        raise ReportedHere("the result holds inf or nan and np.geterr() asks to hear of them: computed here")
    # D49: a reply read from the template's skeleton has the results of one accepted here
    value = assemble(prep, arrays, checked=timing is not None)
    if timing is None:
        timing = messages.read_timing(reply)
        if learn_from is not None:
            req.skeleton.learn(learn_from, reply, arrays)
    if wired is not None:
        _held(link.mirror, wired, timing, arrays, rec)
    t3 = time.perf_counter()
    kernel_s = _phases(timing, rec, chan, link, prep, t0, t1, t2, t3)
    return value, t3 - t0, kernel_s


def _held(mirror: Mirror, wired: Wired, timing: messages.Timing, arrays: list, rec: Record) -> None:
    """What the reply says the worker now holds: the mirror follows, the record counts it."""
    rec.resident_hits = len(wired.refs)
    rec.bytes_saved = sum(wired.sizes[i] for i in wired.refs)
    rec.evictions = len(timing.evicted)
    mirror.discard(timing.evicted)
    for i, fp in enumerate(wired.fps):
        if fp in timing.kept:  # the worker says which inputs it kept
            mirror.add(fp, wired.sizes[i])
    for fp, arr in zip(timing.result_fps, arrays):
        if fp:
            mirror.add(fp, arr.nbytes)


def _phases(timing: messages.Timing, rec: Record, chan: transport.Channel, link: WorkerLink, prep: Prepared,
            t0: float, t1: float, t2: float, t3: float) -> float | None:
    """The call's phases, the worker's own from its reply; returns its kernel seconds. Times the
    worker could not have spent (not finite, negative, or more than the round trip) are dropped."""
    worker_s, worker_fp = timing.phases, timing.fingerprint
    claimed = sum(worker_s.values()) + worker_fp
    too_long = claimed > (t2 - t1) * ROUND_TRIP_SLACK + ROUND_TRIP_SLACK_S
    if timing.rejected or too_long:
        why = (", ".join(timing.rejected) if timing.rejected
               else f"{claimed * 1e3:.3g} ms of work in a {(t2 - t1) * 1e3:.3g} ms round trip")
        link.ledger.event(f"worker at {link.url} reported impossible times for {prep.spec.kernel_id} ({why})"[:300]
                          + ": dropped; the call's time is counted as the link's")
        if too_long:
            worker_s, worker_fp, claimed = {}, 0.0, 0.0
    rec.phases.update(worker_s)
    if timing.oom_retry:
        link.ledger.event(f"worker ran out of memory on {prep.spec.kernel_id}; it freed its caches and the retry "
                          "succeeded")
    if worker_fp:
        rec.phases["fingerprint"] = rec.phases.get("fingerprint", 0.0) + worker_fp
    # the worker may start before send() returns (zero-copy sends overlap), so send and transfer
    # share what the round trip leaves after the worker's own time: phases never exceed the wall
    on_link = max(t2 - t1 - claimed, 0.0)
    sent = min(chan.last_send_s, on_link)
    rec.phases.update(encode=t1 - t0, send=sent, transfer=on_link - sent, decode=t3 - t2)
    return worker_s.get("kernel")


def _exchange(link: WorkerLink, chan: transport.Channel, req: Any, rec: Record,
              deadline_s: float) -> tuple[dict, list, float, messages.Timing | None, Any]:
    """One request and its reply; returns (reply, arrays, when encoding ended, its Timing where the
    request's skeleton read it, its frames where the skeleton may learn from it). On a same-host
    link the buffers go through shared memory (the channel's lane, the link's)."""
    ans = chan.request(req, time.monotonic() + deadline_s)
    if ans.lane_note:
        link.ledger.event(ans.lane_note)
    if ans.shm_sent or ans.shm_received:  # D351: most replies moved nothing through shared memory
        rec.shm_sent += ans.shm_sent
        rec.shm_received += ans.shm_received
    return ans.header, ans.arrays, ans.encoded, ans.timing, ans.learn_from


def assemble(prep: Prepared, arrays: list, checked: bool = False) -> Any:
    """NumPy's return value from the worker's arrays, after checking each is what NumPy returns
    (``checked``: read from a skeleton of a reply whose results were)."""
    if not checked:
        _check_results(prep, arrays)
    # a small frame can land unaligned; the copy keeps its memory order (an F result stays F).
    # D199: the wire names a dtype by its str ('<i8'), NumPy's result by its char ('q' is not 'l')
    for i, (a, (dt, _)) in enumerate(zip(arrays, prep.results)):  # D351: a loop, in place, not a new list
        if not (a.flags.aligned and a.dtype.char == dt.char):
            arrays[i] = a.view(dt) if a.flags.aligned else a.copy(order="K").view(dt)
    return prep.returned(arrays)


def nonfinite(arrays: list) -> bool:
    """Whether a floating result holds inf or nan. D200: ``isfinite`` raises no flag and beats a sum
    under ``errstate`` at every size; a large result is looked at in slices (its mask stays small)."""
    for a in arrays:
        size = a.size
        if size == 1 and (finite := _ONE_BY_CHAR.get(a.dtype.char)) is not None:  # D343, D346: as a Python number
            if not finite(a.item()):
                return True
            continue
        if a.dtype.kind not in "fc" or not size:
            continue
        if size <= NONFINITE_SLICE or not (a.flags.c_contiguous or a.flags.f_contiguous):
            if not _all(np.isfinite(a), axis=None):
                return True
            continue
        flat = a.ravel(order="K")  # a view: the result is contiguous in its own order
        for i in range(0, flat.size, NONFINITE_SLICE):
            if not np.isfinite(flat[i:i + NONFINITE_SLICE]).all():
                return True
    return False


def _check_results(prep: Prepared, arrays: list) -> None:
    if len(arrays) != len(prep.results):
        raise transport.BadReply(f"{len(arrays)} results, expected {len(prep.results)}")
    for arr, (dtype, shape), layout in zip(arrays, prep.results, prep.layouts):
        if isinstance(layout, list):  # travels transposed to that axis order (worker.kernels)
            shape = tuple(shape[i] for i in layout)
        if arr.dtype != dtype or arr.shape != shape:
            raise transport.BadReply(f"result {arr.dtype}{list(arr.shape)}, expected {dtype}{list(shape)}")



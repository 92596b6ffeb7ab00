"""The client's half of the same-host lane (:mod:`.shm`): its segments (one pool per worker
process), the request that places inputs and offers result slots (:meth:`ShmPool.stage`, which
:meth:`~fusion_shim.transport.Channel.request` calls), and the negotiation in ``hello``."""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import secrets
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterable

import numpy as np

from .shm_common import (PREFIX, SHM_DIR, ShmError, available, boot_id, check_loc, map_segment, owner_tag, strides_of,
                         sweep_stale)

# D39: below this a buffer travels in the message: the lane's own work for a call costs more than
# the socket takes to move it. Tests set it to 0 to send every buffer through shared memory.
MIN_BYTES = 256 * 1024
GRANULE = 64 * 1024          # segment sizes are rounded up to this
MAX_IDLE_BYTES = 2 << 30     # free segments kept for reuse, per client, beyond which they are closed
# D202: a call's inputs are copied into segments up to this many bytes; the rest travel as zero-copy
# frames from the arrays' own buffers, so the client never holds a second copy of a large input
INPUT_MAX_BYTES = 32 << 20


class Segment:
    __slots__ = ("name", "size", "mm", "base", "role", "linked", "mapped", "__weakref__")

    def __init__(self, name: str, size: int, role: str):
        self.name, self.role = name, role
        self.mm, self.size = map_segment(name, size, writable=True, create=True)
        self.base = np.frombuffer(self.mm, np.uint8)
        self.linked = True    # the name exists in /dev/shm
        self.mapped = False   # the worker said it mapped it: the name can go

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except OSError:
                pass


class _Lease:
    """The base object of a result array on a segment: NumPy sets an array built from
    ``__array_interface__`` to keep this object as its base, and every view of it too (views point
    at the first base that is not an array). When the last one dies, the segment returns to the pool.
    ``__del__`` only appends to a deque: it may run inside the pool's own code (a GC pass)."""

    __slots__ = ("__array_interface__", "seg", "pool")

    def __init__(self, pool: "ShmPool", seg: Segment, offset: int, dtype: np.dtype, shape: tuple, order: str):
        self.seg, self.pool = seg, pool
        self.__array_interface__ = {
            "version": 3, "shape": shape, "typestr": dtype.str, "descr": dtype.descr,
            "data": (seg.base.ctypes.data + offset, False), "strides": strides_of(dtype, shape, order)}

    def __del__(self) -> None:
        if not self.pool.closed:
            self.pool.returned.append(self.seg)


class ShmPool:
    """One client's segments for one worker process (a new worker, a new pool: it has mapped none
    of them). Thread-safe; forked children get a pool of their own (see ``for_this_process``)."""

    def __init__(self, worker_pid: Any = None):
        self.owner = owner_tag()
        self.pid = os.getpid()
        self.worker_pid = worker_pid
        self._lock = threading.Lock()
        self._seq = 0
        self._free: list[Segment] = []      # idle, sorted by size
        self._idle_bytes = 0
        self._live: dict[str, Segment] = {}  # every segment not yet closed, by name
        self._drop: list[str] = []           # retired names the worker should unmap
        self.returned: deque[Segment] = deque()  # leases append here from __del__
        self.leased: set[Segment] = set()       # handed to the program (some may be in ``returned``)
        self.closed = False
        _POOLS.add(self)
        self.stats = {"segments_created": 0, "bytes_staged": 0, "results_on_shm": 0, "retired": 0}

    def _new_name(self, role: str) -> str:
        self._seq += 1
        return f"{PREFIX}{self.owner}-{role}{self._seq}"

    def _drain(self) -> None:
        while self.returned:
            self._put_back(self.returned.popleft())

    def _put_back(self, seg: Segment) -> None:
        self.leased.discard(seg)
        if self.closed or seg.name not in self._live:
            return
        if self._idle_bytes + seg.size > MAX_IDLE_BYTES:
            self._close(seg)
            return
        self._free.append(seg)
        self._free.sort(key=lambda s: s.size)
        self._idle_bytes += seg.size

    def _close(self, seg: Segment) -> None:
        seg.unlink()
        self._live.pop(seg.name, None)
        if seg.mapped:
            self._drop.append(seg.name)

    def acquire(self, role: str, nbytes: int) -> Segment:
        """A free segment of ``role`` holding at least ``nbytes`` (and at most twice that), or a new one."""
        with self._lock:
            self._drain()
            for i, seg in enumerate(self._free):
                if seg.role == role and nbytes <= seg.size <= 2 * max(nbytes, GRANULE):
                    del self._free[i]
                    self._idle_bytes -= seg.size
                    return seg
            size = -(-max(nbytes, 1) // GRANULE) * GRANULE
            seg = Segment(self._new_name(role), size, role)
            self._live[seg.name] = seg
            self.stats["segments_created"] += 1
            return seg

    def release(self, segs: Iterable[Segment]) -> None:
        with self._lock:
            for seg in segs:
                self._put_back(seg)

    def retire(self, segs: Iterable[Segment]) -> None:
        """Never reuse these: a worker that did not answer may still read or write them."""
        with self._lock:
            for seg in segs:
                self.stats["retired"] += 1
                self._close(seg)

    def mapped(self, names: Any) -> None:
        """The worker mapped these: their names can go (the memory stays while both map it)."""
        if not isinstance(names, list):
            return
        with self._lock:
            for name in names:
                seg = self._live.get(name) if isinstance(name, str) else None
                if seg is not None:
                    seg.mapped = True
                    seg.unlink()

    def drops(self) -> list[str]:
        with self._lock:
            out, self._drop = self._drop, []
            return out

    def names_mapped_by_worker(self) -> list[str]:
        with self._lock:
            return [n for n, s in self._live.items() if s.mapped]

    def close(self) -> None:
        """Unlink every name still linked; mappings go when the last array on them does."""
        with self._lock:
            self.closed = True
            for seg in list(self._live.values()):
                seg.unlink()
            self._live.clear()
            self._free.clear()
            self.returned.clear()
            self._idle_bytes = 0

    def stage(self, req: Any) -> "tuple[Staged | None, list, str | None]":
        """A request's frames with its inputs placed in segments and its results offered slots:
        (its segments, the frames, None); when ``/dev/shm`` refuses, (None, plain frames, why)."""
        drops = self.drops()  # segments retired earlier, which the worker may unmap now
        extra = {"shm_drop": drops} if drops else {}
        if not _worth_a_segment(req):  # a small call: its frames as they are, no segment asked for
            return None, req.frames(**extra), None
        staged = Staged(self)
        try:
            staged.offer(req.results)
            return staged, req.frames(place=staged.place, out_shm=staged.out_slots, **extra), None
        except BaseException as exc:
            staged.abandon()
            if not isinstance(exc, ShmError):
                raise
            return None, req.frames(**extra), f"shared memory: {exc}; a call's buffers went through the socket"

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes


def _worth_a_segment(req: Any) -> bool:
    """Whether any input sent by value or any declared result is as big as a segment's minimum."""
    refs = set(req.refs)
    for i, (_, buf) in enumerate(req.items):
        if i not in refs and (buf.nbytes if isinstance(buf, np.ndarray) else len(buf)) >= MIN_BYTES:
            return True
    return any(math.prod(shape) * np.dtype(dtype).itemsize >= MIN_BYTES for dtype, shape in req.results)


class Staged:
    """One request's segments: inputs placed, result slots offered; the resolver for its reply."""

    def __init__(self, pool: ShmPool, results: list | None = None):
        self.pool = pool
        self.inputs: list[Segment] = []
        self.outputs: dict[str, Segment] = {}
        self.leased: set[str] = set()
        self.out_slots: list = []
        self.sent = self.received = 0  # buffer bytes this request moved through shared memory
        self._placed: dict[tuple[int, int], dict] = {}  # (address, bytes) -> locator: a buffer passed twice
        if results is not None:
            self.offer(results)

    def offer(self, results: list) -> None:
        """A slot per result (``(dtype, shape)`` pairs, the call's declared results) big enough to
        be worth a segment; None for the others, which travel inline."""
        for dtype, shape in results:
            nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
            if nbytes < MIN_BYTES or nbytes == 0:
                self.out_slots.append(None)
                continue
            seg = self.pool.acquire("o", nbytes)
            self.outputs[seg.name] = seg
            self.out_slots.append({"name": seg.name, "offset": 0, "nbytes": nbytes})

    def place(self, meta: dict, buf: Any) -> dict | None:
        """Copy one input buffer into a segment; the locator for its meta, or None (send it as a
        frame: small, or past the call's :data:`INPUT_MAX_BYTES`, D202). A buffer passed twice is
        copied once and named twice."""
        src = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)
        if src.nbytes < MIN_BYTES or src.nbytes == 0:
            return None
        key = (src.ctypes.data, src.nbytes)
        if key in self._placed:
            return self._placed[key]
        if self.sent + src.nbytes > INPUT_MAX_BYTES:
            return None
        seg = self.pool.acquire("i", src.nbytes)
        seg.base[:src.nbytes] = src  # the one copy on this side
        self.sent += src.nbytes
        self.inputs.append(seg)
        self.pool.stats["bytes_staged"] += src.nbytes
        loc = self._placed[key] = {"name": seg.name, "offset": 0}
        return loc

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str) -> np.ndarray:
        """A result the worker wrote into one of this request's slots, as a writable array whose
        base is a lease on the segment (wire.decode calls this for metas with ``shm``)."""
        from ..protocol.wire import WireError

        name, offset, _ = check_loc(loc)
        seg = self.outputs.get(name)
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        if seg is None or name in self.leased:
            raise WireError(f"result names segment {name}, which this call did not offer")
        if offset + nbytes > seg.size:
            raise WireError(f"result of {nbytes} bytes at {offset} overruns segment {name} of {seg.size}")
        self.leased.add(name)
        self.pool.leased.add(seg)
        self.received += nbytes
        self.pool.stats["results_on_shm"] += 1
        arr = np.asarray(_Lease(self.pool, seg, offset, dtype, tuple(shape), order))
        return arr

    def finish(self, header: dict) -> None:
        """The reply arrived: inputs and unused result slots go back; mapped names are unlinked."""
        self.pool.mapped(header.get("shm_mapped"))
        self.pool.release(self.inputs + [s for n, s in self.outputs.items() if n not in self.leased])

    def abandon(self) -> None:
        """No reply (timeout, dead worker, bad reply): retire every segment not handed out."""
        self.pool.retire(self.inputs + [s for n, s in self.outputs.items() if n not in self.leased])


# --- fork: a result must not stay shared with the parent ---------------------------------------------

_POOLS: "weakref.WeakSet[ShmPool]" = weakref.WeakSet()


def _privatize_after_fork() -> None:
    """In a forked child, every result array on a segment would still be *shared* with the parent
    (MAP_SHARED, where ordinary NumPy memory is copy-on-write): a child writing into an inherited
    result would change the parent's. So the child replaces each such mapping, at the same address,
    with private memory holding the same bytes. No lock: only this thread survived the fork."""
    for pool in list(_POOLS):
        for seg in list(pool.leased):
            _privatize(seg)


def _privatize(seg: Segment) -> None:
    data = seg.base.copy()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = seg.base.ctypes.data
    got = libc.mmap(addr, seg.size, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)  # 0x10: MAP_FIXED
    if got != addr:
        raise OSError(ctypes.get_errno(), "could not make an inherited result private after fork")
    np.copyto(seg.base, data)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_privatize_after_fork)


def make_probe() -> tuple[dict, Segment]:
    """The client's half of the handshake: a tiny segment with a random token for the worker to read."""
    token = secrets.token_hex(16)
    seg = Segment(f"{PREFIX}{owner_tag()}-p{secrets.randbelow(1 << 30)}", GRANULE, "p")
    seg.base[:len(token)] = np.frombuffer(token.encode(), np.uint8)
    return {"boot": boot_id(), "probe": seg.name, "token": token}, seg


class ClientLane:
    """One worker link's side of the lane: the sweep at start, the offer in ``hello``, the pool once
    the worker accepted it (a new worker process, a new pool: it has mapped none of the old), and
    cleanup at stop. Wanted only over ``ipc://`` or ``inproc://`` with ``FUSION_SHIM_SHM=auto``."""

    def __init__(self, mode: str, event: Callable[[str], None]):
        self.mode, self.event = mode, event
        self.owner = os.getpid()
        self._pool: ShmPool | None = None
        self._probe: Segment | None = None

    def wanted(self, url: str | None) -> bool:
        scheme = url.split("://", 1)[0] if url else "ipc"  # None: the embedded worker, on ipc://
        return self.mode == "auto" and scheme in ("ipc", "inproc") and available()

    def start(self, url: str | None) -> None:
        if self.wanted(url):
            swept = sweep_stale()  # segments of clients that died before they could clean up
            if swept:
                self.event(f"shared memory: removed {len(swept)} segments left by dead processes")

    def offer(self, url: str | None) -> dict | None:
        """The ``shm`` entry of a ``hello``, or None (not wanted, or no segment could be made)."""
        if not self.wanted(url):
            return None
        self.withdraw()
        try:
            offer, self._probe = make_probe()
        except ShmError as exc:
            self.event(f"shared memory off: {exc}")
            return None
        return offer

    def withdraw(self) -> None:
        """The hello was answered (or not): the probe's name goes."""
        probe, self._probe = self._probe, None
        if probe is not None and os.getpid() == self.owner:
            probe.unlink()

    def answered(self, answer: Any, worker_pid: Any) -> None:
        old = self._pool
        if isinstance(answer, dict) and answer.get("ok") is True:
            if old is not None and old.worker_pid == worker_pid and old.pid == os.getpid():
                return  # the same worker, answering a probe again
            self._pool = ShmPool(worker_pid)
            self.event(f"shared memory on: buffers of {MIN_BYTES} bytes and more travel through "
                       f"{SHM_DIR}, headers through the socket")
        else:
            why = answer.get("why") if isinstance(answer, dict) else "the worker did not answer the offer"
            self._pool = None
            self.event(f"shared memory off: {why}; buffers travel through the socket")
        if old is not None and old is not self._pool and old.pid == os.getpid():
            old.close()

    def pool(self) -> "ShmPool | None":
        """The pool, in the process that negotiated it (a forked child uses the socket: its
        parent's segments are not its own)."""
        pool = self._pool
        return pool if pool is not None and pool.pid == os.getpid() and not pool.closed else None

    def close(self) -> list[str]:
        """Unlink every name; returns the names the worker has mapped (it should unmap them)."""
        self.withdraw()
        pool = self.pool()
        if pool is None:
            return []
        names = pool.names_mapped_by_worker() + pool.drops()
        pool.close()
        return names

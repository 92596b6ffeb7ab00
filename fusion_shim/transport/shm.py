"""The same-host lane (issue 9): array buffers through shared memory, headers through the socket.

Through a ZeroMQ socket a 64 MiB buffer crosses at 1.3-4 GB/s (shared/LIMITS.md); through a shared
segment it costs one memcpy on each side. The wire names a buffer instead of carrying it (the
``shm`` array-meta key, see :mod:`fusion_shim.protocol.wire`), and everything else stays as it was: requests
and replies, ids, deadlines, validation, the socket lane as the fallback.

Ownership: **the client owns every segment**, inputs and results alike. It knows when a result
dies (the program drops the array) and when a call was abandoned; the worker knows neither. So:

- *inputs*: the client copies each buffer into an ``i`` segment from its pool; the worker maps it
  read-only, reads it during the call, and the client takes the segment back when the reply arrives;
- *results*: the call offers one ``o`` segment per result (``out_shm``), sized from what NumPy
  would return; the worker maps it read-write and writes the result there; the client hands the
  program a NumPy array *on that segment* (no copy on receive). The array's base is a :class:`_Lease`:
  when the last view of the result dies the segment returns to the pool;
- a call that times out or fails on the link *retires* its segments (never reused: a late worker
  may still read or write them) and tells the worker to unmap them (``shm_drop``).

Lifetimes and crashes. Segments are files in ``/dev/shm`` named
``fshm-<pid namespace>-<pid>-<process start time>-<role><seq>``. Once the worker has mapped a
segment (it says so in ``shm_mapped``), the client unlinks the name: from then on the memory lives
exactly as long as the two mappings, and a SIGKILL of either side leaks nothing. Names that a crash
catches in between are swept: the worker unlinks those of a client whose process is gone (it
checks while idle, and at exit), and every client sweeps, when it starts, the names of owners that
are dead. Owners are matched by pid *and* start time (a reused pid is not the same owner), and only
within the sweeper's own pid namespace (a name from another namespace is never judged).

Fork: result arrays sit in MAP_SHARED memory, where ordinary NumPy memory is copy-on-write; a
forked child therefore gets private copies of them at the same addresses (``_privatize_after_fork``)
and uses the socket lane from then on (its parent's segments are not its own).

Negotiation (in ``hello``/``ready``): only over ``ipc://`` or ``inproc://``, with the same boot id
on both sides, and a probe segment the worker must read back (same host is not enough: two
containers may share a socket file but not ``/dev/shm``). Anything else: the socket lane.

Composition with residency (issue 6) and declared results (issue 8): an input the worker holds
still travels as a reference (never placed); a result slot is offered per *declared* result, sized
from it, and the worker writes a result there only when its byte size matches the slot exactly.

The client's part is :class:`ClientLane` (negotiation, the pool, cleanup, one per worker link) and
:func:`exchange` (one request through the lane, or through the socket when it is off); the worker's
is :class:`ShmMapper`. This module imports neither torch nor the planner; the worker adds its
pinned-memory staging.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import re
import secrets
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "fshm-"
NAME_RE = re.compile(r"^fshm-(\d+)-(\d+)-(\d+)-([iop])(\d+)$")
# Below this a buffer travels inline in the message: a segment costs more than copying it into a
# frame (the same threshold as zero-copy frames, shared/LIMITS.md). Tests set it to 0 to send every
# buffer through shared memory.
MIN_BYTES = 64 * 1024
GRANULE = 64 * 1024          # segment sizes are rounded up to this
MAX_IDLE_BYTES = 2 << 30     # free segments kept for reuse, per client, beyond which they are closed
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault a whole mapping in at once, not page by page


class ShmError(Exception):
    """A segment could not be created, found or mapped; the caller uses the socket lane."""


# --- identity ---------------------------------------------------------------------------------------

def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pidns() -> int:
    try:
        return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or 0)
    except OSError:
        return 0


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def owner_tag(pid: int | None = None) -> str:
    """``<pid namespace>-<pid>-<start>`` of this process (or ``pid``): the owner part of its names."""
    pid = os.getpid() if pid is None else pid
    return f"{_pidns()}-{pid}-{proc_start(pid) or 0}"


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) and bool(boot_id())


def parse(name: Any) -> tuple[int, int, int, str] | None:
    """(pid namespace, pid, start, role) of a well-formed name; None otherwise."""
    m = NAME_RE.match(name) if isinstance(name, str) else None
    return (int(m[1]), int(m[2]), int(m[3]), m[4]) if m else None


def owner_dead(ns: int, pid: int, start: int) -> bool:
    """True only when certain: same pid namespace as this process, and no process with that pid
    and start time. A name from another namespace is never judged dead."""
    if ns != _pidns():
        return False
    now = proc_start(pid)
    return now is None or now != start


def sweep_stale(only_owner: str | None = None) -> list[str]:
    """Unlink the segments whose owner is dead (or, with ``only_owner``, that owner's, which the
    caller knows is dead). Returns the names removed."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        parsed = parse(name)
        if parsed is None:
            continue
        ns, pid, start, _ = parsed
        if only_owner is not None:
            if f"{ns}-{pid}-{start}" != only_owner:
                continue
        elif not owner_dead(ns, pid, start):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _map(name: str, size: int | None, writable: bool, create: bool) -> tuple[mmap.mmap, int]:
    path = os.path.join(SHM_DIR, name)
    flags = os.O_RDWR if writable or create else os.O_RDONLY
    if create:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise ShmError(f"cannot open segment {name}: {exc.strerror}") from None
    try:
        if create:
            os.ftruncate(fd, size)
        else:
            size = os.fstat(fd).st_size
        if size <= 0:
            raise ShmError(f"segment {name} is empty")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable or create else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED | POPULATE, prot)
    except (OSError, ValueError) as exc:
        if create:
            os.unlink(path)
        raise ShmError(f"cannot map segment {name}: {exc}") from None
    finally:
        os.close(fd)  # the mapping keeps the memory; the name is the only other handle
    return mm, size


def _strides(dtype: np.dtype, shape: tuple, order: str) -> tuple:
    strides, step = [0] * len(shape), dtype.itemsize
    axes = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    for ax in axes:
        strides[ax] = step
        step *= max(shape[ax], 1)
    return tuple(strides)


def _view(base: np.ndarray, offset: int, dtype: np.dtype, shape: tuple, order: str) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    flat = base[offset:offset + nbytes].view(dtype)
    return flat.reshape(shape, order=order)


def _check_loc(loc: Any) -> tuple[str, int, tuple]:
    from ..protocol.wire import WireError  # the wire's own error: a bad locator is a malformed message

    if not isinstance(loc, dict):
        raise WireError("'shm' must be a map")
    name, offset = loc.get("name"), loc.get("offset")
    parsed = parse(name)
    if parsed is None:
        raise WireError(f"shm segment name {name!r} is not a fusion_shim segment")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise WireError("shm offset must be an int >= 0")
    return name, offset, parsed


# --- client side --------------------------------------------------------------------------------------

class Segment:
    __slots__ = ("name", "size", "mm", "base", "role", "linked", "mapped", "__weakref__")

    def __init__(self, name: str, size: int, role: str):
        self.name, self.role = name, role
        self.mm, self.size = _map(name, size, writable=True, create=True)
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
            "data": (seg.base.ctypes.data + offset, False), "strides": _strides(dtype, shape, order)}

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

    def stage(self, results: list) -> "Staged":
        return Staged(self, results)

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes


class Staged:
    """One request's segments: inputs placed, result slots offered; the resolver for its reply."""

    def __init__(self, pool: ShmPool, results: list | None = None):
        self.pool = pool
        self.inputs: list[Segment] = []
        self.outputs: dict[str, Segment] = {}
        self.leased: set[str] = set()
        self.out_slots: list = []
        self.sent = self.received = 0  # buffer bytes this request moved through shared memory
        if results is not None:
            self.offer(results)

    def offer(self, results: list) -> None:
        """A slot per result (``(dtype, shape)`` pairs, the call's declared results) big enough to
        be worth a segment; None for the others, which travel inline."""
        for dtype, shape in results:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if nbytes < MIN_BYTES or nbytes == 0:
                self.out_slots.append(None)
                continue
            seg = self.pool.acquire("o", nbytes)
            self.outputs[seg.name] = seg
            self.out_slots.append({"name": seg.name, "offset": 0, "nbytes": nbytes})

    def place(self, meta: dict, buf: Any) -> dict | None:
        """Copy one input buffer into a segment; the locator for its meta, or None (send inline)."""
        src = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)
        if src.nbytes < MIN_BYTES or src.nbytes == 0:
            return None
        seg = self.pool.acquire("i", src.nbytes)
        seg.base[:src.nbytes] = src  # the one copy on this side
        self.sent += src.nbytes
        self.inputs.append(seg)
        self.pool.stats["bytes_staged"] += src.nbytes
        return {"name": seg.name, "offset": 0}

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str) -> np.ndarray:
        """A result the worker wrote into one of this request's slots, as a writable array whose
        base is a lease on the segment (wire.decode calls this for metas with ``shm``)."""
        from ..protocol.wire import WireError

        name, offset, _ = _check_loc(loc)
        seg = self.outputs.get(name)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
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


class Exchanged(NamedTuple):
    reply: dict
    arrays: list
    encoded: float   # perf_counter when the request was encoded (inputs copied into segments)
    sent: int        # input bytes that went through shared memory
    received: int    # result bytes that came back that way


def exchange(chan: Any, pool: "ShmPool | None", header: dict, items: Sequence[tuple[dict, Any]],
             fps: Sequence[str | None] | None, refs: Iterable[int], results: list, deadline: float,
             alive: Callable[[], bool] | None, event: Callable[[str], None]) -> Exchanged:
    """One request (``header["id"]``) and its reply. With a ``pool``, inputs that are not references
    go into segments and each declared result is offered a slot; a request that gets no usable
    reply retires its segments. Without one, or when ``/dev/shm`` refuses, the socket carries all."""
    from ..protocol import wire

    rid = header["id"]
    if pool is None:
        frames = wire.encode_wired(header, items, fps, refs)
        t = time.perf_counter()
        return Exchanged(*chan.request(rid, frames, deadline, alive), t, 0, 0)
    drops = pool.drops()
    if drops:  # segments retired earlier, which the worker may unmap now
        header = {**header, "shm_drop": drops}
    staged = Staged(pool)
    try:
        staged.offer(results)
        frames = wire.encode_wired({**header, "out_shm": staged.out_slots}, items, fps, refs, place=staged.place)
    except BaseException as exc:
        staged.abandon()
        if not isinstance(exc, ShmError):
            raise
        staged = None  # /dev/shm full or gone: this call's buffers use the socket
        event(f"shared memory: {exc}; a call's buffers went through the socket")
        frames = wire.encode_wired(header, items, fps, refs)
    t = time.perf_counter()
    try:
        reply, arrays = chan.request(rid, frames, deadline, alive, segments=staged)
    except BaseException:
        if staged is not None:
            staged.abandon()
        raise
    if staged is None:
        return Exchanged(reply, arrays, t, 0, 0)
    staged.finish(reply)
    return Exchanged(reply, arrays, t, staged.sent, staged.received)


# --- worker side --------------------------------------------------------------------------------------

class _Mapping:
    __slots__ = ("mm", "base", "size", "owner", "lo", "hi")

    def __init__(self, name: str, writable: bool):
        self.mm, self.size = _map(name, None, writable=writable, create=False)
        self.base = np.frombuffer(self.mm, np.uint8)
        if not writable:
            self.base.flags.writeable = False
        ns, pid, start, _ = parse(name)
        self.owner = f"{ns}-{pid}-{start}"
        self.lo = self.base.ctypes.data
        self.hi = self.lo + self.size


class ShmMapper:
    """The worker's view of its clients' segments: mapped on first use by name, kept until the
    client says ``shm_drop`` or dies. Inputs (``i``) are mapped read-only, result slots (``o``)
    read-write. Used from the server loop's thread only."""

    SWEEP_EVERY_S = 1.0

    def __init__(self) -> None:
        self._maps: dict[str, _Mapping] = {}
        self._new: list[str] = []
        self.clients: dict[str, int] = {}  # owner tag -> pid, for the liveness sweep
        self._last_sweep = 0.0
        self.stats = {"shm_mapped": 0, "shm_dropped": 0, "shm_swept": 0}

    def _get(self, name: str, role: str) -> _Mapping:
        from ..protocol.wire import WireError

        m = self._maps.get(name)
        if m is None:
            if parse(name)[3] != role:
                raise WireError(f"segment {name} cannot serve as {'an input' if role == 'i' else 'a result'}")
            try:
                m = _Mapping(name, writable=role == "o")
            except ShmError as exc:
                raise WireError(str(exc)) from None
            self._maps[name] = m
            self._new.append(name)
            self.stats["shm_mapped"] += 1
            pid = parse(name)[1]
            self.clients.setdefault(m.owner, pid)
        return m

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str) -> np.ndarray:
        """An input array on a client's segment, read-only (wire.decode calls this)."""
        from ..protocol.wire import WireError

        name, offset, _ = _check_loc(loc)
        m = self._get(name, "i")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + nbytes > m.size:
            raise WireError(f"input of {nbytes} bytes at {offset} overruns segment {name} of {m.size}")
        return _view(m.base, offset, dtype, shape, order)

    def out_view(self, slot: Any, nbytes: int) -> np.ndarray | None:
        """The bytes of a result slot the client offered, or None when it cannot take ``nbytes``
        (the result then travels inline)."""
        if not isinstance(slot, dict) or slot.get("nbytes") != nbytes:
            return None
        name, offset, _ = _check_loc(slot)
        m = self._get(name, "o")
        if offset + nbytes > m.size:
            return None
        return m.base[offset:offset + nbytes]

    def take_new(self) -> list[str]:
        out, self._new = self._new, []
        return out

    def drop(self, names: Any) -> None:
        if not isinstance(names, list):
            return
        for name in names:
            if isinstance(name, str) and self._maps.pop(name, None) is not None:
                self.stats["shm_dropped"] += 1

    def aliases(self, ptr: int) -> bool:
        """Does an address fall inside a client's segment? (a tensor that must be copied before it is kept)"""
        return any(m.lo <= ptr < m.hi for m in self._maps.values())

    def answer_probe(self, offer: Any) -> dict:
        """The worker's half of the handshake: read the client's probe segment back."""
        if not isinstance(offer, dict):
            return {"ok": False, "why": "malformed offer"}
        if offer.get("boot") != boot_id():
            return {"ok": False, "why": "another host (boot ids differ)"}
        name, token = offer.get("probe"), offer.get("token")
        parsed = parse(name)
        if parsed is None or parsed[3] != "p" or not isinstance(token, str) or len(token) != 32:
            return {"ok": False, "why": "malformed probe"}
        try:
            mm, _ = _map(name, None, writable=False, create=False)
        except ShmError as exc:
            return {"ok": False, "why": f"probe not visible here ({exc}): /dev/shm is not shared"}
        try:
            seen = bytes(mm[:len(token)]).decode("ascii", "replace")
        finally:
            mm.close()
        if seen != token:
            return {"ok": False, "why": "probe segment holds another token"}
        self.clients.setdefault(f"{parsed[0]}-{parsed[1]}-{parsed[2]}", parsed[1])
        return {"ok": True}

    def sweep(self, force: bool = False) -> list[str]:
        """Forget the mappings of clients that are gone and unlink the names they left behind.
        Cheap (one /proc read per client), but only every ``SWEEP_EVERY_S`` unless forced."""
        now = time.monotonic()
        if not force and now - self._last_sweep < self.SWEEP_EVERY_S:
            return []
        self._last_sweep = now
        removed: list[str] = []
        for owner in list(self.clients):
            ns, pid, start = (int(x) for x in owner.split("-"))
            if not owner_dead(ns, pid, start):
                continue
            del self.clients[owner]
            for name in [n for n, m in self._maps.items() if m.owner == owner]:
                del self._maps[name]
            removed += sweep_stale(only_owner=owner)
        self.stats["shm_swept"] += len(removed)
        return removed

    def sweep_all_clients(self) -> list[str]:
        """At exit: the names still linked of every client that is gone by now."""
        return self.sweep(force=True)

    def __len__(self) -> int:
        return len(self._maps)

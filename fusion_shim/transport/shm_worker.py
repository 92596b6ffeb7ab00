"""The worker's half of the same-host lane (:mod:`.shm`): its clients' segments, opened by name on
first use and held by their fds until a client says so or dies. A segment belongs to the principal
that first named it (D60): another principal naming it is answered as if it did not exist, and on
an ``ipc://`` connection a segment must belong to the peer's uid. An input is copied into a buffer
of the worker's own and a result into its slot: through a mapping of the segment with the C
extension's copy, which a SIGBUS stops without harm (D180), else through the fd (D67). Either way a
client that truncates its segment fails its own call, never the worker."""
from __future__ import annotations

import math
import mmap
import os
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from .. import _ext
from ..protocol.wire import WireError
from .principal import Principal
from .shm_common import (POPULATE, ShmError, boot_id, check_loc, open_segment, owner_dead, parse, read_into,
                         sweep_stale, write_from)

GRANULE = 64 * 1024   # input buffers are rounded up to this, the client's segment granule
IDLE_BYTES = 2 << 30  # free input buffers kept for reuse, as much as a client keeps of idle segments
_UNLOADED = object()
COPY: Any = _UNLOADED  # D180: fusion_shim._segcopy, loaded with the first mapper; None where it is not built


def guarded_copy() -> Any:
    """D180: the C extension's copy that a SIGBUS stops (loaded on first need), or None."""
    global COPY
    if COPY is _UNLOADED:
        try:
            COPY = _ext.load("_segcopy")
        except ImportError:
            COPY = None
    return COPY


class _Segment:
    """A client's segment as the worker holds it: an open fd, and a mapping of its size at opening
    that only :data:`COPY` touches (D180; without it, the fd alone, D67)."""
    __slots__ = ("fd", "size", "owner", "principal", "role", "_mm", "_view")

    def __init__(self, name: str, writable: bool, principal: Principal, limit: int | None):
        self.fd, self.size = open_segment(name, writable, principal.uid, limit)
        self.principal = principal.name
        ns, pid, start, self.role = parse(name)
        self.owner = f"{ns}-{pid}-{start}"
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None

    def view(self) -> memoryview:
        """The segment's bytes as mapped here, mapped on first use (never populated: D66)."""
        if self._view is None:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.role == "o" else 0)
            self._mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, prot)
            self._view = memoryview(self._mm)
        return self._view

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._mm.close()
            self._view = self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Slot:
    """A result slot checked before the kernel runs, written after it (:meth:`ShmMapper.write`)."""
    __slots__ = ("seg", "offset", "nbytes")

    def __init__(self, seg: _Segment, offset: int, nbytes: int):
        self.seg, self.offset, self.nbytes = seg, offset, nbytes


class _Buffers:
    """The worker's own page-aligned buffers that inputs are read into. A buffer is reused once the
    last array on it is gone (a tensor the store keeps, a frame still being sent, hold it): faulting
    fresh pages in costs more than the read itself (D67). Finalizers may run on any thread: they
    only append to a deque."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []  # idle, sorted by size
        self._idle = 0
        self._returned: deque[mmap.mmap] = deque()

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of at least ``nbytes``, on a buffer no other array uses."""
        while self._returned:
            self._put_back(self._returned.popleft())
        mm = self._fit(nbytes)
        if mm is None:
            size = -(-max(nbytes, 1) // GRANULE) * GRANULE
            mm = mmap.mmap(-1, size, mmap.MAP_PRIVATE | POPULATE)
        base = np.frombuffer(mm, np.uint8)
        weakref.finalize(base, self._returned.append, mm).atexit = False
        return base

    def _fit(self, nbytes: int) -> mmap.mmap | None:
        for i, mm in enumerate(self._free):
            if nbytes <= len(mm) <= 2 * max(nbytes, GRANULE):
                del self._free[i]
                self._idle -= len(mm)
                return mm
        return None

    def release(self) -> int:
        """Unmap every buffer no array uses (D195: a run ended); returns the bytes given back."""
        while self._returned:
            self._free.append(self._returned.popleft())
        freed = 0
        for mm in self._free:
            size = len(mm)
            try:
                mm.close()
                freed += size
            except BufferError:  # an array still on it after all: its last reference unmaps it
                pass
        self._free.clear()
        self._idle = 0
        return freed

    def _put_back(self, mm: mmap.mmap) -> None:
        if self._idle + len(mm) > IDLE_BYTES:
            return  # unmapped when its last reference goes
        self._free.append(mm)
        self._free.sort(key=len)
        self._idle += len(mm)


def _fd_share() -> int:
    """The segments one principal may hold open: each costs an fd, and one client may take at most
    a quarter of this process's, so that the sockets keep theirs."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        soft = 1024
    return max(16, (soft if 0 < soft < 1 << 20 else 1 << 20) // 4)


class ShmMapper:
    """The worker's view of its clients' segments: opened on first use by name, held (an fd each)
    until the client says ``shm_drop`` or dies. Inputs (``i``) are opened read-only and read into
    the worker's own buffers, result slots (``o``) read-write. Used from the server loop's thread only."""

    SWEEP_EVERY_S = 1.0

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit  # the largest segment opened: the worker's message budget (D66)
        guarded_copy()
        self.per_principal = _fd_share()
        self._maps: dict[str, _Segment] = {}
        self._buffers = _Buffers()
        self._new: list[str] = []
        self.clients: dict[str, int] = {}  # owner tag -> pid, for the liveness sweep
        self._last_sweep = 0.0
        self.swept = 0  # names of dead clients unlinked
        self._by_principal: dict[str, dict[str, int]] = {}

    def _get(self, name: str, role: str, principal: Principal) -> _Segment | None:
        """The segment, opened for ``principal`` when it is new; None when it is new and
        ``principal`` holds its share of segments already."""
        if parse(name)[3] != role:
            raise WireError(f"segment {name} cannot serve as {'an input' if role == 'i' else 'a result'}")
        m = self._maps.get(name)
        if m is not None and m.principal != principal.name:
            raise WireError(f"cannot open segment {name}: No such file or directory")  # D60: as if absent
        if m is None:
            if self._live(principal) >= self.per_principal:
                return None
            try:
                m = _Segment(name, role == "o", principal, self.limit)
            except ShmError as exc:
                raise WireError(str(exc)) from None
            self._maps[name] = m
            self._new.append(name)
            self._count(principal, "shm_mapped")
            pid = parse(name)[1]
            self.clients.setdefault(m.owner, pid)
        return m

    def holds(self, name: str, principal: Principal) -> bool:
        """Whether segment ``name`` is open here for ``principal`` (reading it then opens nothing)."""
        m = self._maps.get(name)
        return m is not None and m.principal == principal.name

    def acting_for(self, principal: Principal) -> "_Segments":
        """The segments as ``principal`` may name them (what wire.decode resolves ``shm`` metas with)."""
        return _Segments(self, principal)

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str, principal: Principal) -> np.ndarray:
        """An input array read from a client's segment into a buffer of the worker's, read-only."""
        m = self._held_input(loc, principal)
        if m is not None:
            name, offset = loc["name"], loc["offset"]
        else:  # not open for it as an input: the locator's and the segment's full checks, and their errors
            name, offset, _ = check_loc(loc)
            m = self._get(name, "i", principal)
            if m is None:
                raise WireError(f"cannot open segment {name}: this client holds {self.per_principal} segments here")
        nbytes = math.prod(shape) * dtype.itemsize  # D77: np.prod of a tuple costs 6 us, math.prod 0.1
        if offset + nbytes > m.size:
            raise WireError(f"input of {nbytes} bytes at {offset} overruns segment {name} of {m.size}")
        base = self._buffers.take(nbytes)
        try:
            if COPY is not None:  # D180: a SIGBUS (the client cut its segment) stops the copy short
                if not COPY.copy(base[:nbytes], m.view()[offset:offset + nbytes]):
                    raise WireError(f"segment {name} ends short of its input's {nbytes} bytes at {offset}: "
                                    "it was truncated")
            elif (got := read_into(m.fd, base[:nbytes], offset)) < nbytes:
                raise WireError(f"segment {name} ends {got} bytes after {offset}, short of its input's {nbytes}: "
                                "it was truncated")
        except OSError as exc:
            raise WireError(f"cannot read segment {name}: {exc.strerror}") from None
        arr = base[:nbytes].view(dtype).reshape(shape, order=order)
        arr.flags.writeable = False
        return arr

    def _held_input(self, loc: Any, principal: Principal) -> _Segment | None:
        """D79: the input segment ``loc`` names, open for ``principal``, at an offset that is an int
        >= 0 (its name was checked when it was opened, its role is the name's); None otherwise."""
        if type(loc) is not dict:
            return None
        name, offset = loc.get("name"), loc.get("offset")
        m = self._maps.get(name) if type(name) is str else None
        if m is None or m.role != "i" or m.principal != principal.name or type(offset) is not int or offset < 0:
            return None
        return m

    def out_slot(self, slot: Any, nbytes: int, principal: Principal) -> _Slot | None:
        """A result slot the client offered, to write once the kernel ran (:meth:`write`), or None
        when it cannot take ``nbytes`` (the result then travels inline)."""
        if not isinstance(slot, dict) or slot.get("nbytes") != nbytes:
            return None
        name, offset, _ = check_loc(slot)
        m = self._get(name, "o", principal)
        if m is None or offset + nbytes > m.size:
            return None
        return _Slot(m, offset, nbytes)

    def write(self, slot: _Slot, result: np.ndarray) -> bool:
        """Write ``result`` into its slot; False (it then travels inline) when it is not one block
        of the slot's size, or the segment no longer reaches past the slot or cannot be written."""
        if result.nbytes != slot.nbytes or not (result.flags.c_contiguous or result.flags.f_contiguous):
            return False
        seg, data = slot.seg, result.reshape(-1, order="A").view(np.uint8)
        if seg.fd < 0:
            return False
        try:
            if COPY is not None:  # D180: into the mapping; a SIGBUS past a cut end stops it
                return COPY.copy(seg.view()[slot.offset:slot.offset + slot.nbytes], data)
            if os.fstat(seg.fd).st_size < slot.offset + slot.nbytes:
                return False  # D67: the client cut its segment; a write would grow it back
            write_from(seg.fd, data, slot.offset)
        except OSError:
            return False
        return True

    def take_new(self) -> list[str]:
        out, self._new = self._new, []
        return out

    def drop(self, names: Any, principal: Principal) -> None:
        """Forget the segments ``principal`` names (its own only)."""
        if not isinstance(names, list):
            return
        for name in names:
            m = self._maps.get(name) if isinstance(name, str) else None
            if m is not None and m.principal == principal.name:
                self._maps.pop(name).close()
                self._count(principal, "shm_dropped")

    def _count(self, principal: Principal, what: str) -> None:
        counts = self._by_principal.setdefault(principal.name, {"shm_mapped": 0, "shm_dropped": 0})
        counts[what] += 1

    def _live(self, principal: Principal) -> int:
        return sum(1 for m in self._maps.values() if m.principal == principal.name)

    def stats_for(self, principal: Principal) -> dict[str, int]:
        """``principal``'s own segments and counters."""
        counts = self._by_principal.get(principal.name, {"shm_mapped": 0, "shm_dropped": 0})
        return {**counts, "shm_live": self._live(principal)}

    def answer_probe(self, offer: Any, principal: Principal) -> dict:
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
            fd, _ = open_segment(name, False, principal.uid, None)
        except ShmError as exc:
            return {"ok": False, "why": f"probe not visible here ({exc}): /dev/shm is not shared"}
        try:
            seen = os.pread(fd, len(token), 0).decode("ascii", "replace")
        except OSError:
            seen = ""
        finally:
            os.close(fd)
        if seen != token:
            return {"ok": False, "why": "probe segment holds another token"}
        self.clients.setdefault(f"{parsed[0]}-{parsed[1]}-{parsed[2]}", parsed[1])
        return {"ok": True}

    def release(self) -> int:
        """Unmap the idle input buffers (a principal's run ended, D195); the bytes given back."""
        return self._buffers.release()

    def sweep(self, force: bool = False) -> list[str]:
        """Forget the segments of clients that are gone and unlink the names they left behind.
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
                self._maps.pop(name).close()
            removed += sweep_stale(only_owner=owner)
        self.swept += len(removed)
        return removed

    def sweep_all_clients(self) -> list[str]:
        """At exit: the names still linked of every client that is gone by now."""
        return self.sweep(force=True)

    def __len__(self) -> int:
        return len(self._maps)


class _Segments:
    """The mapper bound to one request's principal."""
    __slots__ = ("mapper", "principal")

    def __init__(self, mapper: ShmMapper, principal: Principal):
        self.mapper, self.principal = mapper, principal

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str) -> np.ndarray:
        return self.mapper.array(loc, dtype, shape, order, self.principal)

"""The worker's half of the same-host lane (:mod:`.shm`): its clients' segments, mapped by name on
first use, dropped when a client says so or dies. A mapping belongs to the principal that first
named it (D60): another principal naming it is answered as if it did not exist, and on an
``ipc://`` connection a segment must belong to the peer's uid."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .principal import Principal
from .shm_common import ShmError, boot_id, check_loc, map_segment, owner_dead, parse, sweep_stale, view_of


class _Mapping:
    __slots__ = ("mm", "base", "size", "owner", "lo", "hi", "principal")

    def __init__(self, name: str, writable: bool, principal: Principal, limit: int | None):
        self.mm, self.size = map_segment(name, None, writable=writable, create=False, uid=principal.uid, limit=limit)
        self.principal = principal.name
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

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit  # the largest segment mapped: the worker's message budget (D66)
        self._maps: dict[str, _Mapping] = {}
        self._new: list[str] = []
        self.clients: dict[str, int] = {}  # owner tag -> pid, for the liveness sweep
        self._last_sweep = 0.0
        self.swept = 0  # names of dead clients unlinked
        self._by_principal: dict[str, dict[str, int]] = {}

    def _get(self, name: str, role: str, principal: Principal) -> _Mapping:
        from ..protocol.wire import WireError

        if parse(name)[3] != role:
            raise WireError(f"segment {name} cannot serve as {'an input' if role == 'i' else 'a result'}")
        m = self._maps.get(name)
        if m is not None and m.principal != principal.name:
            raise WireError(f"cannot open segment {name}: No such file or directory")  # D60: as if absent
        if m is None:
            try:
                m = _Mapping(name, role == "o", principal, self.limit)
            except ShmError as exc:
                raise WireError(str(exc)) from None
            self._maps[name] = m
            self._new.append(name)
            self._count(principal, "shm_mapped")
            pid = parse(name)[1]
            self.clients.setdefault(m.owner, pid)
        return m

    def acting_for(self, principal: Principal) -> "_Segments":
        """The segments as ``principal`` may name them (what wire.decode resolves ``shm`` metas with)."""
        return _Segments(self, principal)

    def array(self, loc: Any, dtype: np.dtype, shape: tuple, order: str, principal: Principal) -> np.ndarray:
        """An input array on a client's segment, read-only."""
        from ..protocol.wire import WireError

        name, offset, _ = check_loc(loc)
        m = self._get(name, "i", principal)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + nbytes > m.size:
            raise WireError(f"input of {nbytes} bytes at {offset} overruns segment {name} of {m.size}")
        return view_of(m.base, offset, dtype, shape, order)

    def out_view(self, slot: Any, nbytes: int, principal: Principal) -> np.ndarray | None:
        """The bytes of a result slot the client offered, or None when it cannot take ``nbytes``
        (the result then travels inline)."""
        if not isinstance(slot, dict) or slot.get("nbytes") != nbytes:
            return None
        name, offset, _ = check_loc(slot)
        m = self._get(name, "o", principal)
        if offset + nbytes > m.size:
            return None
        return m.base[offset:offset + nbytes]

    def take_new(self) -> list[str]:
        out, self._new = self._new, []
        return out

    def drop(self, names: Any, principal: Principal) -> None:
        """Forget the mappings ``principal`` names (its own only)."""
        if not isinstance(names, list):
            return
        for name in names:
            m = self._maps.get(name) if isinstance(name, str) else None
            if m is not None and m.principal == principal.name:
                del self._maps[name]
                self._count(principal, "shm_dropped")

    def _count(self, principal: Principal, what: str) -> None:
        counts = self._by_principal.setdefault(principal.name, {"shm_mapped": 0, "shm_dropped": 0})
        counts[what] += 1

    def stats_for(self, principal: Principal) -> dict[str, int]:
        """``principal``'s own mappings and counters."""
        counts = self._by_principal.get(principal.name, {"shm_mapped": 0, "shm_dropped": 0})
        live = sum(1 for m in self._maps.values() if m.principal == principal.name)
        return {**counts, "shm_live": live}

    def aliases(self, ptr: int) -> bool:
        """Does an address fall inside a client's segment? (a tensor that must be copied before it is kept)"""
        return any(m.lo <= ptr < m.hi for m in self._maps.values())

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
            mm, _ = map_segment(name, None, writable=False, create=False, uid=principal.uid)
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

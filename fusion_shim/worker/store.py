"""The worker's resident store: device tensors kept by content fingerprint for the principal that
sent them (D60), under one byte budget, evicted least-recently-used. Inputs a client tagged with a
fingerprint and results of at least ``protocol.fingerprint.RESIDENT_MIN`` bytes are kept. Entries
are stored C-ordered under the canonical identity of their bytes
(:func:`fusion_shim.protocol.fingerprint.canonical`); a reference to the same bytes in F order gets
the transposed view. An entry is only used for a reference of its own principal whose dtype and
canonical shape match it exactly: another principal's entry is a miss like any other.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..protocol.fingerprint import canonical

_COUNTERS = ("evictions", "resident_hits", "resident_misses")


class ResidentStore:
    def __init__(self, budget: int):
        self.budget = int(budget)
        # (principal, fp) -> (tensor, (dtype, shape, order), nbytes)
        self._items: OrderedDict[tuple[str, str], tuple[Any, tuple, int]] = OrderedDict()
        self.nbytes = 0
        self._held: dict[str, int] = {}  # principal -> bytes it holds
        self._counts: dict[str, dict[str, int]] = {}

    def _count(self, owner: str, what: str, n: int = 1) -> None:
        counts = self._counts.setdefault(owner, dict.fromkeys(_COUNTERS, 0))
        counts[what] += n

    def get(self, owner: str, fp: str, meta: dict) -> Any | None:
        """The tensor ``owner`` keeps as ``fp``, viewed as ``meta`` (dtype, shape, order) asks; None if
        it keeps none."""
        item = self._items.get((owner, fp))
        if item is None or item[1] != canonical(meta):
            self._count(owner, "resident_misses")
            return None
        self._items.move_to_end((owner, fp))
        self._count(owner, "resident_hits")
        t = item[0]
        return t if meta["order"] == "C" else t.permute(*range(t.ndim - 1, -1, -1))

    def holds(self, owner: str, fp: str) -> bool:
        return (owner, fp) in self._items

    def put(self, owner: str, fp: str, tensor: Any, meta: dict,
            pinned: set[str] | frozenset = frozenset()) -> list[str]:
        """Keep ``tensor`` (laid out as ``meta`` says) for ``owner``; returns the fingerprints of
        ``owner``'s entries evicted to make room (never one in ``pinned``: the inputs of the call in
        progress). Room is made from ``owner``'s own entries first; another principal's evicted
        entry is not named (it learns of it as a miss). A tensor larger than the budget is not kept."""
        key = canonical(meta)
        if meta["order"] == "F":
            tensor = tensor.permute(*range(tensor.ndim - 1, -1, -1))  # its C-ordered canonical view
        size = tensor.numel() * tensor.element_size()
        if (owner, fp) in self._items:
            self._items.move_to_end((owner, fp))
            return []
        if size > self.budget:
            return []
        evicted: list[str] = []
        if self.nbytes + size > self.budget:
            own = [k for k in self._items if k[0] == owner and k[1] not in pinned]
            for old in own + self._over_share(owner):
                if self.nbytes + size <= self.budget:
                    break
                self._drop(old, counted=old[0] == owner)
                if old[0] == owner:
                    evicted.append(old[1])
        if self.nbytes + size > self.budget:
            return evicted
        self._items[(owner, fp)] = (tensor, key, size)
        self.nbytes += size
        self._held[owner] = self._held.get(owner, 0) + size
        return evicted

    def _over_share(self, owner: str) -> list[tuple[str, str]]:
        """D196: other principals' entries that ``owner``'s upload may evict, least recently used
        first: only what each holds beyond an equal share of the budget among those holding data."""
        holders = {p for p, n in self._held.items() if n > 0} | {owner}
        share = self.budget // len(holders)
        spare = {p: n - share for p, n in self._held.items() if p != owner and n > share}
        out = []
        for k in self._items:
            if spare.get(k[0], 0) > 0:
                out.append(k)
                spare[k[0]] -= self._items[k][2]
        return out

    def _drop(self, k: tuple[str, str], counted: bool = True) -> None:
        _, _, size = self._items.pop(k)
        self.nbytes -= size
        self._held[k[0]] -= size
        if counted:  # D196: an entry another principal's upload pushed out is not counted where its owner sees
            self._count(k[0], "evictions")

    def forget(self, owner: str) -> int:
        """Drop everything of ``owner``, its counters too (its run ended); returns the bytes freed."""
        freed = self._held.pop(owner, 0)
        for k in [k for k in self._items if k[0] == owner]:
            self.nbytes -= self._items.pop(k)[2]
        self._counts.pop(owner, None)
        return freed

    def evict_all(self, owner: str, except_: set[str] | frozenset = frozenset()) -> list[str]:
        """Drop all of ``owner``'s entries but ``except_`` (its call ran out of device memory: make
        the room its own entries take; other principals' stay)."""
        gone = [k for k in self._items if k[0] == owner and k[1] not in except_]
        for k in gone:
            self._drop(k)
        return [fp for _, fp in gone]

    def __contains__(self, fp: str) -> bool:
        """Whether any principal keeps ``fp`` (for tests; the worker asks :meth:`holds`)."""
        return any(k[1] == fp for k in self._items)

    def clear(self) -> list[str]:
        gone = [fp for _, fp in self._items]
        self._items.clear()
        self.nbytes = 0
        self._held.clear()
        return gone

    def __len__(self) -> int:
        return len(self._items)

    def stats(self, owner: str) -> dict[str, int]:
        """What ``owner`` may know: its own entries and counters, and the budget they share."""
        counts = self._counts.get(owner, dict.fromkeys(_COUNTERS, 0))
        return {"resident_entries": sum(1 for k in self._items if k[0] == owner),
                "resident_bytes": self._held.get(owner, 0), "resident_budget": self.budget, **counts}


def default_budget(device: Any) -> int:
    """Half of the GPU's memory; on the CPU a quarter of RAM, at most 8 GiB."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 2
    try:
        import os

        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 8 << 30
    return min(ram // 4, 8 << 30)

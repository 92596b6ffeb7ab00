"""The worker's resident store: device tensors kept by content fingerprint, under a byte
budget, evicted least-recently-used. Inputs a client tagged with a fingerprint and results of at
least ``protocol.fingerprint.RESIDENT_MIN`` bytes are kept. Entries are stored C-ordered under the
canonical identity of their bytes (:func:`fusion_shim.protocol.fingerprint.canonical`); a reference
to the same bytes in F order gets the transposed view. An entry is only used for a reference whose
dtype and canonical shape match it exactly.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..protocol.fingerprint import canonical


class ResidentStore:
    def __init__(self, budget: int):
        self.budget = int(budget)
        self._items: OrderedDict[str, tuple[Any, tuple]] = OrderedDict()  # fp -> (tensor, (dtype, shape, order))
        self.nbytes = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0

    def get(self, fp: str, meta: dict) -> Any | None:
        """The tensor held for ``fp``, viewed as ``meta`` (dtype, shape, order) asks; None if not held."""
        item = self._items.get(fp)
        if item is None or item[1] != canonical(meta):
            self.misses += 1
            return None
        self._items.move_to_end(fp)
        self.hits += 1
        t = item[0]
        return t if meta["order"] == "C" else t.permute(*range(t.ndim - 1, -1, -1))

    def put(self, fp: str, tensor: Any, meta: dict, pinned: set[str] | frozenset = frozenset()) -> list[str]:
        """Keep ``tensor`` (laid out as ``meta`` says); returns the fingerprints evicted to make room
        (never one in ``pinned``: the inputs of the call in progress). A tensor larger than the
        budget is not kept."""
        key = canonical(meta)
        if meta["order"] == "F":
            tensor = tensor.permute(*range(tensor.ndim - 1, -1, -1))  # its C-ordered canonical view
        size = tensor.numel() * tensor.element_size()
        if fp in self._items:
            self._items.move_to_end(fp)
            return []
        if size > self.budget:
            return []
        evicted = []
        for old in list(self._items):
            if self.nbytes + size <= self.budget:
                break
            if old in pinned:
                continue
            t, _ = self._items.pop(old)
            self.nbytes -= t.numel() * t.element_size()
            self.evictions += 1
            evicted.append(old)
        if self.nbytes + size > self.budget:
            return evicted
        self._items[fp] = (tensor, key)
        self.nbytes += size
        return evicted

    def evict_all(self, except_: set[str] | frozenset = frozenset()) -> list[str]:
        """Drop everything but ``except_`` (out of device memory: make all the room there is)."""
        gone = [fp for fp in self._items if fp not in except_]
        for fp in gone:
            t, _ = self._items.pop(fp)
            self.nbytes -= t.numel() * t.element_size()
        self.evictions += len(gone)
        return gone

    def __contains__(self, fp: str) -> bool:
        return fp in self._items

    def clear(self) -> list[str]:
        gone = list(self._items)
        self._items.clear()
        self.nbytes = 0
        return gone

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        return {"resident_entries": len(self._items), "resident_bytes": self.nbytes, "resident_budget": self.budget,
                "evictions": self.evictions, "resident_hits": self.hits, "resident_misses": self.misses}


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

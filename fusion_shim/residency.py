"""Residency, client side: the mirror of what a worker holds, and what this process reuses.

Inputs are fingerprinted (:mod:`fusion_shim.protocol.fingerprint`) only for calls that are remote
candidates and only from ``RESIDENT_MIN`` bytes up.

The mirror is a hint: the worker's answer is final. A reference the worker no longer holds comes
back as a ``missing`` error and is resent once, by value (``runtime``).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .protocol.fingerprint import RESIDENT_MIN

HASH_BPS = 25e9  # fingerprinting a call's inputs from DRAM: a 32 MB matrix took 1.1-1.5 ms (~30 GB/s, LIMITS.md)


class HashRate:
    """How fast this process looks at a call's inputs (lays them out for the wire and fingerprints
    them), in bytes/s, learnt from its own looks (in log space, each weighing 1/8): whether a look
    can pay for itself (runtime)."""

    def __init__(self, bps: float = HASH_BPS) -> None:
        self.bps = bps

    def seconds(self, nbytes: int) -> float:
        return nbytes / self.bps

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes >= RESIDENT_MIN and seconds > 0:
            self.bps *= min(max(nbytes / seconds / self.bps, 0.1), 10.0) ** 0.125


REUSE_CAP = 3  # an input seen in k earlier calls is expected in about k more, at most this many


class Reuse:
    """How many of this process's remote-candidate calls each input (by fingerprint) was an input
    of, least recently used forgotten first. A chain of calls reusing one large matrix then prices
    that matrix's upload over the calls it will serve: uploaded once, it stays on the worker (issue
    5: a call that pays only once its inputs are there was otherwise never the first to go)."""

    def __init__(self, size: int = 1024) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def count(self, fp: str) -> int:
        with self._lock:
            return self._seen.get(fp, 0)

    def note(self, fps: Any) -> None:
        """One more call had these inputs (None: an input too small to keep)."""
        with self._lock:
            for fp in fps:
                if fp is not None:
                    self._seen[fp] = self._seen.get(fp, 0) + 1
                    self._seen.move_to_end(fp)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def least_share(self, fp: str | None) -> float:
        """The smallest share of an input's upload a call could ever be priced (an input seen before:
        its upload split over the most calls the pricing expects; one never seen: all of it)."""
        return 1.0 if fp is None or not self.count(fp) else 1.0 / (REUSE_CAP + 1)

    def share(self, fp: str | None) -> float:
        """The share of an input's upload one call is priced: an input seen in k earlier calls is
        expected in about k more (at most REUSE_CAP), its upload split over them and this one."""
        return 1.0 if fp is None else 1.0 / (min(self.count(fp), REUSE_CAP) + 1)


class Mirror:
    """What one worker is believed to hold: fingerprint -> bytes, in least-recently-used order."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, fp: str) -> bool:
        with self._lock:
            if fp in self._held:
                self._held.move_to_end(fp)
                return True
            return False

    def add(self, fp: str, nbytes: int) -> None:
        with self._lock:
            self._held[fp] = nbytes
            self._held.move_to_end(fp)

    def discard(self, fps: Any) -> None:
        with self._lock:
            for fp in fps:
                self._held.pop(fp, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def __len__(self) -> int:
        return len(self._held)

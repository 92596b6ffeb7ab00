"""Residency, client side: the mirror of what a worker holds, what this process reuses, and a call's
inputs laid out for the wire with their fingerprints.

Inputs are fingerprinted (:mod:`fusion_shim.protocol.fingerprint`) only for calls that are remote
candidates and only from ``RESIDENT_MIN`` bytes up.

The mirror is a hint: the worker's answer is final. A reference the worker no longer holds comes
back as a ``missing`` error and is resent once, by value (:mod:`.remote`).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

from ..protocol import wire
from ..protocol.fingerprint import RESIDENT_MIN, fingerprint, worth_keeping

HASH_BPS = 25e9  # D31: fingerprinting a call's inputs from DRAM, until this process has measured its own


class HashRate:
    """How fast this process looks at a call's inputs (lays them out for the wire and fingerprints
    them), in bytes/s, learnt from its own looks (in log space, each weighing 1/8): whether a look
    can pay for itself (:mod:`.call`)."""

    def __init__(self, bps: float = HASH_BPS) -> None:
        self.bps = bps

    def seconds(self, nbytes: int) -> float:
        return nbytes / self.bps

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes >= RESIDENT_MIN and seconds > 0:
            self.bps *= min(max(nbytes / seconds / self.bps, 0.1), 10.0) ** 0.125


REUSE_CAP = 3  # an input seen in k earlier calls is expected in about k more, at most this many
SITES_KEPT = 8  # D349: call sites remembered per input (the most recent): a loop's site recurs among them


class Reuse:
    """How many of this process's remote-candidate calls each input (by fingerprint) was an input
    of, and from which call sites, least recently used forgotten first. A chain of calls reusing one
    large matrix then prices that matrix's upload over the calls it will serve: uploaded once, it
    stays on the worker (D32: a call that pays only once its inputs are there was otherwise never
    the first to go). D349: only once the input recurs at a site that passed it before (a loop over
    unchanged data); passed by other sites only (straight-line code), no more use is in sight."""

    def __init__(self, size: int = 1024) -> None:
        self._seen: OrderedDict[str, tuple[int, tuple[str, ...]]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def count(self, fp: str) -> int:
        with self._lock:
            return self._seen.get(fp, (0, ()))[0]

    def note(self, fps: Any, site: str | None = None) -> None:
        """One more call, at ``site``, had these inputs (None: an input too small to keep)."""
        with self._lock:
            for fp in fps:
                if fp is not None:
                    k, sites = self._seen.get(fp, (0, ()))
                    if site is not None and site not in sites:
                        sites = (sites + (site,))[-SITES_KEPT:]
                    self._seen[fp] = (k + 1, sites)
                    self._seen.move_to_end(fp)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def least_share(self, fp: str | None) -> float:
        """The smallest share of an input's upload a call could ever be priced (an input seen before:
        its upload split over the most calls the pricing expects; one never seen: all of it)."""
        return 1.0 if fp is None or not self.count(fp) else 1.0 / (REUSE_CAP + 1)

    def share(self, fp: str | None, site: str | None = None) -> float:
        """The share of an input's upload one call at ``site`` is priced: an input seen in k earlier
        calls is expected in about k more (at most REUSE_CAP), its upload split over them and this
        one; D349: in full where ``site`` never passed it before (None: any site counts)."""
        if fp is None:
            return 1.0
        with self._lock:
            k, sites = self._seen.get(fp, (0, ()))
        return 1.0 if site is not None and site not in sites else 1.0 / (min(k, REUSE_CAP) + 1)


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


def holds_nothing(prep: Any) -> bool:
    """D38: whether every input and every declared result of a prepared call is below
    ``RESIDENT_MIN``: none is fingerprinted or kept, so the call travels by value whatever a worker
    holds, and its layout may repeat from a template as without residency."""
    return all(a.nbytes < RESIDENT_MIN for a in prep.arrays) and all(
        math.prod(s) * d.itemsize < RESIDENT_MIN for d, s in prep.results)


class Wired:
    """A call's inputs laid out for the wire, with fingerprints for those worth keeping; ``refs``:
    the indices the chosen worker is believed to hold (sent as references)."""

    def __init__(self, arrays: list):
        self.items, self.fps, self.refs = [], [], []
        self.sizes = [a.nbytes for a in arrays]
        self.hashed = 0  # bytes fingerprinted
        for arr in arrays:
            meta, buf = wire.to_wire(arr)
            self.items.append((meta, buf))
            keep = worth_keeping(arr.nbytes)
            self.fps.append(fingerprint(meta, buf) if keep else None)
            self.hashed += arr.nbytes if keep else 0

    def refs_in(self, mirror: Mirror) -> list[int]:
        return [i for i, fp in enumerate(self.fps) if fp is not None and fp in mirror]

    def to_send(self, mirror: Mirror, reuse: Reuse, site: str | None = None) -> tuple[int, int]:
        """(input bytes a worker with ``mirror`` is priced for, bytes of inputs reused here whose
        upload is priced over their reuse): what it holds costs nothing, what this process keeps
        reusing at ``site`` costs its share (residency.Reuse), the rest in full."""
        held = set(self.refs_in(mirror))
        priced = reused = 0.0
        for i, (fp, size) in enumerate(zip(self.fps, self.sizes)):
            if i in held:
                continue
            share = reuse.share(fp, site)
            priced += size * share
            reused += size if share < 1.0 else 0
        return int(priced), int(reused)

    def least_to_send(self, mirror: Mirror, reuse: Reuse) -> int:
        """The fewest input bytes a worker with ``mirror`` could ever be priced for with these inputs
        (what ``to_send`` prices once each reused input's share has fallen as far as it goes)."""
        held = set(self.refs_in(mirror))
        return int(sum(size * reuse.least_share(fp) for i, (fp, size) in enumerate(zip(self.fps, self.sizes))
                       if i not in held))

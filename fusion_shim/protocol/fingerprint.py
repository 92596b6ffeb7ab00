"""Content fingerprints, computed alike by the client (its inputs) and the worker (what it stores).

An array is identified by an xxh3-128 hash over its bytes as they travel, with its dtype and its
shape in C order: an F-ordered array is the C-ordered array of the reversed shape, so a matrix and
its transpose are one entry. An array changed in place, through any view, hashes differently, so a
stale copy is never used. Arrays under ``RESIDENT_MIN`` bytes always travel inline.
"""
from __future__ import annotations

from typing import Any

import xxhash

RESIDENT_MIN = 256 * 1024


def canonical(meta: dict) -> tuple[str, tuple]:
    """The identity of the bytes regardless of how they are viewed (``X`` and ``X.T`` are one entry)."""
    shape = tuple(meta["shape"])
    return meta["dtype"], shape if meta["order"] == "C" else shape[::-1]


def fingerprint(meta: dict, buf: Any) -> str:
    """The fingerprint of an array as :func:`fusion_shim.protocol.wire.to_wire` lays it out."""
    dtype, shape = canonical(meta)
    h = xxhash.xxh3_128()
    h.update(f"{dtype}|{','.join(map(str, shape))}|".encode())
    h.update(buf)
    return h.hexdigest()


def worth_keeping(nbytes: int) -> bool:
    """Whether an array of ``nbytes`` is fingerprinted and kept (smaller ones cost more to hash than they save)."""
    return nbytes >= RESIDENT_MIN

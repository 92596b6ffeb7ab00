"""A principal's resident entries and stats do not reveal another's uploads (D196): another's large
upload evicts only what a principal holds beyond an equal share of the budget, such an eviction is
not counted in the stats it sees, and a principal whose run ended is forgotten whole."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusion_shim.worker.store import ResidentStore  # noqa: E402

MIB = 1 << 20


def _put(store: ResidentStore, who: str, fp: str, mib: int) -> list:
    t = torch.zeros(mib * MIB // 8, dtype=torch.float64)
    return store.put(who, fp, t, {"dtype": "<f8", "shape": [mib * MIB // 8], "order": "C"})


def test_anothers_large_upload_evicts_nothing_of_a_principal_within_its_share():
    store = ResidentStore(8 * MIB)
    for i in range(3):
        _put(store, "alice", f"a{i}", 1)
    before = store.stats("alice")
    _put(store, "mallory", "big", 6)  # would need two of alice's three MiB
    assert all(store.holds("alice", f"a{i}") for i in range(3))  # alice holds 3 of her 4 MiB share
    assert not store.holds("mallory", "big")
    assert store.stats("alice") == before


def test_anothers_upload_takes_only_what_a_principal_holds_past_its_share_and_it_is_not_counted():
    store = ResidentStore(8 * MIB)
    for i in range(7):
        _put(store, "alice", f"a{i}", 1)
    _put(store, "mallory", "m", 3)  # 2 MiB free up to her share: alice loses 2, keeps 5 > 4
    assert store.holds("mallory", "m")
    assert sum(store.holds("alice", f"a{i}") for i in range(7)) == 5
    assert store.stats("alice")["evictions"] == 0  # what another's upload did is not shown to her
    assert store.stats("alice")["resident_bytes"] == 5 * MIB


def test_a_principals_own_uploads_still_count_its_own_evictions():
    store = ResidentStore(4 * MIB)
    for i in range(4):
        _put(store, "alice", f"a{i}", 1)
    assert _put(store, "alice", "a4", 2) == ["a0", "a1"]
    assert store.stats("alice")["evictions"] == 2


def test_a_forgotten_principal_leaves_nothing_and_its_counters_restart():
    store = ResidentStore(8 * MIB)
    _put(store, "alice", "a", 2)
    _put(store, "bob", "b", 1)
    assert store.get("alice", "a", {"dtype": "<f8", "shape": [2 * MIB // 8], "order": "C"}) is not None
    assert store.forget("alice") == 2 * MIB
    assert store.nbytes == MIB and store.holds("bob", "b") and not store.holds("alice", "a")
    assert store.stats("alice")["resident_hits"] == 0 and store.stats("alice")["resident_bytes"] == 0

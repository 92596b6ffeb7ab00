"""How a pool worker's resident budget follows from the workers sharing its host (D313), and how the
tables show it. No Ray cluster is started here (tests/pool/test_pool.py and test_pool_lifecycle.py
check it on emulated clusters)."""
from __future__ import annotations

import re

import pytest

from fusion_shim.pool import manage
from fusion_shim.pool.actor import host_share


def test_each_worker_counts_the_pools_workers_on_its_host_itself_included():
    assert manage.sharing(["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1"]) == [3, 1, 3, 3]
    assert manage.sharing(["10.0.0.1"]) == [1]


@pytest.mark.parametrize("sharing", [1, 2, 3])
def test_cpu_workers_sharing_a_host_split_the_single_workers_cap_evenly(sharing):
    import torch

    from fusion_shim.worker.store import default_budget

    cap = default_budget(torch.device("cpu"))
    assert host_share("cpu", sharing) == cap // sharing
    assert sharing * host_share("cpu", sharing) <= cap


@pytest.mark.parametrize(("n", "text"), [(0, "0B"), (1023, "1023B"), (512 << 10, "512K"),
                                         (3 << 29, "1.5G"), (8 << 30, "8.0G"), (None, "-")])
def test_sizes_read_as_memory_budget_reads_them(n, text):
    assert manage.size_text(n) == text


def test_the_table_shows_each_workers_budget_and_how_many_share_its_host():
    rows = [{"name": "p.0", "node": "abcd1234@10.0.0.1", "pid": 4321, "device": "cpu", "state": "ready", "calls": 3,
             "resident_bytes": 1 << 20, "memory_budget": 2 << 30, "sharing": 2},
            {"name": "p.1", "node": "ef012345@10.0.0.2", "device": "cpu", "state": "ready",
             "memory_budget": 4 << 30, "sharing": 1}]
    lines = manage.table(rows).splitlines()
    assert lines[0].split() == ["worker", "node", "pid", "device", "state", "calls", "resident", "budget"]
    cells = [re.split(r"\s{2,}", ln) for ln in lines[1:]]
    assert [c[:3] for c in cells] == [["p.0", "abcd1234@10.0.0.1", "4321"], ["p.1", "ef012345@10.0.0.2", "-"]], lines
    assert [c[-2:] for c in cells] == [["1.0M", "2.0G (2 on its host)"], ["-", "4.0G"]], lines

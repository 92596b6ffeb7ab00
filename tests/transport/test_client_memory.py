"""The client's memory on the same-host lane: a buffer passed twice is copied once, inputs past a
call's segment allowance travel from their own buffers (D202), and a call whose memory would not
fit this host or the worker is refused before anything is allocated for it (D203)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fusion_shim
from fusion_shim.client import remote
from fusion_shim.transport import shm, shm_client

from tests.helpers.shims import READY_S, last_record

pytestmark = [pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine"),
              pytest.mark.usefixtures("no_shim_after")]


def _names() -> set[str]:
    tag = shm.owner_tag().rsplit("-", 1)[0]
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"{shm.PREFIX}{tag}-")}


@pytest.fixture
def rt(inproc_worker):
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, residency=False)
    assert rt.link.wait_ready(READY_S)
    yield rt
    fusion_shim.uninstall()


def test_an_array_passed_twice_is_copied_into_one_segment_once(rt):
    x = np.random.default_rng(0).standard_normal(200_000)  # 1.6 MB, above the lane's minimum
    staged = rt.link.shm().stats["bytes_staged"]
    got = np.dot(x, x)
    rec = last_record(rt)
    assert rec.kind == "worker", rec.reason
    assert rec.shm_sent == x.nbytes
    assert rt.link.shm().stats["bytes_staged"] - staged == x.nbytes
    assert got == pytest.approx(np.dot.__wrapped__(x, x), rel=1e-12)


def test_inputs_past_the_calls_segment_allowance_travel_from_their_own_buffers(rt):
    n = (shm_client.INPUT_MAX_BYTES * 3 // 4) // 8  # two of them exceed the allowance, one does not
    a = np.full(n, 0.5)
    b = np.full(n, 2.0)
    got = np.dot(a, b)
    rec = last_record(rt)
    assert rec.kind == "worker", rec.reason
    assert rec.shm_sent == a.nbytes  # the first in a segment, the second as a frame of its own bytes
    assert rec.bytes_sent >= b.nbytes
    assert got == float(n)


def test_a_large_result_still_lands_in_its_slot_when_its_inputs_went_as_frames(rt, monkeypatch):
    monkeypatch.setattr(shm_client, "INPUT_MAX_BYTES", 0)
    a, b = np.random.default_rng(1).standard_normal((2, 300, 300))
    c = np.matmul(a, b)
    rec = last_record(rt)
    assert rec.kind == "worker", rec.reason
    assert rec.shm_sent == 0 and rec.bytes_sent >= a.nbytes + b.nbytes
    assert rec.shm_received == c.nbytes and isinstance(c.base, shm._Lease)
    np.testing.assert_allclose(c, np.matmul.__wrapped__(a, b), rtol=1e-12, atol=1e-10)


def test_a_call_that_would_not_fit_this_host_allocates_nothing_and_runs_here(rt, monkeypatch):
    monkeypatch.setattr(remote, "FIT_CHECK_MIN", 0)
    monkeypatch.setattr(remote, "host_available", lambda: 4096)
    a, b = np.random.default_rng(2).standard_normal((2, 300, 300))
    pool = rt.link.shm()
    created, names = pool.stats["segments_created"], _names()
    c = np.matmul(a, b)
    rec = last_record(rt)
    assert rec.kind == "fallback" and "refused before allocating" in rec.reason, rec.reason
    assert rec.bytes_sent == 0 and rec.shm_sent == 0
    assert pool.stats["segments_created"] == created and _names() == names
    np.testing.assert_array_equal(c, np.matmul.__wrapped__(a, b))
    monkeypatch.setattr(remote, "host_available", lambda: 1 << 40)
    np.matmul(a, b)  # the worker was not blamed: the next call goes there
    assert last_record(rt).kind == "worker", last_record(rt).reason


def test_a_call_past_the_workers_advertised_budget_is_not_sent(rt, monkeypatch):
    monkeypatch.setattr(remote, "FIT_CHECK_MIN", 0)
    monkeypatch.setitem(rt.link.info, "max_bytes", 100_000)
    a = np.random.default_rng(3).standard_normal((200, 200))
    np.matmul(a, a)
    rec = last_record(rt)
    assert rec.kind == "fallback" and "worker's message budget" in rec.reason, rec.reason
    assert rec.bytes_sent == 0


def test_the_worker_advertises_its_message_budget_and_the_client_keeps_it(rt):
    budget = rt.link.info.get("max_bytes")
    assert isinstance(budget, int) and budget > 0, rt.link.info


def test_a_result_larger_than_memory_gives_numpys_own_error_and_maps_nothing(rt, monkeypatch):
    asked = []

    def guarded(name, size, **kwargs):  # a regression must fail this test, not fill the host
        asked.append(size)
        if size > 1 << 30:
            raise shm.ShmError("a segment this large is refused in this test")
        return real(name, size, **kwargs)

    real = shm_client.map_segment
    monkeypatch.setattr(shm_client, "map_segment", guarded)
    a, b = np.ones((1 << 20, 1)), np.ones((1, 1 << 20))  # 8 MiB each; the product 8 TiB
    with pytest.raises(MemoryError) as plain:
        np.matmul.__wrapped__(a, b)
    names = _names()
    with pytest.raises(MemoryError) as shimmed:
        np.matmul(a, b)
    assert str(shimmed.value) == str(plain.value)
    rec = last_record(rt)
    assert "refused before" in rec.reason and rec.bytes_sent == 0, rec.reason
    assert _names() == names and not [n for n in asked if n > 1 << 20]

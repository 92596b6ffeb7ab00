"""D79: a repeated call whose inputs are in the client's segments is answered from its plan, with
the bytes the general path sends; its segments are read afresh at every call, through the same
checks, and whatever they refuse is answered as without the plan."""
from __future__ import annotations

import itertools
import os

import msgpack
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusion_shim.protocol import messages, wire
from fusion_shim.transport import shm
from fusion_shim.transport.principal import Principal
from fusion_shim.worker import server
from fusion_shim.worker.backend import TorchBackend
from fusion_shim.worker.kernels import KERNELS
from tests.worker.test_planned import _bytes, _count_passes

pytestmark = pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine")

N = 1024  # float64 elements per input
ME = Principal(f"uid:{os.getuid()}", os.getuid())  # ipc:// principals are uids: the segments' owner
_SEQ = itertools.count(800_000)  # far above the names the shim's own pool gives in this process


@pytest.fixture
def segments():
    made: list[str] = []

    def make(data: np.ndarray, role: str = "i") -> str:
        name = f"{shm.PREFIX}{shm.owner_tag()}-{role}{next(_SEQ)}"
        path = os.path.join(shm.SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, N * 8)
            os.pwrite(fd, data.tobytes(), 0)
        finally:
            os.close(fd)
        made.append(path)
        return name

    yield make
    for path in made:
        if os.path.exists(path):
            os.unlink(path)


def _worker() -> server.Worker:
    w = server.Worker("cpu", backend=TorchBackend("cpu"), kernels=dict(KERNELS))
    w.enable_shm("inproc://planned-segments")
    assert w.shm is not None
    return w


def _request(rid: int, a: str, b: str | np.ndarray, **extra) -> list:
    """``dot`` of the input in segment ``a`` and ``b`` (a segment, or a frame)."""
    header = messages.call_header(rid, "dot", {"cdtype": "<f8"}, ["C"], [(np.float64, ())])
    metas = [{"dtype": "<f8", "shape": [N], "order": "C", "shm": {"name": a, "offset": 0}}]
    frames = []
    if isinstance(b, str):
        metas.append({"dtype": "<f8", "shape": [N], "order": "C", "shm": {"name": b, "offset": 0}})
    else:
        metas.append({"dtype": "<f8", "shape": [N], "order": "C"})
        frames.append(b.tobytes())
    full = {"v": wire.VERSION, **header, "out_shm": [None], **extra, "arrays": metas}
    return [msgpack.packb(full), *frames]


def _no_plans(w: server.Worker) -> server.Worker:
    w.plans.find = lambda *args: None  # every request through the general path
    return w


@pytest.mark.parametrize("second", ["segment", "frame"])
def test_a_planned_segment_call_has_the_general_paths_bytes(segments, monkeypatch, second):
    monkeypatch.setattr(server.time, "perf_counter", lambda: 0.0)  # every phase 0.0 on both paths
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(N), rng.standard_normal(N)
    sa = segments(a)
    sb = segments(b) if second == "segment" else b
    w, general = _worker(), _no_plans(_worker())
    first = _bytes(w.handle(_request(1, sa, sb), ME))
    assert first == _bytes(general.handle(_request(1, sa, sb), ME))  # the first opens the segments, says so
    passes = _count_passes(monkeypatch)
    fast = _bytes(w.handle(_request(2, sa, sb), ME))
    assert passes == [True]
    assert fast == _bytes(general.handle(_request(2, sa, sb), ME))
    header, (r,) = wire.decode(fast)
    assert header["t"] == "result" and header["id"] == 2 and "shm_mapped" not in header
    np.testing.assert_allclose(r, a @ b)


def test_a_plan_reads_its_segments_afresh_at_every_call(segments):
    a, b = np.ones(N), np.ones(N)
    sa, sb = segments(a), segments(b)
    w = _worker()
    w.handle(_request(1, sa, sb), ME)
    path = os.path.join(shm.SHM_DIR, sa)
    for k in (2.0, 3.0, -1.5):
        with open(path, "r+b") as f:
            f.write(np.full(N, k).tobytes())
        _, (r,) = wire.decode(w.handle(_request(int(k * 10) + 50, sa, sb), ME))
        assert float(r) == k * N


def test_a_segment_cut_short_after_its_plan_is_refused_as_without_it(segments, monkeypatch):
    sa, sb = segments(np.ones(N)), segments(np.ones(N))
    w, general = _worker(), _no_plans(_worker())
    for x in (w, general):
        x.handle(_request(1, sa, sb), ME)
    os.truncate(os.path.join(shm.SHM_DIR, sb), N * 4)
    passes = _count_passes(monkeypatch)
    planned_reply = wire.decode(w.handle(_request(2, sa, sb), ME))[0]
    assert passes == [False]  # the read was refused before the kernel: no planned answer
    assert planned_reply["t"] == "error" and planned_reply["kind"] == "bad_request"
    assert "truncated" in planned_reply["msg"]
    assert planned_reply == wire.decode(general.handle(_request(2, sa, sb), ME))[0]


def test_a_dropped_segment_is_opened_again_by_the_general_path_which_says_so(segments, monkeypatch):
    sa, sb = segments(np.ones(N)), segments(np.ones(N))
    w = _worker()
    w.handle(_request(1, sa, sb), ME)
    drop = {"v": wire.VERSION, "t": "stats", "id": 2, "shm_drop": [sb], "arrays": []}
    assert wire.decode(w.handle([msgpack.packb(drop)], ME))[0]["t"] == "stats"
    passes = _count_passes(monkeypatch)
    header, (r,) = wire.decode(w.handle(_request(3, sa, sb), ME))
    assert passes == [False]
    assert header["t"] == "result" and header["shm_mapped"] == [sb] and float(r) == N


def test_another_principal_meets_neither_the_plan_nor_the_segments(segments, monkeypatch):
    sa, sb = segments(np.ones(N)), segments(np.ones(N))
    w = _worker()
    w.handle(_request(1, sa, sb), ME)
    passes = _count_passes(monkeypatch)
    other = Principal(ME.name + "0", ME.uid)  # another key on the same uid
    header = wire.decode(w.handle(_request(2, sa, sb), other))[0]
    assert passes == []
    assert header["t"] == "error" and "No such file" in header["msg"]


def test_a_call_offering_a_result_slot_gets_no_plan(segments, monkeypatch):
    sa, sb = segments(np.ones(N)), segments(np.ones(N))
    w = _worker()
    slot = [{"name": segments(np.zeros(N), "o"), "offset": 0, "nbytes": 8}]
    for rid in (1, 2):
        header = msgpack.unpackb(w.handle(_request(rid, sa, sb, out_shm=slot), ME)[0])
        assert header["t"] == "result" and header["arrays"][0]["shm"]["name"] == slot[0]["name"]
    assert not w.plans._plans

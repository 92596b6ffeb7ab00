"""A client's segment is mapped only if it fits the worker's message budget, and its pages are
faulted in only as the request reads them (D66): a sparse 2 GiB segment with 8 bytes declared
neither fills /dev/shm nor keeps the worker busy."""
from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

from fusion_shim.protocol import wire
from fusion_shim.transport import shm

pytest.importorskip("torch")

GIB2 = 2 << 30


@pytest.fixture
def sparse_segment():
    """A 2 GiB segment of this process with one float64 written at its start; the rest a hole."""
    name = f"fshm-{shm.owner_tag()}-i{os.getpid() % 100000}"
    path = os.path.join(shm.SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, GIB2)
        os.pwrite(fd, np.array([3.0]).tobytes(), 0)
    finally:
        os.close(fd)
    yield name, path
    if os.path.exists(path):
        os.unlink(path)


def _call(name: str) -> list:
    meta = {"dtype": "<f8", "shape": [1], "order": "C", "shm": {"name": name, "offset": 0}}
    return [msgpack.packb({"v": wire.VERSION, "t": "call", "id": 3, "op": "echo", "params": {"cdtype": "<f8"},
                           "layouts": ["C"], "arrays": [meta], "results": [{"dtype": "<f8", "shape": [1]}]})]


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def test_a_segment_larger_than_the_message_budget_is_refused_unmapped(sparse_segment):
    from fusion_shim.worker.server import Worker

    name, path = sparse_segment
    w = Worker("cpu", max_bytes=1_000_000)
    w.enable_shm("inproc://x")
    header, _ = wire.decode(w.handle(_call(name)))
    assert header["t"] == "error" and header["kind"] == "bad_request", header
    assert "more than this worker's message budget" in header["msg"]
    assert len(w.shm) == 0 and _allocated(path) < 1 << 20


def test_a_sparse_segment_within_the_budget_is_read_only_where_the_request_points(sparse_segment):
    from fusion_shim.worker.server import Worker

    name, path = sparse_segment
    w = Worker("cpu", max_bytes=4 << 30)
    w.enable_shm("inproc://x")
    header, arrays = wire.decode(w.handle(_call(name)))
    assert header["t"] == "result" and arrays[0].tolist() == [3.0], header
    assert _allocated(path) < 1 << 20  # the page it read, not 2 GiB of zeros

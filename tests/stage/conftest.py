"""A worker that runs stages (``--allow-code``), on a NumPy test backend, over ``ipc://`` so that
its clients are authenticated by their uid. SIMULATED device: NumPy on this host's CPUs."""
from __future__ import annotations

import time

import numpy as np
import pytest

import fusion_shim


class NumpyBackend:
    device = "cpu (NumPy test backend)"

    def warm(self) -> dict:
        return {}

    def run(self, kernel, arrays, params, layouts):
        t = time.perf_counter()
        out = [np.ascontiguousarray(r) for r in kernel(arrays, params)]
        return out, {"h2d": 0.0, "kernel": time.perf_counter() - t, "d2h": 0.0}


def _matmul(t, p):
    # a worker thread inside a process running the shim must not call into the shim itself
    return [getattr(np.matmul, "__wrapped__", np.matmul)(t[0], t[1])]


def stage_worker(url: str, allow_code: str | None = "any", **serve_kwargs):
    from fusion_shim.worker.server import Worker, serve_in_thread

    worker = Worker(backend=NumpyBackend(), kernels={"matmul": _matmul}, max_bytes=1 << 31, allow_code=allow_code)
    thread, stop = serve_in_thread(url, worker=worker, **serve_kwargs)
    return worker, thread, stop


@pytest.fixture
def code_worker(tmp_path):
    url = f"ipc://{tmp_path}/stage.sock"
    worker, thread, stop = stage_worker(url)
    yield url, worker
    stop.set()
    thread.join(10)


@pytest.fixture
def plain_worker(tmp_path):
    url = f"ipc://{tmp_path}/plain.sock"
    worker, thread, stop = stage_worker(url, allow_code=None)
    yield url, worker
    stop.set()
    thread.join(10)


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    fusion_shim.uninstall()

"""A small call's kernel on a CPU device runs on the worker's thread alone (D71): waking the
intra-op pool costs more than such a kernel; a large one keeps the pool."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusion_shim.worker.backend import ONE_THREAD_MAX, TorchBackend  # noqa: E402


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _threads_seen(backend: TorchBackend, n: int) -> tuple[list, int]:
    seen: list = []

    def kernel(t: list, p: dict) -> list:
        seen.append(torch.get_num_threads())
        return [t[0] + t[1]]

    a = torch.from_numpy(np.arange(n, dtype=np.float64))
    out = backend.compute(kernel, [a, a], {"cdtype": "<f8"}, ["C"])
    assert torch.equal(out[0], 2 * a)
    return seen, torch.get_num_threads()


def test_a_small_cpu_kernel_runs_on_one_thread_and_the_pool_is_restored(two_threads):
    seen, after = _threads_seen(TorchBackend("cpu"), 8)
    assert seen == [1]
    assert after == 2


def test_a_kernel_over_the_size_keeps_the_pool(two_threads):
    n = ONE_THREAD_MAX // 16 + 1  # two float64 inputs just over the size together
    seen, after = _threads_seen(TorchBackend("cpu"), n)
    assert seen == [2]
    assert after == 2


def test_the_pool_is_restored_when_a_small_kernel_raises(two_threads):
    def kernel(t: list, p: dict) -> list:
        raise ValueError("bad operands")

    a = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ValueError):
        TorchBackend("cpu").compute(kernel, [a, a], {"cdtype": "<f8"}, ["C"])
    assert torch.get_num_threads() == 2

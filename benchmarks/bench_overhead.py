"""What the shim adds where it must add nothing: a small call on the fast path, and the .pth line
when FUSION_SHIM is unset. Both compared with a baseline measured in the same run.

    python -m pytest benchmarks/bench_overhead.py --benchmark-only --benchmark-group-by=group
"""
import os
from pathlib import Path

import numpy as np
import pytest

import fusion_shim

A = np.ones((4, 4))
B = np.ones((4, 4))
PTH = (Path(__file__).resolve().parent.parent / "fusion_shim.pth").read_text().strip()


def _loop(fn, n=1000):
    def run():
        for _ in range(n):
            fn(A, B)
    return run


@pytest.mark.benchmark(group="matmul 4x4 float64, 1000 calls")
def test_plain_numpy_matmul(benchmark):
    fusion_shim.uninstall()
    benchmark(_loop(np.matmul))


@pytest.mark.benchmark(group="matmul 4x4 float64, 1000 calls")
def test_shim_fast_path_matmul(benchmark):
    rt = fusion_shim.install(policy="auto", quiet=True)
    try:
        assert hasattr(np.matmul, "__wrapped__"), "np.matmul is not wrapped"
        assert rt.link.wait_ready(120), "worker not ready"  # its warm-up must not share the timing
        benchmark(_loop(np.matmul))
    finally:
        fusion_shim.uninstall()


@pytest.mark.benchmark(group="matmul 4x4 float64, 1000 calls")
def test_shim_policy_local_matmul(benchmark):
    fusion_shim.install(policy="local", quiet=True)
    try:
        benchmark(_loop(np.matmul))
    finally:
        fusion_shim.uninstall()


@pytest.mark.benchmark(group=".pth line, FUSION_SHIM unset")
def test_pth_line_unset(benchmark):
    assert "FUSION_SHIM" not in os.environ
    code = compile(PTH, "fusion_shim.pth", "exec")
    benchmark(exec, code, {})

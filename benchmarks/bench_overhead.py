"""What the shim adds where it must add nothing: a small call on the fast path, and the .pth line
when FUSION_SHIM is unset. Each compared with a baseline measured in the same run; the terminal
summary prints the added cost per call against the group's baseline (benchmarks/conftest.py).

    python -m pytest benchmarks/bench_overhead.py --benchmark-only --benchmark-group-by=group

Targets (issue 3): ``a @ b`` on 4x4 float64 with the shim installed (the C trampoline, below the
floor) adds <= 0.1 us per call over plain NumPy; ``np.matmul(a, b)`` through the wrapped module
function adds <= 0.5 us.
"""
import os
from pathlib import Path

import numpy as np
import pytest

import fusion_shim

A = np.ones((4, 4))
B = np.ones((4, 4))
CALLS = 1000
PTH = (Path(__file__).resolve().parent.parent / "fusion_shim.pth").read_text().strip()


def _matmul_loop():
    fn, a, b, r = np.matmul, A, B, range(CALLS)  # looked up now: the wrapper if installed

    def run():
        for _ in r:
            fn(a, b)
    return run


def _operator_loop():
    a, b, r = A, B, range(CALLS)

    def run():
        for _ in r:
            a @ b
    return run


def _dot_loop():
    a, b, r = A, B, range(CALLS)

    def run():
        for _ in r:
            a.dot(b)
    return run


ROUNDS = 2000  # fixed and many: the medians of a shared 2-core machine need them


def _bench(benchmark, loop, baseline=False):
    benchmark.extra_info.update(calls=CALLS, baseline=baseline)
    benchmark.pedantic(loop(), rounds=ROUNDS, warmup_rounds=100)


def _installed(**settings):
    # an embedded worker that starts: on a host without a GPU one asked for as `auto` is deferred (D40)
    settings.setdefault("device", "cpu")
    rt = fusion_shim.install(quiet=True, **settings)
    if rt.link is not None:
        assert rt.link.wait_ready(120), "worker not ready"  # its warm-up must not share the timing
    return rt


# -- a @ b -------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="a @ b, 4x4 float64, 1000 calls")
def test_plain_numpy_operator(benchmark):
    fusion_shim.uninstall()
    _bench(benchmark, _operator_loop, baseline=True)


@pytest.mark.benchmark(group="a @ b, 4x4 float64, 1000 calls")
def test_shim_operator_trampoline(benchmark):
    rt = _installed(policy="auto")
    try:
        assert rt.operators["intercepted"], rt.operators
        _bench(benchmark, _operator_loop)
        assert rt.ledger.records == []  # all below the floor: the C trampoline only
    finally:
        fusion_shim.uninstall()


# -- a.dot(b) ----------------------------------------------------------------------------------

@pytest.mark.benchmark(group="a.dot(b), 4x4 float64, 1000 calls")
def test_plain_numpy_dot_method(benchmark):
    fusion_shim.uninstall()
    _bench(benchmark, _dot_loop, baseline=True)


@pytest.mark.benchmark(group="a.dot(b), 4x4 float64, 1000 calls")
def test_shim_dot_method_trampoline(benchmark):
    rt = _installed(policy="auto")
    try:
        assert rt.operators["intercepted"], rt.operators
        _bench(benchmark, _dot_loop)
    finally:
        fusion_shim.uninstall()


# -- np.matmul(a, b) ---------------------------------------------------------------------------

@pytest.mark.benchmark(group="np.matmul 4x4 float64, 1000 calls")
def test_plain_numpy_matmul(benchmark):
    fusion_shim.uninstall()
    _bench(benchmark, _matmul_loop, baseline=True)


@pytest.mark.benchmark(group="np.matmul 4x4 float64, 1000 calls")
def test_shim_fast_path_matmul_c(benchmark):
    rt = _installed(policy="auto")
    try:
        assert hasattr(np.matmul, "__wrapped__") and rt.operators["fast_path"] == "C"
        _bench(benchmark, _matmul_loop)
    finally:
        fusion_shim.uninstall()


@pytest.mark.benchmark(group="np.matmul 4x4 float64, 1000 calls")
def test_shim_fast_path_matmul_wrapt(benchmark):
    rt = _installed(policy="auto", native=False)  # FUSION_SHIM_NATIVE=0: wrapt.FunctionWrapper
    try:
        assert hasattr(np.matmul, "__wrapped__") and rt.operators["fast_path"] == "wrapt"
        _bench(benchmark, _matmul_loop)
    finally:
        fusion_shim.uninstall()


@pytest.mark.benchmark(group="np.matmul 4x4 float64, 1000 calls")
def test_shim_policy_local_matmul(benchmark):
    _installed(policy="local")
    try:
        _bench(benchmark, _matmul_loop)
    finally:
        fusion_shim.uninstall()


@pytest.mark.benchmark(group=".pth line, FUSION_SHIM unset")
def test_pth_line_unset(benchmark):
    assert "FUSION_SHIM" not in os.environ
    code = compile(PTH, "fusion_shim.pth", "exec")
    benchmark(exec, code, {})

"""What a catalog row costs on the shim's slow path (issue 4): ``prepare`` binds the call and runs
the row's rule, which for some rows runs the library itself on tiny stand-ins to learn the result's
memory order (a "probe": kron, norms, pinv, qr raw, SciPy's functions). Each is measured next to the
library's own call on the same operands, in the same run, so the rule's share is visible.

    python -m pytest benchmarks/bench_catalog.py --benchmark-only --benchmark-group-by=param:case

No shim is installed: ``prepare`` is called directly, and the library's function is its own.
"""
from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

from fusion_shim.catalog import BY_NAME, prepare

scipy_linalg = pytest.importorskip("scipy.linalg")
scipy_fft = pytest.importorskip("scipy.fft")

RNG = np.random.default_rng(0)
M256 = RNG.standard_normal((256, 256)) + 256 * np.eye(256)
CASES = {
    # case: (row, args, kwargs); the rows with probes are marked in the id
    "matmul-256": ("numpy.matmul", (M256, M256), {}),
    "solve-256": ("numpy.linalg.solve", (M256, RNG.standard_normal(256)), {}),
    "eig-128": ("numpy.linalg.eig", (M256[:128, :128],), {}),
    "svd-hermitian-128(probe)": ("numpy.linalg.svd", (M256[:128, :128] + M256[:128, :128].T,), {"hermitian": True}),
    "qr-raw-256(probe)": ("numpy.linalg.qr", (M256,), {"mode": "raw"}),
    "vector_norm-axes-64^3(probe)": ("numpy.linalg.vector_norm", (RNG.standard_normal((64, 64, 64)),),
                                     {"axis": (0, 2)}),
    "kron-64x8(probe)": ("numpy.kron", (RNG.standard_normal((64, 64)), RNG.standard_normal((8, 8))), {}),
    "fftn-64^3": ("numpy.fft.fftn", (RNG.standard_normal((64, 64, 64)),), {}),
    "scipy-solve-256(probe)": ("scipy.linalg.solve", (M256, RNG.standard_normal(256)), {}),
    "scipy-fft-2^16": ("scipy.fft.fft", (RNG.standard_normal(1 << 16),), {}),
}


def _row(case: str):
    name, args, kwargs = CASES[case]
    spec = BY_NAME[name]
    fn = getattr(importlib.import_module(spec.module), spec.attr)
    return spec, inspect.signature(fn), fn, args, kwargs


@pytest.mark.parametrize("case", list(CASES))
def test_library_call(benchmark, case):
    spec, sig, fn, args, kwargs = _row(case)
    benchmark.extra_info.update(what="the library's own call")
    benchmark(fn, *args, **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_prepare(benchmark, case):
    spec, sig, fn, args, kwargs = _row(case)
    benchmark.extra_info.update(what="bind + rule (+ probe)")
    prep = benchmark(prepare, spec, sig, args, kwargs)
    assert prep.spec is spec

"""GPU fidelity (issue 9): the worker never returns less precision than NumPy would.

- TF32 is off: a float32 product with the identity is bit-exact (TF32 keeps 10 mantissa bits of the
  inputs, so with it on nearly every element would differ); on CUDA the same product with TF32
  switched on is shown to differ, so the check can fail on that hardware;
- float64 is computed in float64: a product whose float32 rounding error would be ~1e-7 agrees with
  NumPy to ~1e-15, and the dtype that comes back is float64.

Each runs against a worker on the CPU (always) and on CUDA (skipped where there is none; the GPU
machine's prepared run, benchmarks/gpu/run.sh, runs them there). The differential suite on CUDA is
``FUSION_DIFF_DEVICE=cuda pytest tests/catalog/test_differential.py``, which run.sh runs too.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import fusion_shim
from tests.helpers.shims import install, last_record
from tests.helpers.workers import thread_worker

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device here"))]


@pytest.fixture(scope="module", params=DEVICES)
def on_device(request):
    with thread_worker(f"fidelity-{request.param}", device=request.param) as (url, _):
        rt = install(url, timeout=120.0)
        yield rt, request.param
        fusion_shim.uninstall()


def test_tf32_is_off(on_device):
    rt, device = on_device
    assert rt.link.info["device"].startswith(device)
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    got = np.matmul(a, np.eye(1024, dtype=np.float32))
    assert last_record(rt).kind == "worker"
    np.testing.assert_array_equal(got, a)  # bit-exact: every mantissa bit survived
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"


@pytest.mark.skipif(not CUDA, reason="no CUDA device here")
def test_the_tf32_check_has_teeth_on_this_gpu():
    """With TF32 on, the same product is not bit-exact here: the check above would catch it."""
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
    eye = torch.eye(1024, device="cuda", dtype=torch.float32)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        lossy = torch.matmul(a, eye)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert not torch.equal(lossy, a), "TF32 on gave a bit-exact product: this GPU has no TF32 to detect"


def test_float64_is_computed_in_float64(on_device):
    rt, _ = on_device
    rng = np.random.default_rng(1)
    n = 512
    a = np.eye(n) + 1e-9 * rng.standard_normal((n, n))
    b = np.eye(n) + 1e-9 * rng.standard_normal((n, n))
    got = np.matmul(a, b)
    assert last_record(rt).kind == "worker" and got.dtype == np.float64
    want = np.matmul.__wrapped__(a, b)
    assert np.max(np.abs(got - want)) < 1e-14  # float32 would be off by ~6e-8 (its eps near 1)
    single = np.matmul.__wrapped__(a.astype(np.float32), b.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(single - want)) > 1e-9  # ... which is how the check could fail
    x = np.linalg.solve(a, b)
    assert last_record(rt).kind == "worker" and x.dtype == np.float64
    assert np.max(np.abs(np.matmul.__wrapped__(a, x) - b)) < 1e-12

"""The numba.cuda rows (issue 9) beyond the differential table: run under numba's CUDA SIMULATOR
here (conftest sets NUMBA_ENABLE_CUDASIM=1), and said so; not offered by a worker that can run them
neither on a GPU nor under the simulator; NumPy's own errors and data-dependent cases left to NumPy.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import fusion_shim
from tests.helpers.shims import installed, last_record
from tests.helpers.workers import thread_worker

pytest.importorskip("numba")


def test_the_simulator_is_labelled(shim):
    assert shim.link.info["numba"] == "simulator"
    assert "numba.bincount" in shim.link.info["kernels"]
    assert any("SIMULATOR" in what for _, what in shim.ledger.events)
    np.bincount(np.arange(10))
    assert last_record(shim).kind == "worker"


def test_atomics_with_many_collisions(shim):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, 3000)
    w = rng.standard_normal(3000)
    got = np.bincount(x, weights=w)
    assert last_record(shim).kind == "worker"
    np.testing.assert_allclose(got, np.bincount.__wrapped__(x, weights=w), rtol=1e-12)
    np.testing.assert_array_equal(np.bincount(x), np.bincount.__wrapped__(x))


def test_long_convolution_matches(shim):
    rng = np.random.default_rng(6)
    a, v = rng.standard_normal(700), rng.standard_normal(90)
    for mode in ("full", "same", "valid"):
        got = np.convolve(a, v, mode=mode)
        assert last_record(shim).kind == "worker"
        np.testing.assert_allclose(got, np.convolve.__wrapped__(a, v, mode=mode), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call,exc,why", [
    (lambda: np.bincount(np.array([1, -1, 2])), ValueError, "negative values"),
    (lambda: np.bincount(np.array([1.0, 2.0])), TypeError, "dtype float64"),
    (lambda: np.bincount(np.array([1, 2]), weights=np.ones(3)), ValueError, "do not match"),
    (lambda: np.bincount(np.array([1, 2]), minlength=-1), ValueError, "negative minlength"),
    (lambda: np.convolve(np.ones(3), np.ones(0)), ValueError, "empty"),
    (lambda: np.correlate(np.ones(3), np.ones(2), mode="diagonal"), ValueError, "mode="),
    (lambda: np.interp(np.ones(3), np.arange(4.0), np.arange(3.0)), ValueError, "differ in length"),
], ids=["negative", "float_x", "weights_shape", "minlength", "empty", "bad_mode", "interp_lengths"])
def test_numpy_errors_stay_numpys(shim, call, exc, why):
    with pytest.raises(exc):
        call()
    rec = last_record(shim)
    assert rec.kind == "raised" and why in rec.reason, rec
    assert rec.raised == exc.__name__


@pytest.mark.parametrize("call,why", [
    (lambda xp: np.interp(np.array([0.5, np.nan, 2.0]), xp, xp ** 2), "NaN"),
    (lambda xp: np.interp(np.array([0.5, 7.5]), xp, xp ** 2, period=3.0), "period="),
    (lambda xp: np.correlate(np.ones(5, bool), np.ones(2, bool)), "dtype bool"),
    (lambda xp: np.bincount(np.array([1, 2], np.uint64)), "dtype uint64"),
], ids=["nan", "period", "bool", "uint64"])
def test_cases_left_to_numpy_give_numpys_answer(shim, call, why):
    xp = np.arange(5.0)
    got = call(xp)
    rec = last_record(shim)
    assert rec.kind == "unsupported" and why in rec.reason, rec
    with fusion_shim_off():
        np.testing.assert_array_equal(got, call(xp))


class fusion_shim_off:
    """NumPy's own functions for the duration (the shim's wrappers pass through while local_only)."""

    def __enter__(self):
        self.rt = fusion_shim.active()
        self.rt.local_only = True

    def __exit__(self, *exc):
        self.rt.local_only = False


def test_a_worker_without_gpu_or_simulator_does_not_offer_them(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    with thread_worker("no-numba") as (url, _), installed(url) as rt:
        assert rt.link.info["numba"].startswith("unavailable: no CUDA device")
        assert not any(k.startswith("numba.") for k in rt.link.info["kernels"])
        x = np.array([0, 3, 3, 1])
        np.testing.assert_array_equal(np.bincount(x), [1, 1, 0, 2])
        rec = last_record(rt)
        assert rec.kind == "unsupported" and "no kernel numba.bincount" in rec.reason
        assert rec.bytes_sent == 0  # nothing was sent to find that out


def test_the_client_imports_neither_torch_nor_numba():
    """The numba rows and the shared-memory lane live on the client side too (catalog.numba,
    transport.shm): neither may pull the worker's libraries into the program."""
    import subprocess
    import sys

    code = ("import sys, numpy, fusion_shim\n"
            "from fusion_shim import catalog\nfrom fusion_shim.client import runtime\n"
            "from fusion_shim.transport import shm\n"
            "fusion_shim.install(policy='local', quiet=True)\n"
            "numpy.bincount(numpy.arange(3)); numpy.interp(0.5, [0.0, 1.0], [1.0, 2.0])\n"
            "fusion_shim.uninstall()\n"
            "print(sorted(m for m in ('torch', 'numba') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout

"""Checking a worker's answer against NumPy's own (issue 7).

A checked call is computed locally too and the two answers compared: same type, dtype and shape;
values within a dtype-aware tolerance relative to the answer's magnitude; and, for decompositions
whose factors are unique only up to sign or phase (svd, eigh, qr), the invariants instead of the raw
factors: singular values or eigenvalues, reconstruction of the input, orthonormal columns.

The tolerances are loose enough for a different BLAS/LAPACK/FFT on the same precision, and tight
enough that a wrong answer (one element off by 1e-3 of the scale) never passes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

TOLERANCE = {"f4": 2e-4, "c8": 2e-4, "f8": 1e-9, "c16": 1e-9}  # relative to the answer's scale


def tolerance(dtype: np.dtype) -> float:
    if dtype.kind in "biu":
        return 0.0  # integers: exact
    return TOLERANCE.get(f"{dtype.kind}{dtype.itemsize}", 1e-3)


def _rel_err(x: np.ndarray, y: np.ndarray, scale: float | None = None) -> float:
    """The worst difference between ``x`` and ``y`` relative to the scale of ``y``. Equal entries
    (infinities included) and NaN where the reference has NaN count as no difference."""
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        diff = np.where(same, 0.0, np.abs(x - y))
        worst = float(np.max(diff))
        finite = np.abs(y[np.isfinite(y)])
    if not np.isfinite(worst):
        return np.inf
    ref = scale if scale is not None else (float(np.max(finite)) if finite.size else 1.0)
    return worst / max(ref, np.finfo(np.float64).tiny)


def compare(op: str, got: Any, want: Any, inputs: list[np.ndarray]) -> str | None:
    """None when ``got`` matches ``want`` (NumPy's answer); otherwise what differs."""
    if type(got) is not type(want):
        return f"type {type(got).__name__} != {type(want).__name__}"
    if isinstance(got, tuple):
        return _compare_factors(op, got, want, inputs)
    g, w = np.asarray(got), np.asarray(want)
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
    tol = tolerance(w.dtype) * _size_factor(inputs)
    if tol == 0.0:
        return None if np.array_equal(g, w) else "integer results differ"
    err = _rel_err(g, w)
    return None if err <= tol else f"relative error {err:.3g} > {tol:.3g}"


def _size_factor(inputs: list[np.ndarray]) -> float:
    """Rounding grows with the length of the sums; allow sqrt(n) of it."""
    n = max((a.shape[-1] for a in inputs if a.ndim), default=1)
    return float(max(1.0, np.sqrt(n)))


def _compare_factors(op: str, got: tuple, want: tuple, inputs: list[np.ndarray]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} factors != {len(want)}"
    for g, w in zip(got, want):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
    a = inputs[0]
    tol = tolerance(got[0].dtype) * _size_factor(inputs) * 10
    scale = float(np.max(np.abs(a))) if a.size else 1.0
    name = op.rsplit(".", 1)[-1]
    if name == "svd":
        u, s, vh = got
        if _rel_err(s, want[1]) > tol:
            return "singular values differ"
        k = s.shape[-1]
        recon = (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]
        if _rel_err(recon, a, scale) > tol:
            return "U S Vh does not reconstruct the input"
        return None
    if name == "eigh":
        w, v = got
        if _rel_err(w, want[0], max(float(np.max(np.abs(want[0]))), scale)) > tol:
            return "eigenvalues differ"
        w_ref, v_ref = want  # eigh reads one triangle only: rebuild the matrix NumPy diagonalised
        herm = (v_ref * w_ref[..., None, :]) @ np.conj(np.swapaxes(v_ref, -1, -2))
        recon = (v * w[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2))
        if _rel_err(recon, herm, scale) > tol:
            return "V diag(w) V^H does not reconstruct the input"
        return None
    if name == "qr":
        q, r = got
        if not np.allclose(np.triu(r), r, atol=0):
            return "R is not upper triangular"
        if _rel_err(q @ r, a, scale) > tol:
            return "Q R does not reconstruct the input"
        return None
    # factors unique up to nothing: compare one by one
    for g, w in zip(got, want):
        if _rel_err(g, w) > tol:
            return "factors differ"
    return None


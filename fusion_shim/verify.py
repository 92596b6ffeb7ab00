"""Checking a worker's answer against NumPy's own.

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
    """None when ``got`` matches ``want`` (NumPy's answer); otherwise what differs. Never raises and
    never warns: a check that cannot be made is reported as a mismatch (the op is then pinned local)."""
    try:
        with np.errstate(all="ignore"):
            return _compare(op, got, want, inputs)
    except Exception as exc:  # noqa: BLE001 - a comparison bug must not reach the program
        return f"not comparable: {type(exc).__name__}: {exc}"[:200]


def _compare(op: str, got: Any, want: Any, inputs: list[np.ndarray]) -> str | None:
    if type(got) is not type(want):
        return f"type {type(got).__name__} != {type(want).__name__}"
    if isinstance(got, (tuple, list)):  # named tuples; SciPy's tuples, or lists from its batching
        return _compare_factors(op, got, want, inputs)
    g, w = np.asarray(got), np.asarray(want)
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
    tol = tolerance(w.dtype) * _size_factor(inputs)
    if tol == 0.0:
        return None if np.array_equal(g, w) else "integer results differ"
    name = op.rsplit(".", 1)[-1]
    if name == "eigvals":  # an unordered spectrum
        return _spectrum(g, w, inputs, tol)
    if name == "det":  # rounding moves a determinant by eps times Hadamard's bound, not its own size
        return None if _rel_err(g, w, _hadamard(inputs[0])) <= tol else "determinants differ"
    if name == "cond":  # a condition number c carries a relative error of about eps * c
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)):
            return "condition numbers differ in finiteness"
        slack = tol + float(np.max(np.abs(w[finite]), initial=0.0)) * np.finfo(np.float64).eps * 100
        return None if _rel_err(g[finite], w[finite]) <= slack else "condition numbers differ"
    if name == "qr":  # mode="r": R is unique up to row phases: compare R^H R (= A^H A)
        return _gram(g, w, tol)
    err = _rel_err(g, w)
    return None if err <= tol else f"relative error {err:.3g} > {tol:.3g}"


def _hadamard(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.result_type(a.dtype, np.float64))
    return float(np.max(np.prod(np.linalg.norm(a, axis=-2), axis=-1))) if a.size else 1.0


def _gram(r: np.ndarray, r_ref: np.ndarray, tol: float) -> str | None:
    gram = lambda x: np.conj(np.swapaxes(x, -1, -2)) @ x  # noqa: E731
    if not np.array_equal(np.triu(r), r):
        return "R is not upper triangular"
    return None if _rel_err(gram(r), gram(r_ref)) <= tol else "R^H R differs"


def _spectrum(got: np.ndarray, want: np.ndarray, inputs: list[np.ndarray], tol: float) -> str | None:
    """Eigenvalues of a general matrix, in whatever order: matched one to one, within the
    tolerance widened for their sensitivity (a defective eigenvalue moves by sqrt(eps))."""
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, np.finfo(np.float64).tiny)
    eps = np.finfo(got.dtype).eps if got.dtype.kind in "fc" else 0.0
    slack = max(tol, 30 * float(np.sqrt(eps))) * scale
    for g, w in zip(got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])):
        left = list(w)
        for x in g:
            d = [abs(x - y) for y in left]
            j = int(np.argmin(d))
            if d[j] > slack:
                return "eigenvalues differ"
            left.pop(j)
    return None


def _size_factor(inputs: list[np.ndarray]) -> float:
    """Rounding grows with the length of the sums; allow sqrt(n) of it."""
    n = max((a.shape[-1] for a in inputs if a.ndim), default=1)
    return float(max(1.0, np.sqrt(n)))


def _compare_factors(op: str, got: Any, want: Any, inputs: list[np.ndarray]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} factors != {len(want)}"
    got, want = [np.asarray(g) for g in got], [np.asarray(w) for w in want]
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
        # against NumPy's own reconstruction: with hermitian=True it factors one triangle only
        recon = (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]
        ref = (want[0][..., :, :k] * want[1][..., None, :]) @ want[2][..., :k, :]
        if _rel_err(recon, ref, scale) > tol:
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
    if name == "eig":  # eigenvalues as a set, A V = V diag(w), eigenvectors up to phase
        w, v = got
        problem = _spectrum(w, want[0], inputs, tol)
        if problem:
            return problem
        if _rel_err(a @ v, v * w[..., None, :], scale * a.shape[-1]) > tol:
            return "A V != V diag(w)"
        return None
    if name == "qr":
        if len(got) == 1:  # SciPy's mode="r": (R,)
            return _gram(got[0], want[0], tol)
        if got[1].ndim == got[0].ndim - 1:  # mode="raw": LAPACK's (h, tau), deterministic
            return None if all(_rel_err(g, w) <= tol for g, w in zip(got, want)) else "Householder factors differ"
        q, r = got
        if not np.allclose(np.triu(r), r, atol=0):
            return "R is not upper triangular"
        if _rel_err(q @ r, a, scale) > tol:
            return "Q R does not reconstruct the input"
        return None
    if name == "lu_factor":  # P L U = A (pivots may break ties differently)
        lu, piv = got
        if lu.ndim != 2:
            return None if all(np.array_equal(g, w) or _rel_err(g, w) <= tol for g, w in zip(got, want)) \
                else "factors differ"
        m, n = lu.shape
        k = min(m, n)
        perm = np.arange(m)
        for i, p in enumerate(piv):
            perm[i], perm[p] = perm[p], perm[i]
        recon = (np.tril(lu[:, :k], -1) + np.eye(m, k, dtype=lu.dtype)) @ np.triu(lu[:k, :])
        return None if _rel_err(recon, np.asarray(a, lu.dtype)[perm], scale) <= tol else "P L U != A"
    if name == "slogdet":  # sign * |det| against Hadamard's bound
        bound = _hadamard(a)
        det = lambda sg, la: sg * np.exp(np.where(sg != 0, la, 0) - np.log(bound)) * (sg != 0)  # noqa: E731
        return None if _rel_err(det(*got), det(*want), 1.0) <= tol else "determinants differ"
    if name == "lstsq":  # (x, residuals, rank, s); the rank exactly
        if not np.array_equal(got[2], want[2]):
            return "ranks differ"
        return None if all(_rel_err(g, w) <= tol for g, w in zip(got[:2] + got[3:], want[:2] + want[3:])) \
            else "least-squares results differ"
    # factors unique up to nothing: compare one by one
    for g, w in zip(got, want):
        if _rel_err(g, w) > tol:
            return "factors differ"
    return None


class Sampler:
    """``--verify FRACTION``: true for every 1/FRACTION-th answer it is asked about, evenly spread."""

    def __init__(self, fraction: float):
        self.fraction, self._debt = fraction, 0.0

    def __call__(self) -> bool:
        if self.fraction <= 0:
            return False
        self._debt += self.fraction
        if self._debt >= 1.0 - 1e-12:
            self._debt -= 1.0
            return True
        return False

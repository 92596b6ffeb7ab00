"""What the kernels share: the dtype table, the refusal (:class:`NotReproducible`) and the checks
that raise it where this device could decide differently from the library."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

Kernel = Callable[[list, dict], list]

DTYPES = {
    np.dtype(k): getattr(torch, v)
    for k, v in {"?": "bool", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64", "u1": "uint8",
                 "f2": "float16", "f4": "float32", "f8": "float64", "c8": "complex64", "c16": "complex128"}.items()
}
EPS64 = float(np.finfo(np.float64).eps)
# How close to a decision line counts as "not clear-cut": pivots and smallest singular values within
# RHO * n * eps of the largest, condition estimates within RHO * eps of SciPy's warning line.
RHO = 64.0
# Eigenvalues closer than this (relative to the largest) may be a complex pair on another LAPACK:
# a defective eigenvalue of multiplicity k moves by eps**(1/k); 1e-5 covers k <= 3 in double.
EIG_SPLIT = 1e-5


class NotReproducible(ArithmeticError):
    """This device's answer could differ from the library's in kind, not only in rounding."""


def _dt(name: str) -> torch.dtype:
    return DTYPES[np.dtype(name)]


def _eps(t: torch.Tensor) -> float:
    return float(torch.finfo(t.real.dtype if t.is_complex() else t.dtype).eps)


def _broadcast(*shapes: torch.Size) -> torch.Size:
    """Batch shapes broadcast together, by NumPy's rule (D55: not torch.broadcast_shapes, whose first
    call imports sympy)."""
    return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))


def _finite(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.is_floating_point() or t.is_complex():
            if not bool(torch.isfinite(t).all()):
                raise NotReproducible("non-finite input: the library decides what it gives")


def _zero_line(a: torch.Tensor) -> torch.Tensor:
    """Per matrix: a row or a column of exact zeros, which makes every LU exactly singular."""
    z = a == 0
    return z.all(-1).any(-1) | z.all(-2).any(-1)


def _lu(a: torch.Tensor, exempt_zero_lines: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LU with partial pivoting; refuses a matrix whose smallest pivot is within roundoff of zero
    (LAPACK may find it exactly zero, and NumPy raise LinAlgError, or not). Returns LU, pivots and
    a mask of the matrices exempted for an exact zero row or column (singular on every LAPACK)."""
    lu, piv, _ = torch.linalg.lu_factor_ex(a)
    d = lu.diagonal(dim1=-2, dim2=-1).abs()
    near = d.amin(-1) <= RHO * min(a.shape[-2:]) * _eps(a) * d.amax(-1)
    exempt = _zero_line(a) if exempt_zero_lines else torch.zeros_like(near)
    if bool((near & ~exempt).any()):
        raise NotReproducible("singular or nearly singular matrix: the library decides")
    return lu, piv, exempt


def _chol(a: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """Cholesky factor; refuses a matrix that is not, or only barely, positive definite."""
    factor, info = torch.linalg.cholesky_ex(a, upper=upper)
    if bool((info != 0).any()):
        raise NotReproducible("not positive definite: the library raises")
    d = factor.diagonal(dim1=-2, dim2=-1).real
    da = a.diagonal(dim1=-2, dim2=-1).real.abs().amax(-1)
    if bool((d.amin(-1) ** 2 <= RHO * a.shape[-1] * _eps(a) * da).any()):
        raise NotReproducible("barely positive definite: the library decides")
    return factor


def _check_cut(s: torch.Tensor, cut: torch.Tensor, n: int) -> None:
    """Singular values compared with a cut-off (a rank, a pseudo-inverse): refuse when one lies within
    a factor 4 of the cut, or at roundoff level when the cut is below that level (D56)."""
    s = s.double()
    cut = torch.as_tensor(cut, dtype=torch.float64, device=s.device)
    smax = s.amax(-1, keepdim=True)
    noise = n * EPS64 * smax
    near = (s >= cut / 4) & (s <= cut * 4)
    floor = (s <= noise) & (cut < 0.75 * noise)
    if bool(((near | floor) & (smax > 0)).any()):
        raise NotReproducible("a singular value next to the cut-off: the library decides")

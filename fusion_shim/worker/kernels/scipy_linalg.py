"""scipy.linalg: solve, inv, lu_factor, lu_solve, qr and expm, by the matrix structure SciPy's
chosen LAPACK routine reads, refusing where SciPy would raise or warn."""
from __future__ import annotations

from typing import Callable

import torch

from .common import RHO, Kernel, NotReproducible, _broadcast, _chol, _eps, _finite, _lu

def _structured(a: torch.Tensor, structure: str, lower: bool) -> torch.Tensor:
    """The matrix SciPy's chosen LAPACK routine reads: one triangle for sym/her/pos (``lower``
    says which), the diagonal or one triangle for the diagonal and triangular structures."""
    if structure == "gen":
        return a
    if structure == "diagonal":
        return torch.diag_embed(a.diagonal(dim1=-2, dim2=-1))
    if structure in ("upper", "lower"):
        return a.triu() if structure == "upper" else a.tril()
    tri, strict = (a.tril(), a.tril(-1)) if lower else (a.triu(), a.triu(1))
    if structure == "sym":
        return tri + strict.mT
    full = tri + strict.mH  # her, pos: Hermitian, the diagonal's imaginary part ignored
    if full.is_complex():
        full = full - torch.diag_embed(1j * full.diagonal(dim1=-2, dim2=-1).imag)
    return full


def _norm1(a: torch.Tensor) -> torch.Tensor:
    return a.abs().sum(-2).amax(-1)


def _inv_norm1_estimate(solve: Callable, solve_h: Callable, a: torch.Tensor) -> torch.Tensor:
    """A lower bound on ||A^-1||_1 by Hager and Higham's iteration (LAPACK's xLACN2, which SciPy's
    condition estimate uses), a fixed five steps plus Higham's alternating-sign vector."""
    n = a.shape[-1]
    x = torch.full(a.shape[:-1] + (1,), 1.0 / n, dtype=a.dtype, device=a.device)
    est = torch.zeros(a.shape[:-2], dtype=torch.float64, device=a.device)
    for _ in range(5):
        y = solve(x)
        est = torch.maximum(est, y.abs().sum((-2, -1)).double())
        mag = y.abs()
        xi = torch.where(mag > 0, y / torch.where(mag > 0, mag, 1).to(y.dtype), torch.ones_like(y))
        z = solve_h(xi)
        j = z.abs().squeeze(-1).argmax(-1)
        x = torch.nn.functional.one_hot(j, n).to(a.dtype).unsqueeze(-1)
    i = torch.arange(n, dtype=torch.float64, device=a.device)
    alt = ((-1.0) ** i * (1 + i / max(n - 1, 1))).to(a.dtype).expand(a.shape[:-1]).unsqueeze(-1)
    return torch.maximum(est, 2 * solve(alt).abs().sum((-2, -1)).double() / (3 * n))


def _check_rcond(a: torch.Tensor, inv_norm: torch.Tensor) -> None:
    rcond = 1.0 / (_norm1(a).double() * inv_norm)
    if bool((rcond < RHO * _eps(a)).any()):
        raise NotReproducible("ill-conditioned matrix: SciPy raises or warns (LinAlgWarning)")


def _s_factor(a: torch.Tensor, structure: str) -> tuple[Callable, Callable]:
    """Solvers for A x = b and A^H x = b by the structure's factorization (checked as _lu/_chol)."""
    if structure == "pos":
        factor = _chol(a)
        solve = lambda x: torch.cholesky_solve(x, factor)  # noqa: E731
        return solve, solve
    if structure in ("upper", "lower", "diagonal"):
        d = a.diagonal(dim1=-2, dim2=-1).abs()
        if bool((d.amin(-1) <= RHO * a.shape[-1] * _eps(a) * d.amax(-1)).any()):
            raise NotReproducible("singular or nearly singular matrix: SciPy decides")
        up = structure != "lower"
        return (lambda x: torch.linalg.solve_triangular(a, x, upper=up),
                lambda x: torch.linalg.solve_triangular(a.mH, x, upper=not up))
    lu, piv, _ = _lu(a)
    return (lambda x: torch.linalg.lu_solve(lu, piv, x),
            lambda x: torch.linalg.lu_solve(lu, piv, x, adjoint=True))


def _s_solve(t: list, p: dict) -> list:
    a, b = t
    _finite(a, b)
    a = _structured(a, p["structure"], p["lower"])
    solve, solve_h = _s_factor(a, p["structure"])
    _check_rcond(a, _inv_norm1_estimate(solve, solve_h, a))
    rhs = b.unsqueeze(-1) if p["vector_b"] else b
    batch = _broadcast(a.shape[:-2], rhs.shape[:-2])
    if batch != a.shape[:-2]:
        a = a.expand(batch + a.shape[-2:])
        solve, solve_h = _s_factor(a, p["structure"])
    rhs = rhs.expand(batch + rhs.shape[-2:])
    x = solve_h(rhs) if p["transposed"] else solve(rhs)  # transposed: real input only
    return [x.squeeze(-1) if p["vector_b"] else x]


def _s_inv(t: list, p: dict) -> list:
    a = t[0]
    _finite(a)
    a = _structured(a, p["structure"], p["lower"])
    solve, _ = _s_factor(a, p["structure"])
    x = solve(torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape))
    _check_rcond(a, _norm1(x).double())  # the exact ||A^-1||_1: SciPy's estimate is at most this
    return [x]


def _s_lu_factor(t: list, p: dict) -> list:
    a = t[0]
    _finite(a)
    lu, piv, _ = _lu(a)  # SciPy warns on an exactly zero pivot: such matrices stay with SciPy
    return [lu, (piv - 1).to(torch.int32)]


def _s_lu_solve(t: list, p: dict) -> list:
    lu, piv, b = t
    _finite(lu, b)
    if bool((lu.diagonal() == 0).any()):
        raise NotReproducible("a zero pivot: LAPACK divides by it; SciPy decides")
    piv = (piv + 1).to(torch.int32)
    rhs = b.unsqueeze(-1) if b.ndim == 1 else b
    trans = p["trans"]
    if trans == 0:
        x = torch.linalg.lu_solve(lu, piv, rhs)
    elif trans == 2 or not lu.is_complex():
        x = torch.linalg.lu_solve(lu, piv, rhs, adjoint=True)
    else:  # A^T x = b  <=>  A^H conj(x) = conj(b)
        x = torch.linalg.lu_solve(lu, piv, rhs.conj(), adjoint=True).conj()
    return [x.squeeze(-1) if b.ndim == 1 else x]


def _s_qr(t: list, p: dict) -> list:
    _finite(t[0])
    q, r = torch.linalg.qr(t[0], mode=p["mode"])
    return [r] if p["r_only"] else [q, r]


def _s_expm(t: list, p: dict) -> list:
    _finite(t[0])
    return [torch.linalg.matrix_exp(t[0])]


KERNELS: dict[str, Kernel] = {
    "scipy.linalg.solve": _s_solve,
    "scipy.linalg.inv": _s_inv,
    "scipy.linalg.lu_factor": _s_lu_factor,
    "scipy.linalg.lu_solve": _s_lu_solve,
    "scipy.linalg.qr": _s_qr,
    "scipy.linalg.expm": _s_expm,
}

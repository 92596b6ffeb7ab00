"""numpy.linalg: each kernel NumPy's sequence of LAPACK steps, refusing where the answer hinges on
a decision this device could take the other way."""
from __future__ import annotations

from typing import Any

import torch

from .common import EIG_SPLIT, EPS64, RHO, Kernel, NotReproducible, _broadcast, _check_cut, _chol, _dt, _eps, _finite, _lu

def _solve(t: list, p: dict) -> list:
    a, b = t
    _finite(a, b)
    lu, piv, _ = _lu(a)
    if b.ndim == 1:  # NumPy 2: a 1-d b is one vector, broadcast over a's batch
        rhs = b.reshape(b.shape + (1,)).expand(a.shape[:-1] + (1,))
        return [torch.linalg.lu_solve(lu, piv, rhs).squeeze(-1)]
    # both to the same rank: torch must never read b as a batch of vectors (its rule, not NumPy's)
    batch = _broadcast(a.shape[:-2], b.shape[:-2])
    return [torch.linalg.lu_solve(lu.expand(batch + lu.shape[-2:]), piv.expand(batch + piv.shape[-1:]),
                                  b.expand(batch + b.shape[-2:]))]


def _inv_lu(a: torch.Tensor) -> torch.Tensor:
    lu, piv, _ = _lu(a)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape)
    return torch.linalg.lu_solve(lu, piv, eye)


def _inv(t: list, p: dict) -> list:
    _finite(t[0])
    return [_inv_lu(t[0])]


def _tensorsolve(t: list, p: dict) -> list:
    a, b = t
    n = p["n"]
    x = _solve([a.permute(p["perm"]).reshape(n, n), b.reshape(n)], p)[0]
    return [x.reshape(p["shape"])]


def _tensorinv(t: list, p: dict) -> list:
    n = p["n"]
    return [_inv([t[0].reshape(n, n)], p)[0].reshape(p["shape"])]


def _cholesky(t: list, p: dict) -> list:
    _finite(t[0])
    return [_chol(t[0], upper=bool(p["upper"]))]


def _eigh(t: list, p: dict) -> list:
    _finite(t[0])
    if not p.get("vectors", True):
        return [torch.linalg.eigvalsh(t[0], UPLO=p["UPLO"])]
    w, v = torch.linalg.eigh(t[0], UPLO=p["UPLO"])
    return [w, v]


def _svd_hermitian(a: torch.Tensor, rt: torch.dtype) -> tuple:
    """numpy.linalg.svd(hermitian=True): eigh, then |w| sorted descending with the signs in V^H."""
    w, u = torch.linalg.eigh(a)
    w, u = w.to(torch.empty(0, dtype=rt).real.dtype), u.to(rt)
    sgn = torch.copysign(torch.ones_like(w), w)
    s = w.abs()
    sidx = torch.argsort(s, dim=-1, descending=True)
    sgn, s = sgn.gather(-1, sidx), s.gather(-1, sidx)
    u = u.gather(-1, sidx.unsqueeze(-2).expand(u.shape))
    vt = (u * sgn.unsqueeze(-2).to(rt)).mT.conj()
    return u, s, vt


def _svd(t: list, p: dict) -> list:
    a = t[0]
    _finite(a)
    if p.get("hermitian"):
        if not p["compute_uv"]:  # abs(eigvalsh): the client sorts, as NumPy does
            return [torch.linalg.eigvalsh(a).abs()]
        return list(_svd_hermitian(a, _dt(p["rdtypes"][0])))
    if not p["compute_uv"]:
        return [torch.linalg.svdvals(a)]
    u, s, vh = torch.linalg.svd(a, full_matrices=bool(p["full_matrices"]))
    return [u, s, vh]


def _qr(t: list, p: dict) -> list:
    _finite(t[0])
    if p["mode"] == "raw":  # LAPACK geqrf's output, as numpy.linalg.qr(mode="raw") returns it
        a = t[0]
        h, tau = torch.geqrf(a)
        _check_householder(a, h, tau)
        return [h.mT, tau]
    q, r = torch.linalg.qr(t[0], mode=p["mode"])
    return [r] if p["mode"] == "r" else [q, r]


def _check_householder(a: torch.Tensor, h: torch.Tensor, tau: torch.Tensor) -> None:
    """Householder vectors are LAPACK's internals: they match another LAPACK's to rounding only
    while each step's column is clearly nonzero (beta, R's diagonal) and its leading entry alpha
    (= beta * (1 - tau)) clearly nonzero, since dlarfg takes beta's sign from alpha's. Otherwise a
    roundoff-level column gets a reflector on one LAPACK and none on the other: refuse."""
    m, n = a.shape[-2:]
    beta = h.diagonal(dim1=-2, dim2=-1)
    alpha = beta * (1 - tau)
    scale = a.abs().square().sum(-2).sqrt().amax(-1, keepdim=True)
    noise = RHO * max(m, n) * _eps(a)
    if bool(((beta.abs() <= noise * scale) | (alpha.abs() <= noise * beta.abs())).any()):
        raise NotReproducible("a Householder step on a roundoff-level column: NumPy decides")


def _eig(t: list, p: dict) -> list:
    a = t[0]
    _finite(a)
    if p["vectors"]:
        w, v = torch.linalg.eig(a)
        out = [w, v]
    else:
        w = torch.linalg.eigvals(a)
        out = [w]
    if p.get("real_input"):
        _check_realness(w)
    return out


def _check_realness(w: torch.Tensor) -> None:
    """NumPy returns real arrays iff every eigenvalue in the stack has imaginary part exactly 0.
    That decision is clear-cut when some eigenvalue is clearly complex; otherwise refuse when an
    eigenvalue is nearly real, or two real ones nearly coincide (another LAPACK may split them
    into a complex pair, or merge a pair into two real ones)."""
    scale = w.abs().amax(-1, keepdim=True)
    delta = EIG_SPLIT * scale
    im = w.imag.abs()
    if bool((im > delta).any()):
        return
    nearly_real = (im > 0).any(-1)
    re = torch.where(im == 0, w.real, torch.full_like(w.real, float("nan"))).sort(-1).values
    close = (re.diff(dim=-1).abs() <= delta).any(-1) if w.shape[-1] > 1 else torch.zeros_like(nearly_real)
    if bool(((nearly_real | close) & (scale.squeeze(-1) > 0)).any()):
        raise NotReproducible("eigenvalues whose realness is not clear-cut: NumPy decides")


def _det(t: list, p: dict) -> list:
    a = t[0]
    _finite(a)
    _lu(a, exempt_zero_lines=True)
    if p["log"]:
        sign, logabs = torch.linalg.slogdet(a)
        return [sign, logabs]
    return [torch.linalg.det(a)]


def _pinv(t: list, p: dict) -> list:
    """numpy.linalg.pinv: svd of conj(a) (in double, its factors cast to the result type), singular
    values at or below rcond * max(s) zeroed, then V S^+ U^T in the result type."""
    a = t[0]
    _finite(a)
    rt = _dt(p["rdtypes"][0])
    a = a.conj()
    if p["hermitian"]:
        u, s, vt = _svd_hermitian(a, rt)
    else:
        u, s, vt = torch.linalg.svd(a, full_matrices=False)
        u, vt = u.to(rt), vt.to(rt)
        s = s.to(torch.empty(0, dtype=rt).real.dtype)
    cutoff = p["rcond"] * s.amax(-1, keepdim=True).double()
    _check_cut(s, cutoff, max(a.shape[-2:]))
    large = s.double() > cutoff
    sinv = torch.where(large, 1 / s, torch.zeros_like(s))
    return [vt.mT @ (sinv.unsqueeze(-1).to(rt) * u.mT)]


def _lstsq(t: list, p: dict) -> list:
    """numpy.linalg.lstsq (LAPACK gelsd) through the SVD: singular values at or below rcond * s[0]
    count as zero, the minimum-norm solution, residuals as sums of squares per column."""
    a, b = t
    _finite(a, b)
    rcond = p["rcond"] if p["rcond"] >= 0 else EPS64 / 2  # gelsd: negative means machine precision
    vec = b.ndim == 1
    B = b.unsqueeze(-1) if vec else b
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    cut = rcond * s[0]
    _check_cut(s, cut, max(a.shape))
    rank = int((s > cut).sum())
    x = vh[:rank].mH @ ((u[:, :rank].mH @ B) / s[:rank].unsqueeze(-1).to(B.dtype))
    resid = (B - a @ x).abs().square().sum(0)
    return [x[:, 0] if vec else x, resid, torch.tensor(rank, dtype=torch.int32, device=a.device), s]


def _vector_norm(x: torch.Tensor, ord: Any, axis: int) -> torch.Tensor:
    """numpy.linalg.norm over one axis, branch for branch."""
    if ord == float("inf"):
        return x.abs().amax(axis)
    if ord == float("-inf"):
        return x.abs().amin(axis)
    if ord == 0:
        return (x != 0).to(x.real.dtype).sum(axis)
    if ord == 1:
        return x.abs().sum(axis)
    if ord is None or ord == 2:
        return ((x.conj() * x).real if x.is_complex() else x * x).sum(axis).sqrt()
    if ord < 0 and bool((x == 0).any()):  # NumPy's abs(x) ** ord warns (divide by zero): it decides
        raise NotReproducible("a zero raised to a negative order: NumPy warns")
    r = x.abs().pow(ord).sum(axis)
    return r.pow(torch.tensor(1.0 / ord, dtype=r.dtype).item())


def _matrix_norm(x: torch.Tensor, ord: Any, row: int, col: int) -> torch.Tensor:
    """numpy.linalg.norm over two (non-negative) axes; 2, -2 and 'nuc' through singular values
    computed in double and cast to x's real dtype, as numpy.linalg.svd returns them."""
    real = x.real.dtype if x.is_complex() else x.dtype
    if ord in (2.0, -2.0, "nuc"):
        _finite(x)
        y = x.movedim((row, col), (-2, -1))
        s = torch.linalg.svdvals(y.to(torch.complex128 if x.is_complex() else torch.float64))
        if ord == -2.0 and bool((s[..., -1] <= RHO * max(y.shape[-2:]) * EPS64 * s[..., 0]).any()):
            raise NotReproducible("the smallest singular value is within roundoff of zero: NumPy decides")
        s = s.to(real)
        if ord == 2.0:
            return s.amax(-1)
        return s.amin(-1) if ord == -2.0 else s.sum(-1)
    if ord in (1.0, -1.0):
        c = col - 1 if col > row else col
        r = x.abs().sum(row)
        return r.amax(c) if ord == 1.0 else r.amin(c)
    if ord in (float("inf"), float("-inf")):
        rr = row - 1 if row > col else row
        r = x.abs().sum(col)
        return r.amax(rr) if ord > 0 else r.amin(rr)
    return ((x.conj() * x).real if x.is_complex() else x * x).sum((row, col)).sqrt()


def _norm(t: list, p: dict) -> list:
    x = t[0]
    pre = p.get("pre")
    if pre:
        x = x.permute(pre["perm"]).reshape(pre["shape"])
    if p["mode"] == "flat":
        f = x.reshape(-1)
        if f.is_complex():
            r = (torch.dot(f.real, f.real) + torch.dot(f.imag, f.imag)).sqrt()
        else:
            r = torch.dot(f, f).sqrt()
    elif p["mode"] == "vec":
        r = _vector_norm(x, p["ord"], p["axis"])
    else:
        r = _matrix_norm(x, p["ord"], *p["axis"])
    return [r.reshape(p["shape"])]


def _cond(t: list, p: dict) -> list:
    """numpy.linalg.cond: s[0]/s[-1] from singular values for p in (None, 2, -2); otherwise
    norm(x, p) * norm(inv(x), p), the inverse in double and NaN where it fails; NaN becomes inf."""
    x = t[0]
    _finite(x)
    rdt, td = _dt(p["rdtypes"][0]), _dt(p["tdtype"])
    ord = p["p"]
    if ord in (None, 2.0, -2.0):
        s = torch.linalg.svdvals(x.to(td)).to(rdt)
        s0, sl = s[..., 0], s[..., -1]
        if bool(((sl.double() <= RHO * max(x.shape[-2:]) * EPS64 * s0.double()) & (s0 > 0)).any()):
            raise NotReproducible("a singular value within roundoff of zero: NumPy decides")
        r = sl / s0 if ord == -2.0 else s0 / sl
    else:
        xd = x.to(td)
        lu, piv, exempt = _lu(xd, exempt_zero_lines=True)
        eye = torch.eye(x.shape[-1], dtype=td, device=x.device).expand(x.shape)
        inv = torch.linalg.lu_solve(lu, piv, eye)
        inv = torch.where(exempt[..., None, None], torch.full_like(inv, float("nan")), inv)
        row, col = x.ndim - 2, x.ndim - 1  # non-negative, as _matrix_norm's axis bookkeeping expects
        r = (_matrix_norm(x, ord, row, col).double() * _matrix_norm(inv, ord, row, col).double()).to(rdt)
    return [torch.where(torch.isnan(r), torch.full_like(r, float("inf")), r)]


def _matrix_rank(t: list, p: dict) -> list:
    """numpy.linalg.matrix_rank: count of singular values above tol, with NumPy's default tolerance
    max(M, N) * eps(S.dtype) * max(S); refuses a singular value next to it (see _check_cut)."""
    a = t[0]
    _finite(a)
    sdt = _dt(p["sdtype"])
    s = torch.linalg.eigvalsh(a).abs() if p["hermitian"] else torch.linalg.svdvals(a)
    s = s.to(sdt)
    if p["tol"] is not None:
        tol = torch.tensor(p["tol"], dtype=torch.float64, device=a.device)
    else:
        smax = s.amax(-1, keepdim=True).clamp_min(0)
        if p["rtol"] is None:
            tol = smax * (max(a.shape[-2:]) * float(torch.finfo(sdt).eps))
        else:
            tol = smax.double() * p["rtol"]
    _check_cut(s, tol.double(), max(a.shape[-2:]))
    return [(s.double() > tol.double()).sum(-1)]


def _matrix_power(t: list, p: dict) -> list:
    """numpy.linalg.matrix_power's own sequence of products (an inverse first for n < 0)."""
    a, n = t[0], p["n"]
    pdt = _dt(p["rdtypes"][0])
    if n < 0:
        _finite(a)
        a, n = _inv_lu(a).to(pdt), -n
    if n == 1:
        return [a]
    if n == 2:
        return [a @ a]
    if n == 3:
        return [(a @ a) @ a]
    z = result = None
    while n > 0:
        z = a if z is None else z @ z
        n, bit = divmod(n, 2)
        if bit:
            result = z if result is None else result @ z
    return [result]


KERNELS: dict[str, Kernel] = {
    "linalg.solve": _solve,
    "linalg.inv": _inv,
    "linalg.pinv": _pinv,
    "linalg.tensorsolve": _tensorsolve,
    "linalg.tensorinv": _tensorinv,
    "linalg.lstsq": _lstsq,
    "linalg.cholesky": _cholesky,
    "linalg.qr": _qr,
    "linalg.svd": _svd,
    "linalg.eig": _eig,
    "linalg.eigh": _eigh,
    "linalg.det": _det,
    "linalg.norm": _norm,
    "linalg.cond": _cond,
    "linalg.matrix_rank": _matrix_rank,
    "linalg.matrix_power": _matrix_power,
}

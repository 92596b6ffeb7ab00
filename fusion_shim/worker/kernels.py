"""Kernels in torch, one per catalog kernel id, CUDA when present and the CPU otherwise.

A kernel takes the operands, already on the device and cast to the compute dtype the client asked
for (``cdtype``, or ``idtypes`` per operand), and the call's static parameters; it returns result
tensors in NumPy's order, which the backend casts to ``rdtypes`` when the call names them (numpy.linalg
computes in double and returns single precision for single inputs: so does the worker).
Semantics are NumPy's (or SciPy's), not torch's: where the two differ the kernel bridges the gap.
TF32 is off: the worker never returns lower precision than NumPy would.

A kernel raises :class:`NotReproducible` where the library's answer hinges on a decision this device
could take the other way: a pivot that is (nearly) zero (NumPy raises LinAlgError, or not), a
singular value next to a cut-off (a rank, a pseudo-inverse), eigenvalues whose realness is not
clear-cut, a condition estimate near SciPy's warning line, non-finite input. The client then computes
the call with the library itself, and the ledger says why (issue 4).
"""
from __future__ import annotations

import inspect
import math
import os
import time
import warnings
from typing import Any, Callable

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


# A CPU worker's self-benchmark is what the planner trusts for every op it has not run there yet.
# Taken while other processes computed on its CPUs, it reads their load as this device's rate: one
# taken so on the 2-core development machine read float64 products at 47 GFLOP/s against 74-83 in
# three quiet starts, and the client it served never offloaded a float64 product that ran 1.3x faster
# there. So the benchmark is taken again (after a pause) while other processes used more than
# BENCH_OTHERS_MAX of this process's CPUs, at most BENCH_ATTEMPTS times; each point keeps its best
# time, and a benchmark that never ran clean says so in the hello (``contended``).
BENCH_OTHERS_MAX = 0.15
BENCH_ATTEMPTS = 3
BENCH_PAUSE_S = 1.0


def cpu_sample() -> tuple[float, float, float, int] | None:
    """(monotonic seconds, CPU-seconds spent busy on the CPUs this process may run on by every
    process, this process's CPU-seconds, how many CPUs), or None where /proc/stat is missing."""
    try:
        cpus = os.sched_getaffinity(0)
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(v) - v[3] - (v[4] if len(v) > 4 else 0)
    own = os.times()
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, len(cpus)


def others_share(before: tuple | None, after: tuple | None) -> float | None:
    """The share of this process's CPUs that other processes kept busy between two :func:`cpu_sample`
    (0: none, 1: all of them, all the time)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return min(max(others / ((after[0] - before[0]) * after[3]), 0.0), 1.0)


def bench_until_clean(measure: Callable[[], tuple[dict, dict, dict]], sample: Callable[[], Any],
                      attempts: int = BENCH_ATTEMPTS, pause: Callable[[float], None] = time.sleep,
                      ) -> tuple[dict, dict, dict, dict]:
    """``measure()`` -> (points, ops, failed), taken again while other processes used more than
    BENCH_OTHERS_MAX of the CPUs (``sample``: :func:`cpu_sample`, or one that returns None where the
    load cannot be read: one try).
    Returns each point's best time over the attempts, the ops no try could time, and what the hello
    says of the load: {"others_busy": [share per attempt], "contended": True if none was clean}."""
    points: dict = {}
    ops: dict = {}
    failed: dict = {}
    load: dict = {}
    busy: list[float] = []
    for attempt in range(max(attempts, 1)):
        start = sample()
        got_points, got_ops, got_failed = measure()
        share = others_share(start, sample())
        points, ops = _fastest(points, got_points), _fastest(ops, got_ops)
        failed = {**failed, **got_failed}
        if share is None:
            break
        busy.append(round(share, 3))
        load = {"others_busy": busy}
        if share <= BENCH_OTHERS_MAX:
            break
        if attempt + 1 < attempts:
            pause(BENCH_PAUSE_S)
    else:
        load["contended"] = True
    # an op timed in any try is not reported as failed
    failed = {op: why for op, why in failed.items() if f"{op}/f8" not in ops}
    return points, ops, failed, load


def _fastest(a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    """Per key, each [flops, seconds] point with the smaller time of the two (the same sizes)."""
    out = dict(a)
    for key, pts in b.items():
        mine = a.get(key)
        if mine is None or len(mine) != len(pts):
            out.setdefault(key, pts)
            continue
        out[key] = [p if p[1] <= q[1] else q for p, q in zip(mine, pts)]
    return out


class NotReproducible(ArithmeticError):
    """This device's answer could differ from the library's in kind, not only in rounding."""


def _dt(name: str) -> torch.dtype:
    return DTYPES[np.dtype(name)]


def _eps(t: torch.Tensor) -> float:
    return float(torch.finfo(t.real.dtype if t.is_complex() else t.dtype).eps)


def _broadcast(*shapes: torch.Size) -> torch.Size:
    """Batch shapes broadcast together, by NumPy's rule. Not torch.broadcast_shapes: its first call
    imports sympy (487 modules), 0.28-0.45 s charged to the first solve a worker ran; a slow client's
    exploration of a 30 ms solve took 436 ms, and the op was priced off it for the rest of the run."""
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
    """Singular values compared with a cut-off (a rank, a pseudo-inverse): refuse when one lies next
    to it. Measured on 3,000 rank-deficient matrices (OpenBLAS and MKL): singular values that are
    zero in exact arithmetic come out below 0.47 * n * eps * smax, and the two LAPACKs' values differ
    by under 6 * eps * smax. So a value within a factor 4 of the cut, or a roundoff-level value when
    the cut itself is below that level, could fall on the other side elsewhere."""
    s = s.double()
    cut = torch.as_tensor(cut, dtype=torch.float64, device=s.device)
    smax = s.amax(-1, keepdim=True)
    noise = n * EPS64 * smax
    near = (s >= cut / 4) & (s <= cut * 4)
    floor = (s <= noise) & (cut < 0.75 * noise)
    if bool(((near | floor) & (smax > 0)).any()):
        raise NotReproducible("a singular value next to the cut-off: the library decides")


# --- products --------------------------------------------------------------------------------------

def _matmul(t: list, p: dict) -> list:
    return [torch.matmul(t[0], t[1])]


def _dot(t: list, p: dict) -> list:
    a, b = t
    # numpy.dot sums over a's last axis and b's second-to-last (its only axis when 1-d)
    return [torch.tensordot(a, b, dims=([a.ndim - 1], [max(b.ndim - 2, 0)]))]


def _vdot(t: list, p: dict) -> list:
    a, b = (x.reshape(-1) for x in t)  # C order, whatever the operands' layout (NumPy's ravel)
    if a.is_floating_point() or a.is_complex():
        return [torch.vdot(a, b)]
    return [(a * b).sum(dtype=a.dtype)]


def _tensordot(t: list, p: dict) -> list:
    xa, xb = p["axes"]
    return [torch.tensordot(t[0], t[1], dims=(list(xa), list(xb)))]


def _einsum(t: list, p: dict) -> list:
    return [torch.einsum(p["subscripts"], *t)]


def _outer(t: list, p: dict) -> list:
    return [torch.outer(t[0].reshape(-1), t[1].reshape(-1))]


def _kron(t: list, p: dict) -> list:
    # torch.kron views its operands: a transposed (F-ordered) operand makes it raise
    return [torch.kron(t[0].contiguous(), t[1].contiguous())]


def _vecfunc(t: list, p: dict) -> list:
    a, b = t
    kind = p["kind"]
    if kind == "matvec":
        return [torch.matmul(a, b.unsqueeze(-1)).squeeze(-1)]
    if kind == "vecmat":  # conj(x1) . x2 along x1's last axis and x2's second-to-last
        return [torch.matmul(a.conj().unsqueeze(-2), b).squeeze(-2)]
    a, b = a.movedim(p["axes"][0], -1), b.movedim(p["axes"][1], -1)
    return [(a.conj() * b).sum(-1, dtype=a.dtype)]


def _cross(t: list, p: dict) -> list:
    """numpy.cross's own sequence: each component a product minus a product, then moveaxis."""
    ax_a, ax_b, axc = p["axes"]
    a, b = t[0].movedim(ax_a, -1), t[1].movedim(ax_b, -1)
    a, b = torch.broadcast_tensors(a, b)
    a0, a1, a2 = a.unbind(-1)
    b0, b1, b2 = b.unbind(-1)
    cp = torch.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], -1)
    return [cp.movedim(-1, axc)]


def _trace(t: list, p: dict) -> list:
    d = t[0].diagonal(offset=p["offset"], dim1=-2, dim2=-1)
    return [d.to(_dt(p["rdtype"])).sum(-1, dtype=_dt(p["rdtype"]))]


def _multi_dot(t: list, p: dict) -> list:
    """numpy.linalg.multi_dot's order: the cheaper of two for three arrays, else the classic
    matrix-chain dynamic programme (ties kept as NumPy keeps them)."""
    arrays = list(t)
    first_1d, last_1d = arrays[0].ndim == 1, arrays[-1].ndim == 1
    if first_1d:
        arrays[0] = arrays[0].unsqueeze(0)
    if last_1d:
        arrays[-1] = arrays[-1].unsqueeze(1)
    n = len(arrays)
    if n == 3:
        a, b, c = arrays
        cost1 = a.shape[0] * c.shape[0] * (a.shape[1] + c.shape[1])
        cost2 = a.shape[1] * c.shape[1] * (a.shape[0] + c.shape[0])
        res = (a @ b) @ c if cost1 < cost2 else a @ (b @ c)
    else:
        dims = [x.shape[0] for x in arrays] + [arrays[-1].shape[1]]
        cost = [[0.0] * n for _ in range(n)]
        split = [[0] * n for _ in range(n)]
        for length in range(1, n):
            for i in range(n - length):
                j = i + length
                cost[i][j] = float("inf")
                for k in range(i, j):
                    q = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                    if q < cost[i][j]:
                        cost[i][j], split[i][j] = q, k

        def chain(i: int, j: int) -> torch.Tensor:
            return arrays[i] if i == j else chain(i, split[i][j]) @ chain(split[i][j] + 1, j)

        res = chain(0, n - 1)
    if first_1d and last_1d:
        return [res[0, 0]]
    if first_1d or last_1d:
        return [res.reshape(-1)]
    return [res]


# --- numpy.linalg --------------------------------------------------------------------------------

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


# --- fft -------------------------------------------------------------------------------------------

FFT1 = {"fft": torch.fft.fft, "ifft": torch.fft.ifft, "rfft": torch.fft.rfft, "irfft": torch.fft.irfft,
        "hfft": torch.fft.hfft, "ihfft": torch.fft.ihfft}
FFTN = {"fft": torch.fft.fftn, "ifft": torch.fft.ifftn, "rfft": torch.fft.rfftn, "irfft": torch.fft.irfftn}


def _fft1(t: list, p: dict) -> list:
    return [FFT1[p["kind"]](t[0], n=p["n"], dim=p["axis"], norm=p["norm"])]


def _fftn(t: list, p: dict) -> list:
    return [FFTN[p["kind"]](t[0], s=p["s"], dim=p["axes"], norm=p["norm"])]


# --- scipy.linalg ----------------------------------------------------------------------------------

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
    "matmul": _matmul,
    "dot": _dot,
    "vdot": _vdot,
    "tensordot": _tensordot,
    "einsum": _einsum,
    "outer": _outer,
    "kron": _kron,
    "vecfunc": _vecfunc,
    "linalg.cross": _cross,
    "linalg.trace": _trace,
    "linalg.multi_dot": _multi_dot,
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
    "fft.fft1": _fft1,
    "fft.fftn": _fftn,
    "scipy.linalg.solve": _s_solve,
    "scipy.linalg.inv": _s_inv,
    "scipy.linalg.lu_factor": _s_lu_factor,
    "scipy.linalg.lu_solve": _s_lu_solve,
    "scipy.linalg.qr": _s_qr,
    "scipy.linalg.expm": _s_expm,
    # no catalog row: the transport benchmark's round trip (benchmarks/bench_shm.py, issue 9), its input back
    "echo": lambda t, p: [t[0]],
}
NUMPY_OF = {v: k for k, v in DTYPES.items()}
# the decompositions the worker times at start-up, each through its own kernel (TorchBackend._bench_ops):
# (op, keyword arguments); svd twice, its two variants 2.6x apart in work (catalog.linalg)
OPS_BENCH = (("numpy.linalg.eigh", {}), ("numpy.linalg.eigvalsh", {}), ("numpy.linalg.svd", {}),
             ("numpy.linalg.svd", {"compute_uv": False}), ("numpy.linalg.qr", {}), ("numpy.linalg.cholesky", {}),
             ("numpy.linalg.inv", {}), ("numpy.linalg.det", {}), ("numpy.linalg.slogdet", {}),
             ("numpy.linalg.pinv", {}))


class TorchBackend:
    """Moves arrays to the device and back and runs kernels there; times each phase."""

    def __init__(self, device: str = "auto"):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # TF32 off: float32 matmuls and convolutions keep full float32 precision
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        # inputs arrive as read-only views on ZeroMQ frames; kernels never write to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self._pinned: list[torch.Tensor] = []  # page-locked staging buffers, one per input slot (issue 9)
        self._staged = 0  # slots handed out since the last sync: a call's inputs each get their own

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._staged = 0  # every staged copy has landed: the buffers are free again

    def to_device(self, a: np.ndarray, staged: bool = False) -> torch.Tensor:
        """An input on the device, in its own dtype (the resident store keeps it so). ``staged``
        (an input in a client's shared-memory segment, issue 9): on a GPU it is copied into a
        page-locked buffer and sent from there asynchronously (the caller synchronizes before the
        next call reuses the buffer); on the CPU it is used in place."""
        if not (staged and self.device.type == "cuda" and a.size and a.dtype in DTYPES):
            return torch.from_numpy(_aligned(a)).to(self.device)
        buf = self._pin(self._staged, a.nbytes)[:a.nbytes]
        self._staged += 1
        fortran = a.ndim > 1 and not a.flags.c_contiguous
        buf.numpy()[:] = a.reshape(-1, order="F" if fortran else "C").view(np.uint8)
        host = buf.view(DTYPES[a.dtype])
        host = host.view(a.shape[::-1]).permute(*range(a.ndim - 1, -1, -1)) if fortran else host.view(a.shape)
        return host.to(self.device, non_blocking=True)

    def _pin(self, slot: int, nbytes: int) -> torch.Tensor:
        while len(self._pinned) <= slot:
            self._pinned.append(torch.empty(0, dtype=torch.uint8))
        if self._pinned[slot].numel() < nbytes:
            self._pinned[slot] = torch.empty(max(nbytes, 3 * self._pinned[slot].numel() // 2),
                                             dtype=torch.uint8, pin_memory=True)
        return self._pinned[slot]

    def run(self, kernel: Kernel, arrays: list[np.ndarray], params: dict, layouts: list) -> tuple[list, dict]:
        """Host arrays in, host arrays out, with the time of each phase (the health check; test
        backends offer only this)."""
        t0 = time.perf_counter()
        tensors = [self.to_device(a) for a in arrays]
        self.sync()
        t1 = time.perf_counter()
        results = self.compute(kernel, tensors, params, layouts)
        self.sync()
        t2 = time.perf_counter()
        out = self.to_host(results)
        return out, {"h2d": t1 - t0, "kernel": t2 - t1, "d2h": time.perf_counter() - t2}

    def compute(self, kernel: Kernel, tensors: list, params: dict, layouts: list) -> list:
        """Device results in the layouts the client asked for. Inputs are cast to the compute dtype
        (or each to its ``idtypes`` entry); results to ``rdtypes`` where NumPy returns another type."""
        cdtype = DTYPES[np.dtype(params["cdtype"])]
        idtypes = params.get("idtypes") or [None] * len(tensors)  # per operand, where they differ (issue 4)
        rdtypes = params.get("rdtypes")
        if len(idtypes) != len(tensors):
            raise ValueError(f"{len(idtypes)} idtypes for {len(tensors)} operands")
        results = kernel([t.to(cdtype if d is None else _dt(d)) for t, d in zip(tensors, idtypes)], params)
        if len(results) != len(layouts) or (rdtypes is not None and len(rdtypes) != len(results)):
            raise ValueError(f"kernel made {len(results)} results, the call asked for {len(layouts)} layouts")
        if rdtypes is not None:  # NumPy's result types (single precision from a double computation)
            results = [r.to(_dt(d)) for r, d in zip(results, rdtypes)]
        return [_with_layout(r.resolve_conj().resolve_neg(), lay) for r, lay in zip(results, layouts)]

    def to_host(self, results: list, dests: list | None = None) -> list[np.ndarray]:
        """Results as host arrays. ``dests[i]``, where given, is a client's shared-memory slot of the
        result's byte size (issue 9): the result is written straight into it (from a GPU, one
        device-to-host copy; on the CPU, one memcpy) and the returned array is a view on it."""
        out = []
        for r, dest in zip(results, dests or [None] * len(results)):
            if (dest is None or r.dtype not in NUMPY_OF or r.numel() * r.element_size() != dest.nbytes
                    or not (r.is_contiguous() or _f_contiguous(r))):
                out.append(r.cpu().numpy())
                continue
            dt = NUMPY_OF[r.dtype]
            if r.is_contiguous():
                typed = dest.view(dt).reshape(tuple(r.shape))
            else:  # F-ordered (see _with_layout): the reversed shape in C order, transposed
                typed = dest.view(dt).reshape(tuple(r.shape)[::-1]).transpose()
            if r.device.type == "cpu":
                np.copyto(typed, r.resolve_conj().numpy())  # one memcpy (torch's copy_ splits it over threads: slower here)
            else:
                torch.from_numpy(typed).copy_(r)  # one device-to-host copy, straight into the slot
            out.append(typed)
        return out

    def warm(self, shared: bool = False) -> dict[str, Any]:
        """A first kernel per dtype, then the planner's probes timed on this device (issue 5): per
        family and dtype, (flops, seconds) at two or three sizes under ``points`` ("products/f8": [[flops,
        s], ...]), and, for older clients, one float64 rate in GFLOP/s per family. The probe ops match
        the client's calibration (fusion_shim.plan.calibrate): matmul, solve, fft (rfft for real).
        ``shared``: the worker shares its CPUs with the program that started it (embedded)."""
        dev = self.device
        for dt in (torch.float32, torch.float64, torch.complex64, torch.complex128):
            m = torch.ones(8, 8, dtype=dt, device=dev)
            torch.matmul(m, m)
            torch.fft.fft(m)
            # each decomposition once: a library's first call pays its own set-up (a solver handle
            # on a GPU; on this CPU the first eigh of a run took 28 ms against 4 ms after), which an
            # explored call would otherwise be charged and the model would learn as its rate
            spd = m + 8 * torch.eye(8, dtype=dt, device=dev)
            for fn in (torch.linalg.eigh, torch.linalg.svd, torch.linalg.qr, torch.linalg.cholesky,
                       torch.linalg.inv, torch.linalg.eigvals, torch.linalg.slogdet,
                       lambda a: torch.linalg.solve(a, a), lambda a: torch.linalg.lstsq(a, a)):
                try:
                    fn(spd)
                except RuntimeError:  # not on this device or dtype: its calls fail and say so themselves
                    pass
        # a GPU reaches its rate only on larger problems; an embedded CPU worker shares its CPUs with
        # the program (a cold start warms while the program runs): two small sizes, about 50 ms in
        # all; another CPU worker has its CPUs to itself: three sizes, about 1 s. Rates read beyond
        # the sizes measured carry more uncertainty (plan.model); measured calls correct them
        big = dev.type == "cuda"
        sizes = ({"products": (128, 512, 4096), "linalg": (128, 384, 2048), "fft": (1 << 12, 1 << 16, 1 << 22)} if big
                 else {"products": (128, 384), "linalg": (96, 256), "fft": (1 << 12, 1 << 15)} if shared
                 else {"products": (128, 512, 1024), "linalg": (128, 384, 768), "fft": (1 << 12, 1 << 16, 1 << 20)})
        # and each decomposition at one size (about 0.2 s shared, 0.5 s on another CPU worker)
        n = 1024 if big else 192 if shared else 384

        def measure() -> tuple[dict, dict, dict]:
            points = self._bench_points(sizes, big)
            return (points, *self._bench_ops(n, repeat=1 if shared else 3))

        # a CPU worker of its own host checks that nothing else ran on its CPUs meanwhile (an embedded
        # one shares them with the program by design: the planner widens its margin instead)
        points, ops, failed, busy = bench_until_clean(measure, cpu_sample if dev.type == "cpu" and not shared
                                                      else lambda: None)
        rates = {family: max(f / s for f, s in points[f"{family}/f8"]) / 1e9 for family in sizes}
        return {**rates, "points": points, "ops": ops, **({"ops_failed": failed} if failed else {}), **busy}

    def _bench_points(self, sizes: dict[str, tuple], big: bool) -> dict[str, list]:
        """Per family and dtype, [[flops, best seconds], ...] of its representative op at ``sizes``."""
        dev = self.device
        points: dict[str, list] = {}
        gen = torch.Generator(device="cpu").manual_seed(0)
        for name, dt in (("f8", torch.float64), ("f4", torch.float32), ("c16", torch.complex128),
                         ("c8", torch.complex64)):
            cf = 4 if dt.is_complex else 1
            for family, ns in sizes.items():
                pts = []
                for n in (ns[:-1] if cf == 4 and family != "fft" and not big else ns):
                    if family == "fft":
                        x = torch.randn(n, generator=gen, dtype=dt).to(dev)
                        fn = (lambda x=x: torch.fft.fft(x)) if dt.is_complex else (lambda x=x: torch.fft.rfft(x))
                        flops = 5.0 * n * math.log2(n) / (1 if dt.is_complex else 2)
                    elif family == "products":
                        a = torch.randn(n, n, generator=gen, dtype=dt).to(dev)
                        fn, flops = (lambda a=a: torch.matmul(a, a)), 2.0 * n**3 * cf
                    else:
                        a = (torch.randn(n, n, generator=gen, dtype=dt) + n * torch.eye(n, dtype=dt)).to(dev)
                        fn, flops = (lambda a=a: torch.linalg.solve(a, a)), (2 / 3 * n**3 + 2.0 * n**3) * cf
                    pts.append([flops, self._best(fn)])
                points[f"{family}/{name}"] = pts
        return points

    def _bench_ops(self, n: int, repeat: int) -> tuple[dict[str, list], dict[str, str]]:
        """Each decomposition's own kernel timed once at one size, through the catalog's rule and the
        kernel a real call runs (float64, n x n, symmetric positive definite): "numpy.linalg.svd/f8":
        [[flops, seconds], ...]. The family's curve is measured with ``solve``; read off it, the rate of
        an svd or a qr was out by 2-4x on this CPU, and a GPU's solvers differ from its solve far more.
        Second: the ops whose kernel failed here, with why (the client reports them; their calls are
        priced off the family's curve, and a real call that fails falls back and says so itself)."""
        from ..catalog import BY_NAME, prepare
        from ..catalog.base import original

        # made with torch: a worker in a thread of a program the shim is installed in (tests) must not
        # send its own NumPy calls through the shim
        g = torch.randn(n, n, generator=torch.Generator(device="cpu").manual_seed(0), dtype=torch.float64)
        spd = (g @ g.T / n + torch.eye(n, dtype=torch.float64)).numpy()
        out: dict[str, list] = {}
        failed: dict[str, str] = {}
        for op, kwargs in OPS_BENCH:
            spec = BY_NAME.get(op)
            kernel = KERNELS.get(spec.kernel_id) if spec is not None else None
            if kernel is None:
                continue
            try:
                prep = prepare(spec, inspect.signature(original(spec)), (spd,), kwargs)
                tensors = [self.to_device(x) for x in prep.arrays]
                seconds = self._best(lambda: self.compute(kernel, tensors, prep.params, prep.layouts), repeat)
            except Exception as exc:  # not on this device: nothing is claimed for it, and the client says so
                failed[op] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            out.setdefault(f"{op}/f8", []).append([prep.flops, seconds])
        return out, failed

    def _best(self, fn: Callable[[], Any], repeat: int = 3) -> float:
        fn()
        self.sync()
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
        return best


def _f_contiguous(t: torch.Tensor) -> bool:
    return t.ndim > 1 and t.permute(*range(t.ndim - 1, -1, -1)).is_contiguous()


def _aligned(a: np.ndarray) -> np.ndarray:
    """A received array is a view on its ZeroMQ frame, whose buffer need not be aligned to the element
    size; torch's CPU kernels assume it is (a complex128 matrix-vector product on an 8-byte-aligned
    buffer segfaults the worker): copy those, the only ones, before wrapping them."""
    return a if a.ctypes.data % a.dtype.itemsize == 0 else a.copy()


def _with_layout(t: torch.Tensor, layout: Any) -> torch.Tensor:
    """The result in the layout the client asked for. C and F travel as such; the wire knows no other
    order, so a result asked for in an axis order travels transposed to that order, C-contiguous,
    and the client transposes it back (a view: no copy on either side)."""
    if t.ndim < 2 or layout == "C":
        return t.contiguous()
    perm = list(range(t.ndim))[::-1] if layout == "F" else [int(i) for i in layout]
    if sorted(perm) != list(range(t.ndim)):
        raise ValueError(f"layout {layout!r} is not a permutation of {t.ndim} axes")
    if layout != "F":
        return t.permute(perm).contiguous()
    inverse = [perm.index(i) for i in range(t.ndim)]
    return t.permute(perm).contiguous().permute(inverse)

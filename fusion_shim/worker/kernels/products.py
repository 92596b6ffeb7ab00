"""Products: matmul, dot, vdot, tensordot, einsum, outer, kron, the vector functions, cross,
trace and multi_dot, each with NumPy's semantics."""
from __future__ import annotations

import torch

from .common import Kernel, _dt

def _matmul(t: list, p: dict) -> list:
    return [torch.matmul(t[0], t[1])]


def _dot(t: list, p: dict) -> list:
    a, b = t
    if a.ndim >= 1 and 1 <= b.ndim <= 2 and a.dtype != torch.bool:
        return [torch.matmul(a, b)]  # D72: the same sums as tensordot's, without its Python wrapper
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
}

"""How many elements a kernel's results will have at least, from its inputs' shapes and its
params as sent, before anything is computed (D61): the worker refuses a call that would make more
than it declared. Each function is exact or a lower bound that keeps the term that can grow (never
more than the kernel makes: it may only refuse a call whose kernel would break its declaration).

A row names its function in ``result_size`` (``"sizes.matmul"``), loaded on first use as its rule
is. Only the kernels whose results can outgrow their inputs have one (products, the full factors of
``svd`` and ``qr``, ``lstsq``); every other kernel's results are bounded by its inputs' size (FFT
lengths are checked against the declared results through ``size_params``, D325). A function returns
None where NumPy would raise on the shapes: the kernel then raises too, before it allocates anything large.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Shape = tuple[int, ...]


def _broadcast(*shapes: Sequence[int]) -> Shape | None:
    if not any(len(s) for s in shapes):  # no batch axes: the common case, spared NumPy's call
        return ()
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        return None


def _prod(shape: Sequence[int] | None) -> int | None:
    return None if shape is None else math.prod(shape)


def matmul(s: list[Shape], p: dict) -> int | None:
    a, b = s
    if not a or not b:
        return None
    a2, b2 = ((1,) + a if len(a) == 1 else a), (b + (1,) if len(b) == 1 else b)
    batch = _broadcast(a2[:-2], b2[:-2])
    return None if batch is None else math.prod(batch) * a2[-2] * b2[-1]


def dot(s: list[Shape], p: dict) -> int | None:
    a, b = s
    if not a or not b:
        return max(math.prod(a), math.prod(b))
    return math.prod(a[:-1]) * (math.prod(b[:-2]) * b[-1] if len(b) > 1 else 1)


def tensordot(s: list[Shape], p: dict) -> int | None:
    a, b = s
    xa, xb = p["axes"]
    drop_a = {x % len(a) for x in xa} if a else set()
    drop_b = {x % len(b) for x in xb} if b else set()
    return math.prod(d for i, d in enumerate(a) if i not in drop_a) * math.prod(
        d for i, d in enumerate(b) if i not in drop_b)


def einsum(s: list[Shape], p: dict) -> int | None:
    subscripts = p["subscripts"]
    if not isinstance(subscripts, str):
        return None
    spec = subscripts.replace(" ", "")
    ins, _, out = spec.partition("->")
    terms = ins.split(",")
    if len(terms) != len(s):
        return None
    sizes: dict[str, int] = {}
    ellipses = []
    for term, shape in zip(terms, s):
        letters = term.replace("...", "")
        n_ell = len(shape) - len(letters)
        if n_ell < 0 or (n_ell and "..." not in term):
            return None
        head = term.split("...")[0] if "..." in term else term
        ellipses.append(shape[len(head):len(head) + n_ell])
        dims = shape[:len(head)] + shape[len(head) + n_ell:]
        for letter, d in zip(letters, dims):
            sizes[letter] = max(sizes.get(letter, 1), d)
    if not spec.count("->"):
        counts = {c: ins.count(c) for c in sizes}
        out = ("..." if "..." in ins else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    ell = _broadcast(*ellipses) if "..." in out else ()
    if ell is None or any(c not in sizes for c in out.replace("...", "")):
        return None
    return math.prod(sizes[c] for c in out.replace("...", "")) * math.prod(ell)


def outer(s: list[Shape], p: dict) -> int:
    return math.prod(s[0]) * math.prod(s[1])


def vecfunc(s: list[Shape], p: dict) -> int | None:
    a, b = s
    if not a or not b:
        return None
    kind = p["kind"]
    if kind == "matvec":  # (..., n, k) @ (..., k) -> (..., n)
        batch, last = (_broadcast(a[:-2], b[:-1]), a[-2]) if len(a) > 1 else (None, 0)
    elif kind == "vecmat":  # (..., k) @ (..., k, m) -> (..., m)
        batch, last = (_broadcast(a[:-1], b[:-2]), b[-1]) if len(b) > 1 else (None, 0)
    else:  # vecdot: the two shapes without their summed axis, broadcast
        xa, xb = p["axes"][0] % len(a), p["axes"][1] % len(b)
        batch, last = _broadcast(a[:xa] + a[xa + 1:], b[:xb] + b[xb + 1:]), 1
    return None if batch is None else math.prod(batch) * last


def cross(s: list[Shape], p: dict) -> int | None:
    a, b = s
    if not a or not b:
        return None
    xa, xb = p["axes"][0] % len(a), p["axes"][1] % len(b)
    return _prod(_broadcast(a[:xa] + a[xa + 1:], b[:xb] + b[xb + 1:]))  # times 3, or 1 for 2-vectors


def multi_dot(s: list[Shape], p: dict) -> int | None:
    first, last = s[0], s[-1]
    return (first[0] if len(first) == 2 else 1) * (last[-1] if len(last) == 2 else 1)


def _factors(s: list[Shape]) -> tuple[int, int, int] | None:
    """A decomposition's input: its batch size and its matrices' rows and columns."""
    a = s[0]
    return None if len(a) < 2 else (math.prod(a[:-2]), a[-2], a[-1])


def qr(s: list[Shape], p: dict) -> int | None:
    if (f := _factors(s)) is None:
        return None
    batch, m, n = f
    k = min(m, n)
    mode = p.get("mode")
    if mode in ("complete", "full"):
        return batch * (m * m + m * n)
    if mode == "raw":
        return batch * (m * n + k)
    if mode == "r":  # NumPy's r is (k, n), SciPy's (m, n): the smaller
        return batch * k * n
    return batch * (m * k + k * n)


def s_qr(s: list[Shape], p: dict) -> int | None:
    """scipy.linalg.qr as the client sends it: torch's mode ("complete" or "reduced"), ``r_only``."""
    if (f := _factors(s)) is None:
        return None
    batch, m, n = f
    rows = m if p.get("mode") == "complete" else min(m, n)
    return batch * ((0 if p.get("r_only") else m * rows) + rows * n)


def svd(s: list[Shape], p: dict) -> int | None:
    if (f := _factors(s)) is None:
        return None
    batch, m, n = f
    k = min(m, n)
    if not p.get("compute_uv", True):
        return batch * k
    if p.get("hermitian"):
        return batch * (k + 2 * m * m)
    if p.get("full_matrices"):
        return batch * (m * m + k + n * n)
    return batch * (m * k + k + k * n)


def lstsq(s: list[Shape], p: dict) -> int | None:
    a, b = s
    if len(a) != 2 or not b:
        return None
    k = b[1] if len(b) == 2 else 1
    return a[1] * k  # x alone (residuals may be empty)

"""Rules for numpy.linalg's decompositions, solvers, norms and friends.

NumPy's rule for dtypes (``_commonType``): LAPACK runs in double (complex double when any input
is complex) and the result is cast to single precision only when every input was single. The
rows follow it: ``cdtype`` (what the worker computes in) is float64/complex128, ``rdtypes`` (what
it returns) NumPy's result types. So the worker never returns less precision than NumPy would.

Where NumPy's answer hinges on a decision a second LAPACK could take the other way (a pivot that
is exactly zero or not, a singular value on either side of a cut-off, an eigenvalue's imaginary
part exactly zero or not) the worker refuses the call when the decision is not clear-cut, and
NumPy computes it here (``NotReproducible`` in :mod:`fusion_shim.worker.kernels`; the ledger
records the fallback and its reason).
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from .base import (
    C16, F8, OpSpec, Prepared, Unsupported, arg, batch_of, bool_param, cfactor, float_param, gufunc_layout,
    int_param, linalg_types, native, ndarray, norm_axis, probe, product_dtype, real_of, scalar_or_array, square,
    tiny,
)

INF = float("inf")


def _params(t: np.dtype, *rdtypes: np.dtype, **extra: Any) -> dict:
    return {"cdtype": t.str, "rdtypes": [d.str for d in rdtypes], **extra}


def _results_type(name: str) -> type:
    from numpy.linalg import _linalg  # numpy.linalg's named tuples

    return getattr(_linalg, name)


def _one(spec: OpSpec, ba: inspect.BoundArguments) -> tuple[ndarray, np.dtype, np.dtype, int]:
    a = arg(spec, ba, 0)
    n = square(a)
    t, rt = linalg_types(a)
    return a, t, rt, n


def _uplo(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in ("L", "U"):
        raise Unsupported(f"UPLO={value!r} is neither 'L' nor 'U'")
    return value.upper()


# --- solvers and inverses --------------------------------------------------------------------------

def rule_solve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    n = square(a)
    t, rt = linalg_types(a, b)
    if b.ndim == 1:
        if b.shape[0] != n:
            raise Unsupported("b does not match a")
        shape, k = a.shape[:-1], 1
    else:
        if b.shape[-2] != n:
            raise Unsupported("b does not match a")
        shape, k = batch_of(a.shape[:-2], b.shape[:-2]) + b.shape[-2:], b.shape[-1]
    flops = (2 / 3 * n**3 + 2 * n * n * k) * math.prod(shape[:-2] if b.ndim > 1 else a.shape[:-2]) * cfactor(t)
    core = 1 if b.ndim == 1 else 2
    layout = gufunc_layout([(a, 2), (b, core)], shape[:-core], core)
    return Prepared(spec, [a, b], _params(t, rt), [(rt, shape)], [layout], flops)


def rule_inv(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, t, rt, n = _one(spec, ba)
    flops = 2.0 * n**3 * math.prod(a.shape[:-2]) * cfactor(t)
    layout = gufunc_layout([(a, 2)], a.shape[:-2], 2)
    return Prepared(spec, [a], _params(t, rt), [(rt, a.shape)], [layout], flops)


def rule_cholesky(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, t, rt, n = _one(spec, ba)
    upper = bool_param(ba.arguments.get("upper", False), "upper")
    flops = n**3 / 3 * math.prod(a.shape[:-2]) * cfactor(t)
    layout = gufunc_layout([(a, 2)], a.shape[:-2], 2)
    return Prepared(spec, [a], _params(t, rt, upper=upper), [(rt, a.shape)], [layout], flops)


def rule_tensorsolve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """``a`` (axes moved to the end) reshaped to a (prod, prod) matrix, ``b`` flattened, one solve."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    t, rt = linalg_types(a, b)
    an = a.ndim
    perm = list(range(an))
    axes = ba.arguments.get("axes")
    if axes is not None:
        try:
            for k in axes:
                perm.remove(k)  # NumPy's own loop: a negative or repeated axis raises there
                perm.insert(an, k)
        except (TypeError, ValueError):
            raise Unsupported(f"axes={axes!r} is computed locally (NumPy raises)") from None
    shape_t = tuple(a.shape[i] for i in perm)
    if an <= b.ndim:
        raise Unsupported("tensorsolve: a has no dimensions left for x")
    oldshape = shape_t[-(an - b.ndim):]
    prod = math.prod(oldshape)
    if a.size != prod**2 or b.size != prod:
        raise Unsupported("tensorsolve: shapes do not make a square system (NumPy raises)")
    flops = (2 / 3 * prod**3 + 2 * prod**2) * cfactor(t)
    return Prepared(spec, [a, b], _params(t, rt, perm=perm, n=prod, shape=list(oldshape)), [(rt, oldshape)],
                    ["C"], flops)


def rule_tensorinv(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    ind = int_param(ba.arguments.get("ind", 2), "ind")
    if ind <= 0:
        raise Unsupported("ind must be positive (NumPy raises)")
    t, rt = linalg_types(a)
    prod = math.prod(a.shape[ind:])
    if prod * prod != a.size:
        raise Unsupported("tensorinv: shapes do not make a square matrix (NumPy raises)")
    invshape = a.shape[ind:] + a.shape[:ind]
    return Prepared(spec, [a], _params(t, rt, n=prod, shape=list(invshape)), [(rt, invshape)], ["C"],
                    2.0 * prod**3 * cfactor(t))


def rule_pinv(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    if a.ndim < 2:
        raise Unsupported("pinv needs at least 2 dimensions (NumPy raises)")
    t, rt = linalg_types(a)
    rcond, given = ba.arguments.get("rcond"), "rtol" in ba.arguments
    if rcond is None:
        rtol = ba.arguments.get("rtol")
        if not given:
            rcond = 1e-15
        elif rtol is None:
            if a.dtype.kind not in "fc":
                raise Unsupported("rtol=None with an integer array (NumPy raises)")
            rcond = max(a.shape[-2:]) * float(np.finfo(a.dtype).eps)
        else:
            rcond = float_param(rtol, "rtol")
    elif given:
        raise Unsupported("rtol and rcond both set (NumPy raises)")
    else:
        rcond = float_param(rcond, "rcond")
    herm = bool_param(ba.arguments.get("hermitian", False), "hermitian")
    if herm:
        square(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    flops = (4.0 * m * n * k + 22.0 * k**3 + 2.0 * m * n * k) * math.prod(a.shape[:-2]) * cfactor(t)
    layout = probe(spec, [tiny(a, a.shape[-2:] if herm else (min(m, 3), min(n, 2)), fill="eye")],
                   {"hermitian": herm})[0]
    shape = a.shape[:-2] + (n, m)
    return Prepared(spec, [a], _params(t, rt, rcond=rcond, hermitian=herm), [(rt, shape)], [layout], flops)


def rule_lstsq(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """2-d ``a``, 1-d or 2-d ``b``: (x, residuals, rank, s) as numpy.linalg.lstsq returns them, the
    rank a NumPy int32, the residuals empty unless the rank is full and M > N."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if a.ndim != 2 or b.ndim not in (1, 2):
        raise Unsupported("lstsq takes a 2-d a and a 1-d or 2-d b (NumPy raises)")
    m, n = a.shape
    if b.shape[0] != m:
        raise Unsupported("incompatible dimensions (NumPy raises)")
    t, rt = linalg_types(a, b)
    rreal = real_of(rt)
    rcond = ba.arguments.get("rcond")
    rcond = float(np.finfo(t).eps) * max(m, n) if rcond is None else float_param(rcond, "rcond")
    k = 1 if b.ndim == 1 else b.shape[1]
    x_shape = (n,) if b.ndim == 1 else (n, k)
    results = [(rt, x_shape), (rreal, (k,)), (np.dtype("i4"), ()), (rreal, (min(m, n),))]
    params = _params(t, rt, rreal, np.dtype("i4"), rreal, rcond=rcond)

    def finish(r: list) -> tuple:
        x, resids, rank, s = r
        rank = rank[()]
        if rank != n or m <= n:
            resids = np.array([], rreal)
        return x, resids, rank, s

    flops = (4.0 * m * n * min(m, n) + 22.0 * min(m, n) ** 3 + 4.0 * m * n * k) * cfactor(t)
    return Prepared(spec, [a, b], params, results, ["C"] * 4, flops, finish=finish)


# --- decompositions -------------------------------------------------------------------------------

def rule_eigh(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, t, rt, n = _one(spec, ba)
    uplo = _uplo(ba.arguments.get("UPLO", "L"))
    batch = a.shape[:-2]
    flops = 9.0 * n**3 * math.prod(batch) * cfactor(t)
    if spec.attr == "eigvalsh":
        layout = gufunc_layout([(a, 2)], batch, 1)
        return Prepared(spec, [a], _params(t, real_of(rt), UPLO=uplo, vectors=False),
                        [(real_of(rt), batch + (n,))], [layout], flops / 3)
    layouts = [gufunc_layout([(a, 2)], batch, core) for core in (1, 2)]
    return Prepared(spec, [a], _params(t, real_of(rt), rt, UPLO=uplo, vectors=True),
                    [(real_of(rt), batch + (n,)), (rt, a.shape)], layouts, flops, returns="EighResult")


def rule_eig(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """eig and eigvals. For real input NumPy returns real arrays when every eigenvalue of the whole
    stack has an imaginary part of exactly 0 (``all(w.imag == 0)``), else complex ones: the worker
    returns complex128 and ``finish`` applies NumPy's own rule to it, views included (``w.real``)."""
    a, t, rt, n = _one(spec, ba)
    vectors = spec.attr == "eig"
    batch = a.shape[:-2]
    flops = (25.0 if vectors else 10.0) * n**3 * math.prod(batch) * cfactor(C16)
    shapes = [batch + (n,), a.shape][:1 + vectors]
    layouts = [gufunc_layout([(a, 2)], batch, core) for core in (1, 2)][:1 + vectors]
    real_in = t.kind == "f"
    if not real_in:
        return Prepared(spec, [a], _params(t, *[rt] * len(shapes), vectors=vectors), [(rt, s) for s in shapes],
                        layouts, flops, returns="EigResult" if vectors else "array")
    real_t, cplx_t = rt, np.dtype("c8" if rt == np.dtype("f4") else "c16")

    def finish(r: list) -> Any:
        w = r[0]
        v = r[1] if vectors else None
        if np.all(w.imag == 0.0):  # numpy.linalg.eig's rule, on the worker's eigenvalues
            w, res_t = w.real, real_t
            v = v.real if vectors else None
        else:
            res_t = cplx_t
        w = w.astype(res_t, copy=False)
        if not vectors:
            return w
        return _results_type("EigResult")(w, v.astype(res_t, copy=False))

    return Prepared(spec, [a], _params(t, *[C16] * len(shapes), vectors=vectors, real_input=True),
                    [(C16, s) for s in shapes], layouts, flops, finish=finish)


def rule_svd(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """svd (full_matrices, compute_uv, hermitian) and svdvals. ``hermitian=True`` is NumPy's own
    recipe: eigh, singular values |w| sorted descending, the signs moved into V^H."""
    a = arg(spec, ba, 0)
    if a.ndim < 2:
        raise Unsupported("svd needs at least 2 dimensions (NumPy raises)")
    t, rt = linalg_types(a)
    rs = real_of(rt)
    if spec.attr == "svdvals":
        full, uv, herm = True, False, False
    else:
        full = bool(ba.arguments.get("full_matrices", True))
        uv = bool(ba.arguments.get("compute_uv", True))
        herm = bool_param(ba.arguments.get("hermitian", False), "hermitian")
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    # D110: singular values alone count 4mnk + 6k^3 (the full svd 22k^3): the two variants share one rate
    flops = (4.0 * m * n * k + (22.0 if uv else 6.0) * k**3) * math.prod(batch) * cfactor(t)
    if herm:
        square(a)
        if not uv:  # abs(eigvalsh(a)) from the worker, then NumPy's sort(s)[..., ::-1] here: a view
            return Prepared(spec, [a], _params(t, rs, hermitian=True, compute_uv=False),
                            [(rs, batch + (n,))], [gufunc_layout([(a, 2)], batch, 1)], flops,
                            finish=lambda r: np.sort(r[0])[..., ::-1])
        layouts = probe(spec, [tiny(a, (min(n, 3),) * 2, fill="eye")], {"hermitian": True}, count=3)
        return Prepared(spec, [a], _params(t, rt, rs, rt, hermitian=True, compute_uv=True),
                        [(rt, a.shape), (rs, batch + (n,)), (rt, a.shape)], layouts, flops, returns="SVDResult")
    params = _params(t, *((rt, rs, rt) if uv else (rs,)), full_matrices=full, compute_uv=uv, hermitian=False)
    lay1, lay2 = (gufunc_layout([(a, 2)], batch, core) for core in (1, 2))
    s = (rs, batch + (k,))
    if not uv:
        return Prepared(spec, [a], params, [s], [lay1], flops)
    u = (rt, batch + (m, m if full else k))
    vh = (rt, batch + (n if full else k, n))
    return Prepared(spec, [a], params, [u, s, vh], [lay2, lay1, lay2], flops, returns="SVDResult")


def rule_qr(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    if a.ndim < 2:
        raise Unsupported("qr needs at least 2 dimensions (NumPy raises)")
    mode = ba.arguments.get("mode", "reduced")
    if mode not in ("reduced", "complete", "r", "raw"):
        raise Unsupported(f"mode={mode!r} is left to NumPy (deprecated or invalid)")
    t, rt = linalg_types(a)
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    flops = (4.0 * m * n * k - 4 / 3 * k**3) * math.prod(batch) * cfactor(t)
    layouts = qr_layouts(spec, a, mode)
    if mode == "r":
        return Prepared(spec, [a], _params(t, rt, mode=mode), [(rt, batch + (k, n))], layouts, flops)
    if mode == "raw":  # LAPACK's geqrf output, transposed, and its tau: (h, tau), a plain tuple
        return Prepared(spec, [a], _params(t, rt, rt, mode=mode), [(rt, batch + (n, m)), (rt, batch + (k,))],
                        layouts, flops, finish=tuple)
    mq = m if mode == "complete" else k
    return Prepared(spec, [a], _params(t, rt, rt, mode=mode), [(rt, batch + (m, mq)), (rt, batch + (mq, n))],
                    layouts, flops, returns="QRResult")


def qr_layouts(spec: OpSpec, a: ndarray, mode: str) -> list:
    """numpy.linalg.qr's R is ``triu`` of a copy of ``a`` kept in a's memory order (order 'K'), Q a
    gufunc's result, raw mode's h a transposed view of that copy: NumPy's own qr on a stand-in of
    at most 3 elements per axis, with a's stride order and its rows-to-columns relation, says what
    they are (tens of microseconds)."""
    count = 1 if mode == "r" else 2
    if mode != "raw" and (a.ndim == 2 or a.flags.c_contiguous):
        return ["C"] * count
    m, n = a.shape[-2:]
    core = (min(m, 3 if m > n else 2), min(n, 3 if n > m else 2))
    return probe(spec, [tiny(a, core, fill="eye")], {"mode": mode}, count=count)


# --- determinants ----------------------------------------------------------------------------------

def rule_det(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, t, rt, n = _one(spec, ba)
    batch = a.shape[:-2]
    layout = gufunc_layout([(a, 2)], batch, 0)
    flops = 2 / 3 * n**3 * math.prod(batch) * cfactor(t)
    if spec.attr == "det":
        return Prepared(spec, [a], _params(t, rt, log=False), [(rt, batch)], [layout], flops, scalar_0d=True)
    slog = _results_type("SlogdetResult")
    return Prepared(spec, [a], _params(t, rt, real_of(rt), log=True), [(rt, batch), (real_of(rt), batch)],
                    [layout, layout], flops, finish=lambda r: slog(*(scalar_or_array(x) for x in r)))


# --- norms, condition numbers, ranks ---------------------------------------------------------------

def _norm_dtype(x: ndarray) -> np.dtype:
    """norm's working dtype: inexact inputs as they are (float16 and longdouble refused), the rest
    cast to float64 (``x.astype(float)``)."""
    dt = native(x.dtype)
    if dt.kind in "fc":
        if dt not in (np.dtype(t) for t in ("f4", "f8", "c8", "c16")):
            raise Unsupported(f"dtype {dt} is not offloaded for norms")
        return dt
    return F8


def _ord(value: Any, matrix: bool) -> Any:
    """``ord`` as the worker takes it: None, a float (inf included), or 'fro' / 'nuc'."""
    if value is None:
        return None
    if isinstance(value, str):
        if matrix and value in ("fro", "f", "nuc"):
            return "fro" if value == "f" else value
        raise Unsupported(f"ord={value!r} is invalid here (NumPy raises)")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Unsupported(f"ord={value!r} is not a real number")
    value = float(value)
    if matrix and value not in (2.0, -2.0, 1.0, -1.0, INF, -INF):
        raise Unsupported(f"ord={value!r} is invalid for matrices (NumPy raises)")
    return value


def _norm_plan(x: ndarray, ord: Any, axis: Any, keepdims: bool) -> tuple[dict, tuple]:
    """numpy.linalg.norm's case analysis: the worker's plan and the result's shape."""
    nd = x.ndim
    if axis is None:
        if ord is None or (isinstance(ord, str) and ord in ("f", "fro") and nd == 2) or (
                not isinstance(ord, str) and ord == 2 and nd == 1):
            return {"mode": "flat"}, ((1,) * nd if keepdims else ())
        axis = tuple(range(nd))
    elif not isinstance(axis, tuple):
        axis = (int_param(axis, "axis"),)
    if len(axis) == 1:
        ax = norm_axis(axis[0], nd)
        shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape)) if keepdims else \
            x.shape[:ax] + x.shape[ax + 1:]
        return {"mode": "vec", "axis": ax, "ord": _ord(ord, False)}, shape
    if len(axis) == 2:
        row, col = norm_axis(axis[0], nd), norm_axis(axis[1], nd)
        if row == col:
            raise Unsupported("duplicate axes (NumPy raises)")
        shape = tuple(1 if i in (row, col) else d for i, d in enumerate(x.shape)) if keepdims else \
            tuple(d for i, d in enumerate(x.shape) if i not in (row, col))
        return {"mode": "mat", "axis": [row, col], "ord": _ord(ord, True)}, shape
    raise Unsupported("improper number of dimensions to norm (NumPy raises)")


def rule_norm(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """norm, matrix_norm and vector_norm: reductions in the input's dtype (integers in float64),
    the 2, -2 and nuclear matrix norms through singular values computed in double."""
    x = arg(spec, ba, 0)
    dt = _norm_dtype(x)
    keepdims = bool_param(ba.arguments.get("keepdims", False), "keepdims")
    kw = {"keepdims": keepdims}
    pre = None
    if spec.attr == "norm":
        ord, axis = ba.arguments.get("ord"), ba.arguments.get("axis")
        plan, shape = _norm_plan(x, ord, axis, keepdims)
        kw.update(ord=ord, axis=axis)
    elif spec.attr == "matrix_norm":
        if x.ndim < 2:
            raise Unsupported("matrix_norm needs at least 2 dimensions (NumPy raises)")
        ord = ba.arguments.get("ord", "fro")
        plan, shape = _norm_plan(x, ord, (-2, -1), keepdims)
        kw.update(ord=ord)
    else:  # vector_norm: flatten the axes, then one vector norm over axis 0 (NumPy's recipe)
        ord, axis = ba.arguments.get("ord", 2), ba.arguments.get("axis")
        kw.update(ord=ord, axis=axis)
        if axis is None:
            pre, shape = {"perm": list(range(x.ndim)), "shape": [x.size]}, (1,) * x.ndim if keepdims else ()
        else:
            axes = (axis,) if not isinstance(axis, tuple) else axis
            norm_ax = [norm_axis(ax, x.ndim) for ax in axes]
            if len(set(norm_ax)) != len(norm_ax):
                raise Unsupported("repeated axes (NumPy raises)")
            rest = [i for i in range(x.ndim) if i not in norm_ax]
            pre = {"perm": norm_ax + rest, "shape": [math.prod(x.shape[i] for i in norm_ax)] +
                   [x.shape[i] for i in rest]}
            shape = tuple(1 if i in norm_ax else d for i, d in enumerate(x.shape)) if keepdims else \
                tuple(x.shape[i] for i in rest)
        plan = {"mode": "vec", "axis": 0, "ord": _ord(ord, False)}
    plan["pre"], plan["shape"] = pre, list(shape)
    rdt = real_of(dt) if dt.kind in "fc" else F8
    layout = _norm_layout(spec, x, kw, pre, len(shape))
    svd = plan["mode"] == "mat" and plan["ord"] in (2.0, -2.0, "nuc")
    flops = float(x.size) * (4.0 * min(x.shape[-2:]) if svd else 2.0) * cfactor(dt)
    return Prepared(spec, [x], {"cdtype": dt.str, "rdtypes": [rdt.str], **plan}, [(rdt, shape)], [layout], flops,
                    scalar_0d=True)


def _norm_layout(spec: OpSpec, x: ndarray, kw: dict, pre: dict | None, ndim: int) -> Any:
    if ndim < 2:
        return "C"
    if pre is not None and len(pre["shape"]) > 1:
        # vector_norm reshapes a transposed x: a copy (C-ordered, and so is its reduction) unless
        # NumPy can do it as a view; asked of a stand-in with x's real shape and strides, no data
        fake = np.lib.stride_tricks.as_strided(np.zeros(1, native(x.dtype)), x.shape, x.strides)
        try:
            fake.transpose(pre["perm"]).reshape(pre["shape"], copy=False)
        except ValueError:
            return "C"
    return probe(spec, [tiny(x)], kw)[0]


def rule_cond(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    x = arg(spec, ba, 0)
    if x.ndim < 2:
        raise Unsupported("cond needs at least 2 dimensions (NumPy raises)")
    t, rt = linalg_types(x)
    p = ba.arguments.get("p")
    p = None if p is None else _ord(p, True)
    m, n = x.shape[-2:]
    batch = x.shape[:-2]
    if p not in (None, 2.0, -2.0):
        square(x)
    rdt = real_of(rt)
    layout = probe(spec, [tiny(x, (min(m, 2), min(n, 2)), fill="eye")], {"p": ba.arguments.get("p")})[0] \
        if len(batch) >= 2 else "C"
    k = min(m, n)
    flops = (4.0 * m * n * k if p in (None, 2.0, -2.0) else 2.0 * n**3) * math.prod(batch) * cfactor(t)
    xdt = _norm_dtype(x)  # norm(x, p) runs in x's own dtype; the inverse in double
    return Prepared(spec, [x], {"cdtype": xdt.str, "rdtypes": [rdt.str], "p": p, "tdtype": t.str},
                    [(rdt, batch)], [layout], flops, scalar_0d=True)


def rule_matrix_rank(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    if a.ndim < 2:
        raise Unsupported("the rank of a vector is a comparison: computed here")
    tol, rtol = ba.arguments.get("tol"), ba.arguments.get("rtol")
    if tol is not None and rtol is not None:
        raise Unsupported("tol and rtol both set (NumPy raises)")
    tol = None if tol is None else float_param(tol, "tol")
    rtol = None if rtol is None else float_param(rtol, "rtol")
    herm = bool_param(ba.arguments.get("hermitian", False), "hermitian")
    if herm:
        square(a)
    t, rt = linalg_types(a)
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    layout = probe(spec, [tiny(a, (min(m, 2), min(n, 2)), fill="eye")], {"hermitian": herm})[0] \
        if len(batch) >= 2 else "C"
    flops = 4.0 * m * n * min(m, n) * math.prod(batch) * cfactor(t)
    params = _params(t, np.dtype("i8"), sdtype=real_of(rt).str, tol=tol, rtol=rtol, hermitian=herm)
    return Prepared(spec, [a], params, [(np.dtype("i8"), batch)], [layout], flops, scalar_0d=True)


# --- powers --------------------------------------------------------------------------------------

POWER_MAX = 2**63 - 1  # D262: the exponent travels as a 64-bit integer and the kernel loops over its bits

def rule_matrix_power(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    n = square(a)
    p = int_param(ba.arguments["n"], "n")
    if not -POWER_MAX <= p <= POWER_MAX:
        raise Unsupported(f"n={p} is past the kernel's range (|n| <= 2**63 - 1): computed here")
    if p in (0, 1):
        raise Unsupported(f"n={p}: no products (NumPy returns an identity, or a itself)")
    if p < 0:
        t, dt = linalg_types(a)
    else:
        dt = product_dtype(a)
        t = dt
    steps = 2 * max(abs(p).bit_length(), 1)
    flops = 2.0 * n**3 * steps * math.prod(a.shape[:-2]) * cfactor(dt)
    layout = probe(spec, [tiny(a, (min(n, 2),) * 2, fill="eye")], {"n": p})[0] if a.ndim > 2 else "C"
    return Prepared(spec, [a], _params(t, dt, n=p), [(dt, a.shape)], [layout], flops)

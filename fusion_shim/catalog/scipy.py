"""Rules for SciPy's rows, patched when ``scipy.linalg`` / ``scipy.fft`` is imported (``OpSpec.trigger``).

scipy.linalg: solve (assume_a, lower, transposed), inv, svd, eigh, cholesky, lu_factor, lu_solve,
qr, expm. SciPy computes single precision in single (LAPACK's s/c routines) and integers in double;
so does the worker. Its results come in LAPACK's (Fortran) memory order, decided by its batching
decorator and f2py: every row asks SciPy's own function, on tiny stand-ins, for that layout.
``check_finite`` either way: the worker refuses non-finite input, so SciPy decides (it raises, or
computes what it computes). ``overwrite_*`` only permits SciPy to clobber inputs; the worker never does.

solve and inv warn (``LinAlgWarning``) for an ill-conditioned matrix, from LAPACK's estimate of
the reciprocal condition number: the worker refuses a matrix whose condition is within a margin
of that line (it estimates ||A^-1||_1 as LAPACK's gecon does, or computes it for inv), so every
call that would warn runs in SciPy.

scipy.fft: fft, ifft, rfft, irfft, fft2, fftn, and dct, idct, dst, idst (types 1-4, D264); ``workers=`` is ignored on the worker (valid values
only), ``overwrite_x`` is a permission, ``plan`` must be None (SciPy raises otherwise).
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from .base import (
    C8, C16, F4, F8, OpSpec, Prepared, Unsupported, arg, array_arg, batch_of, bool_param, cfactor, follow_layout,
    layout_of, native, ndarray, norm_axis, probe, probe_result, real_of, square, tiny,
)
from .fft import NORMS, _flops, _n, fft_types

STRUCTURES = {None: "gen", "general": "gen", "gen": "gen", "sym": "sym", "symmetric": "sym", "her": "her",
              "hermitian": "her", "pos": "pos", "positive definite": "pos", "diagonal": "diagonal",
              "upper triangular": "upper", "lower triangular": "lower"}


def lapack_type(*arrays: ndarray) -> np.dtype:
    """SciPy's LAPACK type (``_ensure_dtype_cdsz``, ``get_lapack_funcs``): the common type, integers
    and bools as float64, float32/complex64 kept; half and long double precisions are refused."""
    dt = native(np.result_type(*arrays))
    if dt.kind in "biu":
        return F8
    if dt not in (F4, F8, C8, C16):
        raise Unsupported(f"dtype {dt} is not offloaded for scipy.linalg")
    return dt


def _as_scipy_takes_it(a: ndarray, name: str, byteswapped: bool = True, unaligned: bool = True) -> None:
    """Input SciPy 1.17 mishandles is left to it, so the program sees what it would see without
    the shim: inv misreads a byte-swapped matrix (garbage, no error), expm raises for one, and
    solve and inv raise TypeError for an unaligned one."""
    if not byteswapped and not a.dtype.isnative:
        raise Unsupported(f"{name} is byte-swapped: left to SciPy, which mishandles it")
    if not unaligned and not a.flags.aligned:
        raise Unsupported(f"{name} is unaligned: left to SciPy, which raises")


def _flags(ba: inspect.BoundArguments, *names: str) -> None:
    for name in names:
        if name in ba.arguments:
            value = bool_param(ba.arguments[name], name)
            if value and name.startswith("overwrite_"):
                # SciPy may then build its result in the input's memory (scipy.fft returns a view of
                # x; lu_factor may return a itself): aliasing the worker cannot give
                raise Unsupported(f"{name}=True: SciPy may reuse the input's memory for the result")


def _structure(ba: inspect.BoundArguments, allowed: tuple) -> str:
    assume = ba.arguments.get("assume_a")
    structure = STRUCTURES.get(assume) if isinstance(assume, (str, type(None))) else None
    if structure is None or structure not in allowed:
        raise Unsupported(f"assume_a={assume!r} is computed locally")
    return structure


def _layouts(spec: OpSpec, stand_ins: list, kwargs: dict, count: int) -> list:
    return probe(spec, stand_ins, kwargs, count=count)


def _container(spec: OpSpec, stand_ins: list, kwargs: dict, count: int) -> tuple[list, type]:
    """Layouts and the container of a multi-output result: SciPy's batching decorator returns a
    list where the 2-d call returns a tuple."""
    res = probe_result(spec, stand_ins, kwargs)
    if isinstance(res, ndarray):  # batched qr(mode="r"): the bare array, where 2-d gives (R,)
        return [layout_of(res) if res.ndim >= 2 else "C"], None
    return [layout_of(p) if p.ndim >= 2 else "C" for p in res][:count], type(res)


# --- scipy.linalg ----------------------------------------------------------------------------------

def rule_solve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    _as_scipy_takes_it(a, "a", unaligned=False)
    _flags(ba, "lower", "overwrite_a", "overwrite_b", "check_finite", "transposed")
    structure = _structure(ba, ("gen", "sym", "her", "pos", "diagonal", "upper", "lower"))
    n = square(a)
    if n == 1:
        raise Unsupported("a 1x1 system is a division: computed here")
    dt = lapack_type(a, b)
    transposed = bool(ba.arguments.get("transposed", False))
    if transposed and dt.kind == "c":
        raise Unsupported("transposed=True with complex input (SciPy raises)")
    bt = b[:, None] if b.ndim == 1 else b
    if bt.shape[-2] != n:
        raise Unsupported("incompatible shapes (SciPy raises)")
    batch = batch_of(a.shape[:-2], bt.shape[:-2])
    k = bt.shape[-1]
    shape = batch + ((n,) if b.ndim == 1 else (n, k))
    core_b = (2,) if b.ndim == 1 else (2, min(k, 2))
    layouts = _layouts(spec, [tiny(a, (2, 2), fill="eye", dtype=a.dtype), tiny(b, core_b, dtype=b.dtype)],
                       {"assume_a": ba.arguments.get("assume_a"), "transposed": transposed}, 1)
    params = {"cdtype": dt.str, "structure": structure, "lower": bool(ba.arguments.get("lower", False)),
              "transposed": transposed, "vector_b": b.ndim == 1}
    flops = (2 / 3 * n**3 + 2 * n * n * k + 20 * n * n) * math.prod(batch) * cfactor(dt)
    return Prepared(spec, [a, b], params, [(dt, shape)], layouts, flops)


def rule_inv(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _as_scipy_takes_it(a, "a", byteswapped=False, unaligned=False)
    _flags(ba, "overwrite_a", "check_finite", "lower")
    # assume_a="diagonal": SciPy inverts the diagonal and keeps the off-diagonal entries as they are;
    # no work worth moving, so it stays with SciPy
    structure = _structure(ba, ("gen", "sym", "her", "pos", "upper", "lower"))
    n = square(a)
    if n == 1:
        raise Unsupported("the inverse of a 1x1 matrix is a division: computed here")
    dt = lapack_type(a)
    layouts = _layouts(spec, [tiny(a, (2, 2), fill="eye", dtype=a.dtype)], {"assume_a": ba.arguments.get("assume_a")}, 1)
    params = {"cdtype": dt.str, "structure": structure, "lower": bool(ba.arguments.get("lower", False))}
    return Prepared(spec, [a], params, [(dt, a.shape)], layouts, 2.0 * n**3 * math.prod(a.shape[:-2]) * cfactor(dt))


def rule_svd(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _flags(ba, "full_matrices", "compute_uv", "overwrite_a", "check_finite")
    if ba.arguments.get("lapack_driver", "gesdd") not in ("gesdd", "gesvd"):
        raise Unsupported("lapack_driver is neither 'gesdd' nor 'gesvd' (SciPy raises)")
    if a.ndim < 2:
        raise Unsupported("svd needs a matrix (SciPy raises)")
    dt = lapack_type(a)
    full = bool(ba.arguments.get("full_matrices", True))
    uv = bool(ba.arguments.get("compute_uv", True))
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    rs = real_of(dt)
    core = (min(m, 3 if m > n else 2), min(n, 3 if n > m else 2))
    stand_in, kw = [tiny(a, core, fill="eye", dtype=a.dtype)], {"full_matrices": full, "compute_uv": uv}
    layouts, container = _container(spec, stand_in, kw, 3) if uv else (_layouts(spec, stand_in, kw, 1), None)
    flops = (4.0 * m * n * k + 22.0 * k**3) * math.prod(batch) * cfactor(dt)
    params = {"cdtype": dt.str, "full_matrices": full, "compute_uv": uv, "hermitian": False}
    if not uv:
        return Prepared(spec, [a], params, [(rs, batch + (k,))], layouts, flops)
    results = [(dt, batch + (m, m if full else k)), (rs, batch + (k,)), (dt, batch + (n if full else k, n))]
    return Prepared(spec, [a], params, results, layouts, flops, finish=container)


def rule_eigh(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _flags(ba, "lower", "eigvals_only", "overwrite_a", "overwrite_b", "check_finite")
    for name, default in (("b", None), ("subset_by_index", None), ("subset_by_value", None)):
        if ba.arguments.get(name, default) is not None:
            raise Unsupported(f"{name}= is computed locally")
    if ba.arguments.get("type", 1) != 1 or ba.arguments.get("driver") not in (None, "ev", "evd", "evr"):
        raise Unsupported("a generalized problem type or driver is computed locally")
    n = square(a)
    dt = lapack_type(a)
    only = bool(ba.arguments.get("eigvals_only", False))
    lower = bool(ba.arguments.get("lower", True))
    stand_in, kw = [tiny(a, (min(n, 2),) * 2, fill="eye", dtype=a.dtype)], {"eigvals_only": only}
    layouts, container = (_layouts(spec, stand_in, kw, 1), None) if only else _container(spec, stand_in, kw, 2)
    batch = a.shape[:-2]
    params = {"cdtype": dt.str, "UPLO": "L" if lower else "U", "vectors": not only}
    flops = 9.0 * n**3 * math.prod(batch) * cfactor(dt)
    if only:
        return Prepared(spec, [a], params, [(real_of(dt), batch + (n,))], layouts, flops / 3)
    return Prepared(spec, [a], params, [(real_of(dt), batch + (n,)), (dt, a.shape)], layouts, flops,
                    finish=container)


def rule_cholesky(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _flags(ba, "lower", "overwrite_a", "check_finite")
    n = square(a)
    dt = lapack_type(a)
    lower = bool(ba.arguments.get("lower", False))
    layouts = _layouts(spec, [tiny(a, (2, 2), fill="eye", dtype=a.dtype)], {"lower": lower}, 1)
    return Prepared(spec, [a], {"cdtype": dt.str, "upper": not lower, "clean": True}, [(dt, a.shape)], layouts,
                    n**3 / 3 * math.prod(a.shape[:-2]) * cfactor(dt))


def rule_lu_factor(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _flags(ba, "overwrite_a", "check_finite")
    if a.ndim < 2:
        raise Unsupported("lu_factor needs a matrix (SciPy raises)")
    dt = lapack_type(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    core = (min(m, 3 if m > n else 2), min(n, 3 if n > m else 2))
    layouts, container = _container(spec, [tiny(a, core, fill="eye", dtype=a.dtype)], {}, 2)
    i4 = np.dtype("i4")
    return Prepared(spec, [a], {"cdtype": dt.str}, [(dt, a.shape), (i4, a.shape[:-2] + (k,))], layouts,
                    (m * n * k - (m + n) * k * k / 2 + k**3 / 3) * 2 * math.prod(a.shape[:-2]) * cfactor(dt),
                    finish=container)


def rule_lu_solve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    pair = ba.arguments["lu_and_piv"]
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise Unsupported("lu_and_piv is not a (lu, piv) tuple")
    lu, piv = array_arg(pair[0], "lu"), array_arg(pair[1], "piv")
    b = arg(spec, ba, 1)
    _flags(ba, "overwrite_b", "check_finite")
    trans = ba.arguments.get("trans", 0)
    if trans not in (0, 1, 2) or isinstance(trans, bool):
        raise Unsupported(f"trans={trans!r} is computed locally")
    if lu.ndim != 2 or piv.ndim != 1 or b.ndim not in (1, 2):
        raise Unsupported("batched lu_solve is computed locally")
    n = square(lu, "lu")
    if piv.dtype.kind not in "iu" or piv.shape != (n,) or b.shape[0] != n:
        raise Unsupported("lu, piv and b do not match (SciPy raises)")
    if piv.min() < 0 or piv.max() >= n:
        raise Unsupported("piv holds an index out of range")
    dt = lapack_type(lu, b)
    k = 1 if b.ndim == 1 else b.shape[1]
    layouts = _layouts(spec, [(tiny(lu, (2, 2), fill="eye", dtype=lu.dtype), np.arange(2, dtype=np.int32)),
                              tiny(b, (2,) if b.ndim == 1 else (2, min(k, 2)), dtype=b.dtype)], {"trans": trans}, 1)
    params = {"cdtype": dt.str, "idtypes": [None, "<i4", None], "trans": int(trans)}
    return Prepared(spec, [lu, piv, b], params, [(dt, b.shape)], layouts, 2.0 * n * n * k * cfactor(dt))


def rule_qr(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    _flags(ba, "overwrite_a", "check_finite", "pivoting")
    mode = ba.arguments.get("mode", "full")
    if mode not in ("full", "qr", "r", "economic") or ba.arguments.get("pivoting", False):
        raise Unsupported(f"qr mode={mode!r} / pivoting is computed locally")
    if a.ndim < 2:
        raise Unsupported("qr needs a matrix (SciPy raises)")
    dt = lapack_type(a)
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    core = (min(m, 3 if m > n else 2), min(n, 3 if n > m else 2))
    count = 1 if mode == "r" else 2
    layouts, container = _container(spec, [tiny(a, core, fill="eye", dtype=a.dtype)], {"mode": mode}, count)
    flops = (4.0 * m * n * k - 4 / 3 * k**3) * math.prod(batch) * cfactor(dt)
    economic = mode == "economic"
    r_rows = k if economic and m >= n else m
    r = (dt, batch + (r_rows, n))
    params = {"cdtype": dt.str, "mode": "reduced" if economic else "complete", "r_only": mode == "r"}
    if mode == "r":
        return Prepared(spec, [a], params, [r], layouts, flops, finish=container)  # None: the array itself
    q = (dt, batch + (m, k if economic else m))
    return Prepared(spec, [a], params, [q, r], layouts, flops, finish=container)


def rule_expm(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0, "A")
    _as_scipy_takes_it(a, "A", byteswapped=False)
    n = square(a, "A")
    if n == 1:
        raise Unsupported("expm of 1x1 matrices is np.exp: computed here")
    dt = lapack_type(a)
    return Prepared(spec, [a], {"cdtype": dt.str}, [(dt, a.shape)], ["C"],
                    30.0 * n**3 * math.prod(a.shape[:-2]) * cfactor(dt))


# --- scipy.fft -------------------------------------------------------------------------------------

def _fft_common(ba: inspect.BoundArguments) -> Any:
    if ba.arguments.get("plan") is not None:
        raise Unsupported("plan= (SciPy raises)")
    _flags(ba, "overwrite_x")
    workers = ba.arguments.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, (int, np.integer))
                                or workers == 0 or workers < -1):
        raise Unsupported(f"workers={workers!r} is not valid here (SciPy decides)")
    norm = ba.arguments.get("norm")
    if norm not in NORMS:
        raise Unsupported(f"norm={norm!r} is not understood (SciPy raises)")
    return norm


def _sfft_layout(x: ndarray, c2c: bool, sizes: list[int], axes: list[int]) -> Any:
    """SciPy's pocketfft allocates its result in C order, except that a complex transform (c2c)
    writes into its working copy when it made one: a zero-padded array (C order again), or the
    input converted to native, aligned form (numpy order 'K'), which is returned sliced when the
    transform truncates: a view with gaps, which only SciPy can return (scipy/fft/_pocketfft)."""
    padded = any(size > x.shape[ax] for size, ax in zip(sizes, axes))
    if not c2c or x.dtype.kind != "c" or padded or (x.dtype.isnative and x.flags.aligned):
        return "C"
    if any(size < x.shape[ax] for size, ax in zip(sizes, axes)):
        raise Unsupported("SciPy returns a view of its truncated working copy: left to it")
    return follow_layout(x)


def rule_sfft_1d(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    kind = spec.attr
    x = arg(spec, ba, 0, "x")
    norm = _fft_common(ba)
    real_t, cplx_t = fft_types(x, real_in=kind == "rfft")
    axis = norm_axis(ba.arguments.get("axis", -1), x.ndim)
    n, m = ba.arguments.get("n"), x.shape[axis]
    if kind == "irfft":
        length = _n(2 * (m - 1) if n is None else n)
        out_len, cdtype, rdtype = length, cplx_t, real_t
    elif kind == "rfft":
        length = _n(m if n is None else n)
        out_len, cdtype, rdtype = length // 2 + 1, real_t, cplx_t
    else:
        length = out_len = _n(m if n is None else n)
        cdtype = rdtype = cplx_t
    shape = x.shape[:axis] + (out_len,) + x.shape[axis + 1:]
    layouts = [_sfft_layout(x, kind in ("fft", "ifft"), [length], [axis])]
    params = {"cdtype": cdtype.str, "n": length, "axis": axis, "norm": norm, "kind": kind}
    return Prepared(spec, [x], params, [(rdtype, shape)], layouts, _flops(shape, [length], kind != "fft"))


def rule_sfft_nd(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    x = arg(spec, ba, 0, "x")
    norm = _fft_common(ba)
    real_t, cplx_t = fft_types(x, real_in=False)
    s, axes = ba.arguments.get("s"), ba.arguments.get("axes", (-2, -1) if spec.attr == "fft2" else None)
    try:
        if axes is None:
            axes = list(range(x.ndim)) if s is None else list(range(x.ndim - len(s), x.ndim))
        axes = [norm_axis(ax, x.ndim, "axes") for ax in axes]
        sizes = [x.shape[ax] for ax in axes] if s is None else [_n(v) for v in s]
    except TypeError:
        raise Unsupported("s or axes is not a sequence") from None
    if not axes or len(sizes) != len(axes) or len(set(axes)) != len(axes):
        raise Unsupported("s and axes do not match, or an axis repeats (SciPy raises)")
    shape = list(x.shape)
    for ax, size in zip(axes, sizes):
        shape[ax] = size
    shape = tuple(shape)
    layouts = [_sfft_layout(x, True, sizes, axes)]
    params = {"cdtype": cplx_t.str, "s": sizes, "axes": axes, "norm": norm, "kind": "fft"}
    return Prepared(spec, [x], params, [(cplx_t, shape)], layouts, _flops(shape, sizes, False))


# D264: an inverse is the forward transform of the inverse type, backward and forward norms swapped
R2R_INVERSE_TYPE = {1: 1, 2: 3, 3: 2, 4: 4}
R2R_INVERSE_NORM = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}


def rule_sfft_r2r(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """dct, idct, dst, idst of types 1-4 on real input (SciPy's result: float32 for float32, else
    float64; always a new C-ordered array); ``orthogonalize=`` only at its default."""
    x = arg(spec, ba, 0, "x")
    norm = _fft_common(ba)
    if ba.arguments.get("orthogonalize") is not None:
        raise Unsupported("orthogonalize= is computed here")
    typ = ba.arguments.get("type", 2)
    if isinstance(typ, (bool, np.bool_)) or typ not in R2R_INVERSE_TYPE:
        raise Unsupported(f"type={typ!r} is not 1-4 (SciPy raises)")
    if x.dtype.kind == "c":
        raise Unsupported("complex input to a real-to-real transform is computed here")
    real_t, _ = fft_types(x, real_in=True)
    axis = norm_axis(ba.arguments.get("axis", -1), x.ndim)
    n = ba.arguments.get("n")
    length = _n(x.shape[axis] if n is None else n)
    kind, typ = spec.attr.removeprefix("i"), int(typ)
    if typ == 1 and kind == "dct" and length < 2:
        raise Unsupported("a DCT-I of fewer than 2 points (SciPy raises)")
    if spec.attr.startswith("i"):
        typ, norm = R2R_INVERSE_TYPE[typ], R2R_INVERSE_NORM[norm]
    # SciPy transforms in place into the copy it made (a cast, byte-swapped or unaligned input):
    # the result is that copy (order 'K'), or a view of it when n cuts the axis
    copied = native(x.dtype) not in (F4, F8) or not x.dtype.isnative or not x.flags.aligned
    if copied and length < x.shape[axis]:
        raise Unsupported("SciPy returns a view of its truncated working copy: left to it")
    layout = follow_layout(x) if copied and length == x.shape[axis] else "C"
    shape = x.shape[:axis] + (length,) + x.shape[axis + 1:]
    params = {"cdtype": real_t.str, "n": length, "axis": axis, "norm": norm or "backward", "kind": kind,
              "type": typ}
    return Prepared(spec, [x], params, [(real_t, shape)], [layout], _flops(shape, [2 * length], real=False))

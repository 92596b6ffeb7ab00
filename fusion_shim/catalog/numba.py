"""Rules of the rows whose worker kernels are written with numba.cuda: functions torch has no faithful
match for. ``torch.bincount`` differs from NumPy in dtypes and weights; ``conv1d`` is a
cross-correlation with its own padding rules, no complex conjugation and no integer accumulation;
torch has no ``interp``. Each kernel (``fusion_shim/worker/numba_kernels.py``) follows NumPy's own
algorithm (its index arithmetic, its NaN fix-ups, its argument swaps) and accumulates in NumPy's
result dtype; sums made in another order (atomics, one thread per output) differ only in rounding.

A worker without numba-cuda (or, on a machine without a GPU, without numba's CUDA simulator) does not
list these kernels in its ``ready`` reply, and the client then runs the rows locally with that
reason. Data-dependent checks NumPy makes (negative bins, NaN) are made here on the client, so that
NumPy raises or computes those calls itself. Operands are cast per operand (``idtypes``) as NumPy
casts them: bincount's indices stay integers.

Family: "products" for all four (the planner's families are fixed; bincount and interp are memory
bound, so the products prior overestimates their local speed and ``auto`` keeps them local unless
measured otherwise).
"""
from __future__ import annotations

import inspect
import operator
from typing import Any

import numpy as np

from .base import C16, F8, I8, OpSpec, Prepared, Unsupported, array_arg, native

CORRELATE_DTYPES = frozenset(np.dtype(t) for t in ("i4", "i8", "f4", "f8", "c8", "c16"))


def _vector(value: Any, name: str) -> np.ndarray:
    a = array_arg(value, name)
    if a.ndim != 1:
        raise Unsupported(f"{name} is {a.ndim}-d, not 1-d")
    return a


def rule_bincount(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    x = _vector(ba.arguments["x"], "x")
    if x.dtype.kind not in "biu" or not np.can_cast(x.dtype, np.intp, "safe"):
        raise Unsupported(f"x has dtype {native(x.dtype)}: no safe cast to intp, left to NumPy")
    try:
        minlength = operator.index(ba.arguments.get("minlength", 0))
    except TypeError:
        raise Unsupported("minlength is not an int") from None
    if minlength < 0:
        raise Unsupported("negative minlength: NumPy raises")
    if x.min() < 0:  # data-dependent: NumPy raises ValueError, so NumPy gets the call
        raise Unsupported("x has negative values: NumPy raises")
    n = max(int(x.max()) + 1, minlength)
    w = ba.arguments.get("weights")
    arrays, dtype, idtypes = [x], I8, [I8.str]
    if w is not None:
        w = array_arg(w, "weights")
        if w.shape != x.shape:
            raise Unsupported("weights do not match x: NumPy raises")
        if not np.can_cast(w.dtype, F8, "safe"):
            raise Unsupported(f"weights of dtype {native(w.dtype)}: NumPy casts them to float64 safely or raises")
        arrays, dtype, idtypes = [x, w], F8, [I8.str, F8.str]
    return Prepared(spec, arrays, {"cdtype": dtype.str, "idtypes": idtypes, "n": n}, [(dtype, (n,))], ["C"],
                    2.0 * x.size)


def _mode(value: Any) -> str:
    if value not in ("full", "same", "valid"):
        raise Unsupported(f"mode={value!r} is computed locally")
    return value


def _windows(n1: int, n2: int, mode: str) -> tuple[int, int]:
    """(n_left, length) of NumPy's _pyarray_correlate for inputs of lengths n1 >= n2."""
    if mode == "valid":
        return 0, n1 - n2 + 1
    if mode == "same":
        return n2 >> 1, n1
    return n2 - 1, n1 + n2 - 1


def _correlate_common(ba: inspect.BoundArguments) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    a, v = _vector(ba.arguments["a"], "a"), _vector(ba.arguments["v"], "v")
    dt = native(np.result_type(a, v))
    if dt not in CORRELATE_DTYPES:
        raise Unsupported(f"dtype {dt} is computed locally")
    return a, v, dt


def rule_convolve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """numpy.convolve: the longer input first, then NumPy's old correlate with the other reversed
    (no conjugation, no reversal of the output)."""
    a, v, dt = _correlate_common(ba)
    mode = _mode(ba.arguments.get("mode", "full"))
    if v.size > a.size:
        a, v = v, a
    n_left, length = _windows(a.size, v.size, mode)
    params = {"cdtype": dt.str, "n_left": n_left, "length": length, "reverse_y": True, "conj_y": False,
              "reverse_out": False}
    return Prepared(spec, [a, v], params, [(dt, (length,))], ["C"], 2.0 * length * v.size * (4 if dt.kind == "c" else 1))


def rule_correlate(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """numpy.correlate (NumPy's correlate2): v conjugated, then, if v is the longer, the two swapped
    and the output reversed."""
    a, v, dt = _correlate_common(ba)
    mode = _mode(ba.arguments.get("mode", "valid"))
    conj = dt.kind == "c"
    x, y, swapped = (a, v, False) if a.size >= v.size else (v, a, True)
    n_left, length = _windows(x.size, y.size, mode)
    params = {"cdtype": dt.str, "n_left": n_left, "length": length, "reverse_y": False,
              "conj_x": conj and swapped, "conj_y": conj and not swapped, "reverse_out": swapped}
    return Prepared(spec, [x, y], params, [(dt, (length,))], ["C"], 2.0 * length * y.size * (4 if conj else 1))


def _real_scalar(value: Any, name: str, complex_ok: bool) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, complex, np.number)):
        raise Unsupported(f"{name}={value!r} is computed locally")
    z = complex(value)
    if z.imag and not complex_ok:
        raise Unsupported(f"complex {name} with real fp: NumPy decides")
    return [z.real, z.imag] if complex_ok else z.real


def rule_interp(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    x = array_arg(ba.arguments["x"], "x")
    xp, fp = _vector(ba.arguments["xp"], "xp"), _vector(ba.arguments["fp"], "fp")
    if ba.arguments.get("period") is not None:
        raise Unsupported("period= is computed locally")
    if x.dtype.kind not in "biuf" or xp.dtype.kind not in "biuf" or fp.dtype.kind not in "biufc":
        raise Unsupported("dtypes NumPy would not interpolate in float64/complex128")
    if x.dtype.itemsize > 8 or xp.dtype.itemsize > 8 or fp.dtype.itemsize > 16:
        raise Unsupported("extended precision is computed locally")
    if xp.size != fp.size:
        raise Unsupported("fp and xp differ in length: NumPy raises")
    # NaN positions steer NumPy's search and its NaN fix-ups in ways a bisection need not share
    if x.dtype.kind == "f" and np.isnan(x).any() or xp.dtype.kind == "f" and np.isnan(xp).any():
        raise Unsupported("NaN in x or xp is computed locally")
    cplx = fp.dtype.kind == "c"
    left = _real_scalar(ba.arguments.get("left"), "left", cplx)
    right = _real_scalar(ba.arguments.get("right"), "right", cplx)
    dt = C16 if cplx else F8
    params = {"cdtype": dt.str, "idtypes": [F8.str, F8.str, dt.str], "left": left, "right": right}
    return Prepared(spec, [x, xp, fp], params, [(dt, x.shape)], ["C"],
                    float(x.size) * max(np.log2(xp.size), 1.0) * (2 if cplx else 1), scalar_0d=True)

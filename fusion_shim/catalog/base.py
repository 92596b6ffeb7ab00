"""What rules are written with: a prepared call (:class:`Prepared`) and the checks rules share (a
row, :class:`OpSpec`, and the reason a call stays local, :class:`Unsupported`, are in :mod:`.spec`).

A rule turns a bound call into a :class:`Prepared` call: the operands to send, the static
parameters for the worker's kernel, the dtype and shape of each array the worker returns, the
memory layout NumPy would give it, the work in flops, and how NumPy's return value is assembled
(an array, a scalar for 0-d results, a named tuple, ``out=`` written in place, or a ``finish``
function for anything else). A rule raises :class:`Unsupported` with a reason for anything it
cannot match exactly; the call then runs locally, where NumPy accepts it or raises its own error.
"""
from __future__ import annotations

import importlib
import inspect
import math
import operator
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .spec import OpSpec, Unsupported

ndarray = np.ndarray


@dataclass(slots=True, eq=False, repr=False)  # D341: made with the rules, after NumPy's import
class Prepared:
    """A call a rule has matched: what to send, what comes back, and how NumPy's value is built."""

    spec: OpSpec
    arrays: list[ndarray]
    params: dict[str, Any]
    results: list[tuple[np.dtype, tuple[int, ...]]]  # what the worker returns, array by array
    layouts: list[Any]  # "C", "F" or an axis order per result
    flops: float
    out: ndarray | None = None
    scalar_0d: bool = False  # NumPy returns a scalar, not a 0-d array, when the result is 0-d
    scalar_out: bool = False  # np.dot: a 0-d out= is returned as a scalar too (NumPy's PyArray_Return)
    returns: str = "array"  # "array", or the numpy.linalg named tuple the results form
    # Builds NumPy's return value from the worker's arrays when the three fields above cannot say it
    # (eig's real-or-complex result, lstsq's tuple, a result NumPy returns as a view, ...). It only
    # rearranges what the worker computed, with NumPy's own cheap operations; it never raises.
    finish: Callable[[list[ndarray]], Any] | None = None

    def __repr__(self) -> str:
        return f"Prepared({self.spec.name!r}, results={self.results!r}, flops={self.flops!r})"

    def returned(self, arrays: list[ndarray]) -> Any:
        """NumPy's return value from the computed arrays, each already of its result's dtype char
        (D199): axis-order layouts transposed back, then ``finish``, a named tuple, ``out=`` or a
        0-d scalar, as NumPy returns it. The client (a worker's reply) and a stage process's
        device calls both build it here."""
        layouts = self.layouts
        if len(arrays) != len(layouts) or list in map(type, layouts):  # D346: none to transpose (all "C"/"F"), no pass
            arrays = [a.transpose(np.argsort(lay)) if isinstance(lay, list) else a for a, lay in zip(arrays, layouts)]
        if self.finish is not None:  # the row's own assembly: NumPy's cheap epilogue
            return self.finish(arrays)
        if self.returns != "array":
            return _result_type(self.returns)(*arrays)
        result = arrays[0]
        if self.out is not None:
            np.copyto(self.out, result)
            return self.out[()] if self.scalar_out and self.out.ndim == 0 else self.out
        if self.scalar_0d and result.ndim == 0:
            return result[()]
        return result

    @property
    def bytes_in(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def bytes_out(self) -> int:
        return sum(math.prod(s) * d.itemsize for d, s in self.results)


_results: dict[str, type] = {}  # numpy.linalg's result types by name, looked up once


def _result_type(name: str) -> type:
    cls = _results.get(name)
    if cls is None:
        from numpy.linalg import _linalg
        cls = _results[name] = getattr(_linalg, name)
    return cls


# --- dtypes ----------------------------------------------------------------------------------------

F4, F8, C8, C16 = (np.dtype(t) for t in ("f4", "f8", "c8", "c16"))
I8 = np.dtype("i8")
PRODUCT_DTYPES = frozenset(np.dtype(t) for t in ("i4", "i8", "f4", "f8", "c8", "c16"))
LINALG_DTYPES = frozenset((F4, F8, C8, C16))


def native(dt: np.dtype) -> np.dtype:
    """The dtype in native byte order: what NumPy's results carry, whatever the inputs' order."""
    return dt if dt.isnative else dt.newbyteorder("=")


def product_dtype(*arrays: ndarray) -> np.dtype:
    dt = native(np.result_type(*arrays))
    if dt not in PRODUCT_DTYPES:
        raise Unsupported(f"dtype {dt} is not offloaded for products")
    return dt


def linalg_types(*arrays: ndarray) -> tuple[np.dtype, np.dtype]:
    """numpy.linalg's ``_commonType``: LAPACK always runs in double (or complex double) and the
    result is cast to ``result_t``, single precision only when every input is single. float16 and
    longdouble are refused (NumPy raises TypeError for them)."""
    single, cplx = True, False
    for a in arrays:
        dt = native(a.dtype)
        if dt.kind == "c":
            cplx = True
        if dt.kind in "fc":
            if dt not in LINALG_DTYPES:
                raise Unsupported(f"dtype {dt} is not offloaded for linalg")
            single = single and dt in (F4, C8)
        elif dt.kind in "biu":
            single = False
        else:
            raise Unsupported(f"dtype {dt} is not offloaded for linalg")
    if cplx:
        return C16, (C8 if single else C16)
    return F8, (F4 if single else F8)


def linalg_dtype(dt: np.dtype) -> np.dtype:
    """numpy.linalg's result type for one input: integers and bools compute in float64."""
    return linalg_types(np.empty(0, dt))[1]


def real_of(dt: np.dtype) -> np.dtype:
    return F4 if dt in (C8, F4) else F8


def complex_of(dt: np.dtype) -> np.dtype:
    return C8 if dt in (C8, F4) else C16


def cfactor(dt: np.dtype) -> int:
    return 4 if dt.kind == "c" else 1


# --- arguments -------------------------------------------------------------------------------------

# D260: what np.asarray turns into an exact ndarray as every row's function does (its dtype is
# asarray's: np.einsum, np.outer, the product ufuncs take a Python scalar or list as asarray does)
ARRAY_LIKES = (list, tuple, int, float, complex, bool, np.generic)


def array_arg(value: Any, name: str, allow_empty: bool = False) -> ndarray:
    """An operand as the row's function sees it: an exact ndarray, or an array-like (list, tuple,
    Python or NumPy scalar) converted as ``np.asarray`` converts it; subclasses stay with NumPy."""
    if type(value) is not ndarray:
        if isinstance(value, ndarray) or not isinstance(value, ARRAY_LIKES):
            kind = "an unknown array-like" if not isinstance(value, ndarray) else f"subclass {type(value).__name__}"
            raise Unsupported(f"{name} is {kind}, not an exact ndarray")
        value = as_array(value, name)
    if value.dtype.hasobject or value.dtype.kind not in "biufc":
        raise Unsupported(f"{name} has dtype {value.dtype}")
    if value.size == 0 and not allow_empty:
        # zero-size: no work to offload; NumPy builds its empty (or raises) here, at no cost
        raise Unsupported(f"{name} is empty")
    return value


def as_array(value: Any, name: str) -> ndarray:
    """``np.asarray(value)``, or Unsupported where NumPy's conversion fails, warns or finds a subclass
    inside (ragged lists, objects with ``__array__``): the library then converts, and raises, itself."""
    if isinstance(value, (list, tuple)) and not _plain(value, 0):
        raise Unsupported(f"{name} is a sequence holding other than numbers and exact ndarrays")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            converted = np.asarray(value)
    except Exception as exc:  # NumPy's own error is raised where the call runs: here, by NumPy
        raise Unsupported(f"{name} does not convert to an array: {type(exc).__name__}") from None
    return converted


def _plain(seq: Any, depth: int) -> bool:
    """Every leaf a Python or NumPy number or an exact ndarray (bounded depth: NumPy's is 64)."""
    if depth > 32:
        return False
    for x in seq:
        t = type(x)
        if t is list or t is tuple:
            if not _plain(x, depth + 1):
                return False
        elif not (t is ndarray or t in (int, float, complex, bool) or isinstance(x, np.generic)):
            return False
    return True


def arg(spec: OpSpec, ba: inspect.BoundArguments, i: int = 0, name: str | None = None) -> ndarray:
    """The row's i-th array parameter (by its name in this signature: ``a``, ``x1``, ...)."""
    pname = spec.args[i]
    return array_arg(ba.arguments[pname], name or pname)


def out_arg(value: Any, dtype: np.dtype, shape: tuple, need_c: bool = False) -> ndarray | None:
    """``out=`` is honoured when it is exactly what NumPy would allocate; otherwise NumPy decides."""
    if value is None:
        return None
    if type(value) is not ndarray:
        raise Unsupported("out= is not an exact ndarray")
    if value.dtype != dtype or value.shape != shape:
        raise Unsupported(f"out= is {value.dtype}{list(value.shape)}, result would be {dtype}{list(shape)}")
    if need_c and not value.flags.c_contiguous:
        raise Unsupported("out= is not C-contiguous")
    if not value.flags.writeable:
        raise Unsupported("out= is read-only")
    return value


def int_param(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise Unsupported(f"{what}={value!r} is a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise Unsupported(f"{what}={value!r} is not an int") from None


def float_param(value: Any, what: str) -> float:
    """A real scalar parameter (tolerances, cut-offs); arrays of them are computed locally."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Unsupported(f"{what}={value!r} is not a real scalar")
    return float(value)


def bool_param(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise Unsupported(f"{what}={value!r} is not a bool")
    return bool(value)


def norm_axis(axis: Any, ndim: int, what: str = "axis") -> int:
    axis = int_param(axis, what)
    if not -ndim <= axis < ndim:
        raise Unsupported(f"{what}={axis} out of range")
    return axis % ndim


def square(a: ndarray, name: str = "a") -> int:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise Unsupported(f"{name} is not a (stack of) square matrices")
    return a.shape[-1]


def batch_of(*shapes: tuple) -> tuple:
    if not any(len(s) for s in shapes):  # no batch axes (a plain matrix product): the common case, spared NumPy's call
        return ()
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported("batch dimensions do not broadcast") from None


# --- layouts ---------------------------------------------------------------------------------------

def perm_layout(perm: list[int]) -> Any:
    """An axis order (slowest to fastest) as a layout: "C", "F", or the order itself."""
    if perm == sorted(perm):
        return "C"
    if perm == sorted(perm, reverse=True):
        return "F"
    return perm


def follow_layout(a: ndarray) -> Any:
    """The fft results: NumPy allocates them with ``empty_like(a, shape=...)`` (order 'K'): C for
    C-contiguous input, F for F-contiguous, else the axes sorted by decreasing |stride|, ties in
    axis order (NumPy's PyArray_CreateSortedStridePerm)."""
    if a.ndim <= 1 or a.flags.c_contiguous:
        return "C"
    if a.flags.f_contiguous:
        return "F"
    return perm_layout(sorted(range(a.ndim), key=lambda i: -abs(a.strides[i])))


def gufunc_layout(operands: list[tuple[ndarray, int]], batch: tuple, core_out: int) -> Any:
    """A generalized ufunc's result (matmul; numpy.linalg's solve, inv, cholesky, eigh, svd):
    NumPy's iterator orders the loop (batch) axes as the operands' strides suggest (order 'K') and
    puts the core axes last, in C order. ``operands`` pairs each input with its number of core axes.
    Only two or more batch axes longer than 1 can give anything but C, so that is all that is probed:
    the same iterator over views of at most 2 elements per batch axis, with the inputs' strides."""
    if sum(d > 1 for d in batch) < 2 or all(a.flags.c_contiguous for a, _ in operands):
        return "C"
    views = [a[tuple(slice(0, 2) for _ in range(a.ndim - ncore)) + (0,) * ncore] for a, ncore in operands]
    it = np.nditer(views + [None], flags=["refs_ok", "zerosize_ok"],
                   op_flags=[["readonly"]] * len(views) + [["writeonly", "allocate"]],
                   op_dtypes=[v.dtype for v in views] + [np.dtype(bool)], order="K")
    res = it.operands[-1]
    perm = sorted(range(res.ndim), key=lambda i: -res.strides[i])
    return perm_layout(perm + list(range(len(batch), len(batch) + core_out)))


def layout_of(res: ndarray) -> Any:
    """The layout of an array NumPy returned (a probe's): "C", "F" or its axis order."""
    if res.flags.c_contiguous:
        return "C"
    if res.flags.f_contiguous:
        return "F"
    perm = sorted(range(res.ndim), key=lambda i: -abs(res.strides[i]))
    if not res.transpose(perm).flags.c_contiguous:
        raise Unsupported("the library's result would be a view with gaps: left to it")
    return perm_layout(perm)


def tiny(a: ndarray, core: tuple = (), fill: str = "zeros", dtype: Any = None) -> ndarray:
    """A stand-in for ``a`` with its stride order and at most 2 elements per batch axis (``core``
    sets the last axes' lengths): NumPy's layout decisions (order 'K') depend on the order of
    strides, not on the lengths. ``fill="eye"`` makes each trailing square matrix a well-conditioned
    one (for probes of functions that factor it); the dtype is a's in native order unless given."""
    tshape = tuple(min(d, 2) for d in a.shape[:a.ndim - len(core)]) + tuple(core)
    order = sorted(range(a.ndim), key=lambda i: -abs(a.strides[i]) if a.shape[i] > 1 else 0)
    dt = native(a.dtype) if dtype is None else dtype
    x = np.zeros(tuple(tshape[i] for i in order), dt).transpose(np.argsort(order))
    if fill == "eye" and a.ndim >= 2:
        m, n = tshape[-2:]
        k = np.arange(min(m, n))
        x[..., k, k] = 3
        if m == n and n > 1:  # neither triangular nor symmetric (integers too): no structure-specific path
            x[..., 0, 1], x[..., 1, 0] = 1, -1
    return x


def unwrap(fn: Any) -> Any:
    """The function behind the shim's wrapper (only the shim's: NumPy's dispatchers and SciPy's
    batching decorators carry ``__wrapped__`` too, and must stay in place). The shim wraps with
    wrapt's ``FunctionWrapper`` or, with its C extension, an ``ObjectProxy`` subclass of its own."""
    # wrapt's C types (intercept.wrappers loads them alone), else its Python ones (no C part)
    wrapt = sys.modules.get("wrapt._wrappers") or sys.modules.get("wrapt.wrappers")
    if wrapt is None:  # not loaded: nothing in this process was wrapped by the shim
        return fn
    ours = isinstance(fn, wrapt.FunctionWrapper) or (  # the wrapt path, or the C fast path's proxy class
        isinstance(fn, wrapt.ObjectProxy) and type(fn).__module__.partition(".")[0] == __name__.partition(".")[0])
    return fn.__wrapped__ if ours else fn


def original(spec: OpSpec) -> Callable:
    """The row's function as the library defines it (the shim's wrapper unwrapped): for probes."""
    return unwrap(getattr(importlib.import_module(spec.module), spec.attr))


def probe_result(spec: OpSpec, stand_ins: list, kwargs: dict) -> Any:
    """What the library's own function returns for tiny stand-ins of the operands (microseconds):
    for results whose memory order (or container) follows from a chain of the library's operations
    (reductions, views, copies in order 'K', SciPy's batching) rather than from one rule."""
    try:
        with np.errstate(all="ignore"):
            return original(spec)(*stand_ins, **kwargs)
    except Exception as exc:  # the stand-in is not the call: never the caller's error
        raise Unsupported(f"layout probe failed: {type(exc).__name__}: {exc}"[:200]) from None


def probe(spec: OpSpec, stand_ins: list, kwargs: dict, count: int = 1) -> list:
    """The layouts of the first ``count`` arrays :func:`probe_result` finds."""
    res = probe_result(spec, stand_ins, kwargs)
    parts = res if isinstance(res, (tuple, list)) else (res,)
    return [layout_of(p) if isinstance(p, ndarray) and p.ndim >= 2 else "C" for p in parts][:count]


def scalar_or_array(res: ndarray) -> Any:
    """NumPy's convention for a ufunc or reduction result: a 0-d result comes back as a scalar."""
    return res[()] if res.ndim == 0 else res

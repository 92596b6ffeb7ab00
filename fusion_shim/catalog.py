"""The op catalog: one row of data per intercepted NumPy function.

A row says where the function lives, which of its parameters are arrays, which other parameters
the worker's kernel understands, and which *rule* turns a call into a :class:`Prepared` call:
the operands to send, the static parameters, the exact dtype and shape NumPy would return, the
memory layout NumPy would give it, the work in flops, and how to assemble NumPy's return value
(an array, a scalar for 0-d results, a named tuple, or ``out=`` written in place).

A rule raises :class:`Unsupported` with a reason for anything it cannot match exactly (an
array-like, a subclass, object dtype, an unsupported keyword, a shape NumPy would reject); the call
then runs locally, where NumPy itself accepts it or raises its own error, and the reason is
recorded. Adding an op is adding a row, a rule if no existing one fits, and a kernel on the worker.

Each row is checked against the real function's signature when the interceptor wraps it
(:func:`check_signature`).
"""
from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

ndarray = np.ndarray


class Unsupported(Exception):
    """The call cannot be offloaded faithfully; the message is the reason the ledger keeps."""


@dataclass(frozen=True)
class OpSpec:
    name: str                   # the public name, e.g. "numpy.linalg.solve"
    module: str                 # where the attribute is patched
    attr: str
    family: str                 # "products" | "linalg" | "fft": cost model and report grouping
    rule: Callable[["OpSpec", inspect.BoundArguments], "Prepared"]
    params: tuple[str, ...] = ()  # parameters besides the arrays that the rule understands
    kernel: str = ""            # worker kernel id; defaults to name without "numpy."

    @property
    def kernel_id(self) -> str:
        return self.kernel or self.name.removeprefix("numpy.")


@dataclass
class Prepared:
    spec: OpSpec
    arrays: list[ndarray]
    params: dict[str, Any]
    results: list[tuple[np.dtype, tuple[int, ...]]]   # what NumPy returns, array by array
    layouts: list[Any]                                  # "C", "F" or an axis order per result
    flops: float
    out: ndarray | None = None
    scalar_0d: bool = False   # NumPy returns a scalar, not a 0-d array, when the result is 0-d
    returns: str = "array"    # "array", or the numpy.linalg named tuple the results form
    scalar_out: bool = False  # np.dot: a 0-d out= is returned as a scalar too (NumPy's PyArray_Return)

    @property
    def bytes_in(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def bytes_out(self) -> int:
        return sum(math.prod(s) * d.itemsize for d, s in self.results)


# --- shared checks -------------------------------------------------------------------------

PRODUCT_DTYPES = frozenset(np.dtype(t) for t in ("i4", "i8", "f4", "f8", "c8", "c16"))
LINALG_DTYPES = frozenset(np.dtype(t) for t in ("f4", "f8", "c8", "c16"))
FLOAT_KINDS = "fc"


def array_arg(value: Any, name: str) -> ndarray:
    if type(value) is not ndarray:
        kind = "an array-like" if not isinstance(value, ndarray) else f"subclass {type(value).__name__}"
        raise Unsupported(f"{name} is {kind}, not an exact ndarray")
    if value.dtype.hasobject or value.dtype.kind not in "biufc":
        raise Unsupported(f"{name} has dtype {value.dtype}")
    if value.size == 0:
        raise Unsupported(f"{name} is empty")
    return value


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
        raise Unsupported("NumPy's result would not be a dense array")
    return perm_layout(perm)


def norm_axis(axis: Any, ndim: int, what: str = "axis") -> int:
    try:
        axis = operator.index(axis)
    except TypeError:
        raise Unsupported(f"{what}={axis!r} is not an int") from None
    if not -ndim <= axis < ndim:
        raise Unsupported(f"{what}={axis} out of range")
    return axis % ndim


def linalg_dtype(dt: np.dtype) -> np.dtype:
    """numpy.linalg's result type: integers and bools compute in float64; float16 is refused."""
    if dt.kind in "biu":
        return np.dtype("f8")
    if dt not in LINALG_DTYPES:
        raise Unsupported(f"dtype {dt} is not offloaded for linalg")
    return dt


def real_of(dt: np.dtype) -> np.dtype:
    return np.dtype("f4") if dt in (np.dtype("c8"), np.dtype("f4")) else np.dtype("f8")


def square(a: ndarray, name: str = "a") -> int:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise Unsupported(f"{name} is not a (stack of) square matrices")
    return a.shape[-1]


def batch_of(*shapes: tuple) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported("batch dimensions do not broadcast") from None


def cfactor(dt: np.dtype) -> int:
    return 4 if dt.kind == "c" else 1


# --- products --------------------------------------------------------------------------------

def product_dtype(*arrays: ndarray) -> np.dtype:
    dt = np.result_type(*arrays)
    if dt not in PRODUCT_DTYPES:
        raise Unsupported(f"dtype {dt} is not offloaded for products")
    return dt


def rule_matmul(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = array_arg(ba.arguments["x1"], "x1"), array_arg(ba.arguments["x2"], "x2")
    dt = product_dtype(a, b)
    sa = a.shape if a.ndim > 1 else (1,) + a.shape
    sb = b.shape if b.ndim > 1 else b.shape + (1,)
    if a.ndim == 0 or b.ndim == 0 or sa[-1] != sb[-2]:
        raise Unsupported("operands are not aligned for matmul")
    batch = batch_of(sa[:-2], sb[:-2])
    shape = batch + (sa[-2],) * (a.ndim > 1) + (sb[-1],) * (b.ndim > 1)
    out = out_arg(ba.arguments.get("out"), dt, shape)
    flops = 2.0 * math.prod(batch) * sa[-2] * sa[-1] * sb[-1] * cfactor(dt)
    layout = gufunc_layout([(a, min(a.ndim, 2)), (b, min(b.ndim, 2))], batch, len(shape) - len(batch))
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, shape)], [layout], flops, out, scalar_0d=True)


def rule_dot(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = array_arg(ba.arguments["a"], "a"), array_arg(ba.arguments["b"], "b")
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("0-d operand: dot is an element-wise multiply")
    dt = product_dtype(a, b)
    k_axis_b = max(b.ndim - 2, 0)
    if a.shape[-1] != b.shape[k_axis_b]:
        raise Unsupported("shapes not aligned for dot")
    shape = a.shape[:-1] + b.shape[:k_axis_b] + b.shape[k_axis_b + 1:]
    out = out_arg(ba.arguments.get("out"), dt, shape, need_c=True)
    flops = 2.0 * (a.size / a.shape[-1]) * b.size * cfactor(dt)
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, shape)], ["C"], flops, out, scalar_0d=True,
                    scalar_out=True)


def rule_imatmul(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """``a @= b`` (issue 3). NumPy computes ``matmul(a, b, out=a)`` with ``axes=`` that forbid
    changing a's shape: b needs two dimensions at least and the product must have exactly a's
    shape; its dtype must be a's (NumPy would cast, or refuse, otherwise: left to NumPy)."""
    a, b = array_arg(ba.arguments["x1"], "x1"), array_arg(ba.arguments["x2"], "x2")
    if b.ndim < 2:
        raise Unsupported("a @= b needs b with two dimensions at least")
    prep = rule_matmul(spec, ba)
    dt, shape = prep.results[0]
    if shape != a.shape:
        raise Unsupported(f"a @= b would change a's shape {list(a.shape)} to {list(shape)}")
    if dt != a.dtype:
        raise Unsupported(f"a @= b computes in {dt}, a is {a.dtype}")
    if not a.flags.writeable:
        raise Unsupported("a is read-only")
    prep.out, prep.scalar_0d = a, False
    return prep


def _tensordot_axes(axes: Any, a: ndarray, b: ndarray) -> tuple[list[int], list[int]]:
    try:
        n = operator.index(axes)
        if n < 0:
            raise Unsupported("negative axes count")
        return list(range(a.ndim - n, a.ndim)), list(range(n))
    except TypeError:
        pass
    try:
        xa, xb = axes
    except (TypeError, ValueError):
        raise Unsupported(f"axes={axes!r} is not understood") from None
    xa = [xa] if isinstance(xa, (int, np.integer)) else list(xa)
    xb = [xb] if isinstance(xb, (int, np.integer)) else list(xb)
    if len(xa) != len(xb):
        raise Unsupported("axes lists differ in length")
    xa = [norm_axis(x, a.ndim, "axes") for x in xa]
    xb = [norm_axis(x, b.ndim, "axes") for x in xb]
    if len(set(xa)) != len(xa) or len(set(xb)) != len(xb):
        raise Unsupported("repeated axes")
    return xa, xb


def rule_tensordot(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = array_arg(ba.arguments["a"], "a"), array_arg(ba.arguments["b"], "b")
    dt = product_dtype(a, b)
    xa, xb = _tensordot_axes(ba.arguments.get("axes", 2), a, b)
    if any(a.shape[i] != b.shape[j] for i, j in zip(xa, xb)):
        raise Unsupported("shape-mismatch for sum")
    if len(xa) > a.ndim or len(xb) > b.ndim:
        raise Unsupported("more axes than dimensions")
    shape = tuple(d for i, d in enumerate(a.shape) if i not in xa) + tuple(
        d for j, d in enumerate(b.shape) if j not in xb)
    summed = math.prod(a.shape[i] for i in xa)
    flops = 2.0 * math.prod(shape) * summed * cfactor(dt)
    return Prepared(spec, [a, b], {"cdtype": dt.str, "axes": [xa, xb]}, [(dt, shape)], ["C"], flops)


def _einsum_parse(subscripts: str, arrays: list[ndarray]) -> tuple[list[str], str, dict[str, int], tuple]:
    """Labels per operand (ellipsis as '.'), the output labels, each label's size, the ellipsis shape."""
    sub = subscripts.replace(" ", "")
    if "->" in sub:
        lhs, rhs = sub.split("->", 1)
        if "->" in rhs:
            raise Unsupported("subscripts have more than one '->'")
    else:
        lhs, rhs = sub, None
    terms = lhs.split(",")
    if len(terms) != len(arrays):
        raise Unsupported("operand count does not match the subscripts")
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    ell_shapes = []
    labels_per = []
    for term, arr in zip(terms, arrays):
        if term.count("...") > 1 or term.replace("...", "").count(".") or not term.replace("...", "").isalpha():
            raise Unsupported(f"subscript term {term!r} is not understood")
        plain = term.replace("...", "")
        n_ell = arr.ndim - len(plain)
        if n_ell < 0 or (n_ell > 0 and "..." not in term):
            raise Unsupported("subscript rank does not match the operand")
        head, _, tail = term.partition("...") if "..." in term else (term, "", "")
        ell_shapes.append(arr.shape[len(head):len(head) + n_ell] if "..." in term else ())
        for lab, dim in zip(head + tail, arr.shape[:len(head)] + arr.shape[arr.ndim - len(tail):]):
            prev = sizes.get(lab, 1)
            if dim != prev and dim != 1 and prev != 1:
                raise Unsupported(f"label {lab!r} has sizes {prev} and {dim}")
            sizes[lab] = max(prev, dim)
        for lab in set(plain):
            counts[lab] = counts.get(lab, 0) + plain.count(lab)
        labels_per.append(term)
    ell = batch_of(*ell_shapes)
    if rhs is None:
        rhs = ("..." if any("..." in t for t in terms) else "") + "".join(
            sorted(lab for lab, c in counts.items() if c == 1))
    out_plain = rhs.replace("...", "")
    if not out_plain.isalpha() and out_plain or len(set(out_plain)) != len(out_plain):
        raise Unsupported(f"output subscripts {rhs!r} are not understood")
    if any(lab not in sizes for lab in out_plain):
        raise Unsupported("output has a label no operand has")
    return labels_per, rhs, sizes, ell


def rule_einsum(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    operands = ba.arguments.get("operands", ())
    if not operands or not isinstance(operands[0], str):
        raise Unsupported("einsum without a subscripts string")
    subscripts, arrays = operands[0], [array_arg(x, f"operand {i}") for i, x in enumerate(operands[1:])]
    extra = set(ba.arguments.get("kwargs", {}))
    if extra:
        raise Unsupported(f"unsupported keyword {sorted(extra)[0]}")
    if len(arrays) < 2:
        raise Unsupported("single-operand einsum returns a view")
    dt = product_dtype(*arrays)
    _, rhs, sizes, ell = _einsum_parse(subscripts, arrays)
    head, _, tail = rhs.partition("...") if "..." in rhs else (rhs, "", "")
    shape = tuple(sizes[c] for c in head) + (ell if "..." in rhs else ()) + tuple(sizes[c] for c in tail)
    flops = 2.0 * math.prod(sizes.values()) * math.prod(ell) * cfactor(dt) * (len(arrays) - 1)
    out = out_arg(ba.arguments.get("out"), dt, shape)
    layout = spec_einsum_layout(subscripts, arrays, len(shape), ba.arguments.get("optimize", False))
    full = subscripts if "->" in subscripts else subscripts + "->" + rhs
    return Prepared(spec, arrays, {"cdtype": dt.str, "subscripts": full}, [(dt, shape)], [layout], flops, out,
                    scalar_0d=True)


try:  # NumPy's C einsum: never patched, so the layout probe below cannot recurse into the shim
    from numpy._core.multiarray import c_einsum as _c_einsum
except ImportError:  # pragma: no cover - a NumPy that moved it: results come back in C order
    _c_einsum = None


def _tiny(a: ndarray, core: tuple = ()) -> ndarray:
    """Zeros of a's dtype and stride order, at most 2 elements per axis (``core`` sets the last axes'
    lengths): NumPy's layout decisions (order 'K') depend on the order of strides, not the lengths."""
    tshape = tuple(min(d, 2) for d in a.shape[:a.ndim - len(core)]) + tuple(core)
    order = sorted(range(a.ndim), key=lambda i: -abs(a.strides[i]) if a.shape[i] > 1 else 0)
    return np.zeros(tuple(tshape[i] for i in order), a.dtype).transpose(np.argsort(order))


def spec_einsum_layout(subscripts: str, arrays: list[ndarray], ndim: int, optimize: Any = False) -> Any:
    """NumPy's einsum lays its output out following its operands (order 'K'). Reproduce that by
    running NumPy's own einsum on tiny operands with the same stride order (a few microseconds).
    With ``optimize`` NumPy contracts pairwise, through BLAS (tensordot) where it can, along a path
    chosen from the real sizes, and the layout follows from that path: it is computed here from the
    real operands (shapes only, as NumPy does) and replayed on the tiny ones."""
    if ndim < 2 or _c_einsum is None:
        return "C"
    tiny = [_tiny(a) for a in arrays]
    try:
        if optimize is False:
            res = _c_einsum(subscripts, *tiny)
        else:
            from numpy._core.einsumfunc import einsum, einsum_path  # NumPy's own, never the shim's

            path = optimize if isinstance(optimize, list) else einsum_path(subscripts, *arrays,
                                                                            optimize=optimize)[0]
            res = einsum(subscripts, *tiny, optimize=path)
    except Exception:
        if optimize is False:
            return "C"
        raise Unsupported(f"optimize={optimize!r} is not understood") from None
    if not isinstance(res, ndarray) or res.ndim != ndim:
        return "C"
    return layout_of(res)


# --- numpy.linalg --------------------------------------------------------------------------------

def _linalg_one(spec: OpSpec, ba: inspect.BoundArguments) -> tuple[ndarray, np.dtype, int]:
    a = array_arg(ba.arguments["a"], "a")
    n = square(a)
    return a, linalg_dtype(a.dtype), n


def rule_solve(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = array_arg(ba.arguments["a"], "a"), array_arg(ba.arguments["b"], "b")
    n = square(a)
    dt = linalg_dtype(np.result_type(a, b))
    if b.ndim == 1:
        if b.shape[0] != n:
            raise Unsupported("b does not match a")
        shape, k = a.shape[:-1], 1
    else:
        if b.shape[-2] != n:
            raise Unsupported("b does not match a")
        shape, k = batch_of(a.shape[:-2], b.shape[:-2]) + b.shape[-2:], b.shape[-1]
    flops = (2 / 3 * n**3 + 2 * n * n * k) * math.prod(shape[:-2] if b.ndim > 1 else a.shape[:-2]) * cfactor(dt)
    core = 1 if b.ndim == 1 else 2
    layout = gufunc_layout([(a, 2), (b, core)], shape[:-core], core)
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, shape)], [layout], flops)


def rule_inv(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, dt, n = _linalg_one(spec, ba)
    flops = 2.0 * n**3 * math.prod(a.shape[:-2]) * cfactor(dt)
    layout = gufunc_layout([(a, 2)], a.shape[:-2], 2)
    return Prepared(spec, [a], {"cdtype": dt.str}, [(dt, a.shape)], [layout], flops)


def rule_cholesky(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, dt, n = _linalg_one(spec, ba)
    upper = ba.arguments.get("upper", False)
    if not isinstance(upper, (bool, np.bool_)):
        raise Unsupported("upper= is not a bool")
    flops = n**3 / 3 * math.prod(a.shape[:-2]) * cfactor(dt)
    layout = gufunc_layout([(a, 2)], a.shape[:-2], 2)
    return Prepared(spec, [a], {"cdtype": dt.str, "upper": bool(upper)}, [(dt, a.shape)], [layout], flops)


def rule_eigh(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, dt, n = _linalg_one(spec, ba)
    uplo = ba.arguments.get("UPLO", "L")
    if uplo not in ("L", "U"):
        raise Unsupported("UPLO is neither 'L' nor 'U'")
    batch = a.shape[:-2]
    flops = 9.0 * n**3 * math.prod(batch) * cfactor(dt)
    layouts = [gufunc_layout([(a, 2)], batch, core) for core in (1, 2)]
    return Prepared(spec, [a], {"cdtype": dt.str, "UPLO": uplo},
                    [(real_of(dt), batch + (n,)), (dt, a.shape)], layouts, flops, returns="EighResult")


def rule_svd(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = array_arg(ba.arguments["a"], "a")
    if a.ndim < 2:
        raise Unsupported("svd needs at least 2 dimensions")
    if ba.arguments.get("hermitian", False):
        raise Unsupported("hermitian=True is computed locally")
    dt = linalg_dtype(a.dtype)
    full, uv = bool(ba.arguments.get("full_matrices", True)), bool(ba.arguments.get("compute_uv", True))
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    s = (real_of(dt), batch + (k,))
    flops = (4.0 * m * n * k + 22.0 * k**3 if uv else 4.0 * m * n * k) * math.prod(batch) * cfactor(dt)
    params = {"cdtype": dt.str, "full_matrices": full, "compute_uv": uv}
    lay1, lay2 = (gufunc_layout([(a, 2)], batch, core) for core in (1, 2))
    if not uv:
        return Prepared(spec, [a], params, [s], [lay1], flops)
    u = (dt, batch + (m, m if full else k))
    vh = (dt, batch + (n if full else k, n))
    return Prepared(spec, [a], params, [u, s, vh], [lay2, lay1, lay2], flops, returns="SVDResult")


def rule_qr(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = array_arg(ba.arguments["a"], "a")
    if a.ndim < 2:
        raise Unsupported("qr needs at least 2 dimensions")
    mode = ba.arguments.get("mode", "reduced")
    if mode not in ("reduced", "complete", "r"):
        raise Unsupported(f"mode={mode!r} is computed locally")
    dt = linalg_dtype(a.dtype)
    m, n = a.shape[-2:]
    k, batch = min(m, n), a.shape[:-2]
    flops = (4.0 * m * n * k - 4 / 3 * k**3) * math.prod(batch) * cfactor(dt)
    params = {"cdtype": dt.str, "mode": mode}
    layouts = qr_layouts(a, mode)
    if mode == "r":
        return Prepared(spec, [a], params, [(dt, batch + (k, n))], layouts, flops)
    mq = m if mode == "complete" else k
    return Prepared(spec, [a], params, [(dt, batch + (m, mq)), (dt, batch + (mq, n))], layouts, flops,
                    returns="QRResult")


def qr_layouts(a: ndarray, mode: str) -> list:
    """numpy.linalg.qr's R is ``triu`` of a copy of ``a`` kept in a's memory order (order 'K'), Q a
    gufunc's result: for a stack that is not C-contiguous neither need be C. NumPy's own qr on a
    stand-in of at most 3 elements per axis, with a's stride order and its rows-to-columns
    relation, says what they are (tens of microseconds, only for such stacks)."""
    count = 1 if mode == "r" else 2
    if a.ndim == 2 or a.flags.c_contiguous:
        return ["C"] * count
    from numpy.linalg import _linalg  # numpy.linalg.qr itself may be the shim's wrapper

    m, n = a.shape[-2:]
    core = (min(m, 3 if m > n else 2), min(n, 3 if n > m else 2))
    res = _linalg.qr(_tiny(a, core), mode=mode)
    return [layout_of(r) for r in ((res,) if mode == "r" else res)]


# --- numpy.fft -----------------------------------------------------------------------------------

NORMS = (None, "backward", "ortho", "forward")


def _fft_common(ba: inspect.BoundArguments, real_in: bool) -> tuple[ndarray, Any]:
    a = array_arg(ba.arguments["a"], "a")
    if real_in and a.dtype.kind == "c":
        raise Unsupported("complex input to a real transform")
    if a.dtype == np.dtype("f2"):
        raise Unsupported("float16 transforms are computed locally")
    norm = ba.arguments.get("norm")
    if norm not in NORMS:
        raise Unsupported(f"norm={norm!r} is not understood")
    return a, norm


def _fft_flops(shape: tuple, axes: list[int], sizes: list[int], real: bool) -> float:
    total = math.prod(shape)
    flops = sum(5.0 * total * math.log2(max(n, 2)) for n in sizes)
    return flops / 2 if real else flops


def _n_param(n: Any) -> int | None:
    if n is None:
        return None
    try:
        n = operator.index(n)
    except TypeError:
        raise Unsupported("n is not an int") from None
    if n < 1:
        raise Unsupported(f"invalid number of data points ({n})")
    return n


def rule_fft_1d(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """fft, ifft (complex to complex), rfft (real to complex), irfft (complex to real)."""
    kind = spec.attr
    a, norm = _fft_common(ba, real_in=kind == "rfft")
    axis = norm_axis(ba.arguments.get("axis", -1), a.ndim)
    n = _n_param(ba.arguments.get("n"))
    single = a.dtype in (np.dtype("f4"), np.dtype("c8"))
    cplx, real = np.dtype("c8" if single else "c16"), np.dtype("f4" if single else "f8")
    if kind == "rfft":
        cdtype, rdtype = real, cplx
        length = a.shape[axis] if n is None else n
        out_len = length // 2 + 1
    elif kind == "irfft":
        cdtype, rdtype = cplx, real
        length = 2 * (a.shape[axis] - 1) if n is None else n
        if length < 1:
            raise Unsupported(f"invalid number of data points ({length})")
        out_len = length
    else:
        cdtype = rdtype = cplx
        length = out_len = a.shape[axis] if n is None else n
    shape = a.shape[:axis] + (out_len,) + a.shape[axis + 1:]
    out = out_arg(ba.arguments.get("out"), rdtype, shape)
    flops = _fft_flops(shape, [axis], [length], real=kind != "fft" and kind != "ifft")
    params = {"cdtype": cdtype.str, "n": n, "axis": axis, "norm": norm}
    return Prepared(spec, [a], params, [(rdtype, shape)], [follow_layout(a)], flops, out)


def rule_fft_2d(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, norm = _fft_common(ba, real_in=False)
    axes = ba.arguments.get("axes", (-2, -1))
    if axes is None:
        raise Unsupported("axes=None is computed locally")
    try:
        axes = [norm_axis(x, a.ndim, "axes") for x in axes]
    except TypeError:
        raise Unsupported("axes is not a sequence") from None
    if len(set(axes)) != len(axes):
        raise Unsupported("repeated axes")
    s = ba.arguments.get("s")
    if s is not None:
        try:
            s = [_n_param(x) for x in s]
        except TypeError:
            raise Unsupported("s is not a sequence") from None
        if len(s) != len(axes) or any(x is None for x in s):
            raise Unsupported("s does not match axes")
    sizes = [a.shape[ax] for ax in axes] if s is None else s
    shape = list(a.shape)
    for ax, size in zip(axes, sizes):
        shape[ax] = size
    shape = tuple(shape)
    cdtype = np.dtype("c8" if a.dtype in (np.dtype("f4"), np.dtype("c8")) else "c16")
    out = out_arg(ba.arguments.get("out"), cdtype, shape)
    if out is not None and spec.attr == "ifft2":
        raise Unsupported("out= with ifft2: NumPy 2 ignores it and returns a new array")
    if out is not None and any(a.shape[ax] != size for ax, size in zip(axes[:-1], sizes[:-1])):
        # NumPy transforms one axis at a time into out: it raises unless only the last axis resizes
        raise Unsupported("out= with s= resizing an axis but the last: NumPy raises")
    flops = _fft_flops(shape, axes, sizes, real=False)
    params = {"cdtype": cdtype.str, "s": s, "axes": axes, "norm": norm}
    return Prepared(spec, [a], params, [(cdtype, shape)], [follow_layout(a)], flops, out)


# --- the table -------------------------------------------------------------------------------

FFT1 = ("n", "axis", "norm", "out")
CATALOG: tuple[OpSpec, ...] = (
    OpSpec("numpy.matmul", "numpy", "matmul", "products", rule_matmul, ("out",)),
    OpSpec("numpy.dot", "numpy", "dot", "products", rule_dot, ("out",)),
    OpSpec("numpy.tensordot", "numpy", "tensordot", "products", rule_tensordot, ("axes",)),
    OpSpec("numpy.einsum", "numpy", "einsum", "products", rule_einsum, ("out", "optimize")),
    OpSpec("numpy.linalg.solve", "numpy.linalg", "solve", "linalg", rule_solve),
    OpSpec("numpy.linalg.inv", "numpy.linalg", "inv", "linalg", rule_inv),
    OpSpec("numpy.linalg.svd", "numpy.linalg", "svd", "linalg", rule_svd,
           ("full_matrices", "compute_uv", "hermitian")),
    OpSpec("numpy.linalg.eigh", "numpy.linalg", "eigh", "linalg", rule_eigh, ("UPLO",)),
    OpSpec("numpy.linalg.cholesky", "numpy.linalg", "cholesky", "linalg", rule_cholesky, ("upper",)),
    OpSpec("numpy.linalg.qr", "numpy.linalg", "qr", "linalg", rule_qr, ("mode",)),
    OpSpec("numpy.fft.fft", "numpy.fft", "fft", "fft", rule_fft_1d, FFT1),
    OpSpec("numpy.fft.ifft", "numpy.fft", "ifft", "fft", rule_fft_1d, FFT1),
    OpSpec("numpy.fft.rfft", "numpy.fft", "rfft", "fft", rule_fft_1d, FFT1),
    OpSpec("numpy.fft.irfft", "numpy.fft", "irfft", "fft", rule_fft_1d, FFT1),
    OpSpec("numpy.fft.fft2", "numpy.fft", "fft2", "fft", rule_fft_2d, ("s", "axes", "norm", "out")),
    OpSpec("numpy.fft.ifft2", "numpy.fft", "ifft2", "fft", rule_fft_2d, ("s", "axes", "norm", "out")),
)
BY_NAME = {spec.name: spec for spec in CATALOG}

# The ndarray operators and method the C trampolines route here (issue 3; fusion_shim/intercept/
# native.py). Not patched by attribute: ``attr`` only names them. Their signatures are the ones the
# trampolines call with: ``a @ b`` is np.matmul, ``a.dot(b, out=None)`` is np.dot, ``a @= b`` is
# matmul into a. Indexed by the trampolines' kind: 0 ``@``, 1 ``@=``, 2 ``.dot``.
_P = inspect.Parameter
OPERATORS: tuple[OpSpec, ...] = (
    OpSpec("numpy.ndarray.__matmul__", "numpy", "ndarray.__matmul__", "products", rule_matmul, ("out",),
           kernel="matmul"),
    OpSpec("numpy.ndarray.__imatmul__", "numpy", "ndarray.__imatmul__", "products", rule_imatmul,
           kernel="matmul"),
    OpSpec("numpy.ndarray.dot", "numpy", "ndarray.dot", "products", rule_dot, ("out",), kernel="dot"),
)
OPERATOR_SIGNATURES: tuple[inspect.Signature, ...] = (
    inspect.Signature([_P("x1", _P.POSITIONAL_ONLY), _P("x2", _P.POSITIONAL_ONLY), _P("out", _P.KEYWORD_ONLY, default=None)]),
    inspect.Signature([_P("x1", _P.POSITIONAL_ONLY), _P("x2", _P.POSITIONAL_ONLY)]),
    inspect.Signature([_P("a", _P.POSITIONAL_OR_KEYWORD), _P("b", _P.POSITIONAL_OR_KEYWORD),
                       _P("out", _P.POSITIONAL_OR_KEYWORD, default=None)]),
)


def check_signature(spec: OpSpec, func: Callable) -> inspect.Signature:
    """The row must name parameters the real function has; a NumPy that changed them is caught
    at install, and the row is left unwrapped rather than misread."""
    sig = inspect.signature(func)
    names = set(sig.parameters)
    missing = [p for p in spec.params if p not in names]
    if missing:
        raise TypeError(f"{spec.name}: catalog parameters {missing} are not in the signature {sig}")
    return sig


def prepare(spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> Prepared:
    """Bind a call the way Python would and apply the row's rule; Unsupported says why not."""
    try:
        ba = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise Unsupported(f"arguments do not bind: {exc}") from None
    given = set(ba.arguments)
    arrays_and_known = set(spec.params) | {"a", "b", "x1", "x2", "operands", "kwargs"}
    unknown = sorted(given - arrays_and_known)
    if unknown:
        raise Unsupported(f"unsupported keyword {unknown[0]}")
    return spec.rule(spec, ba)

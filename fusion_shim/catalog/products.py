"""Rules for the product family: matmul, dot, vdot, inner, outer, kron, tensordot, einsum, NumPy 2's
matvec/vecmat/vecdot ufuncs, and the array-API spellings in numpy.linalg (matmul, outer, tensordot,
vecdot, cross, trace, multi_dot). Products compute in the operands' common dtype, as NumPy does.
"""
from __future__ import annotations

import inspect
import math
import operator
from typing import Any

import numpy as np

from .base import (
    OpSpec, Prepared, Unsupported, arg, array_arg, batch_of, cfactor, gufunc_layout, int_param, layout_of, native,
    ndarray, norm_axis, out_arg, perm_layout, PRODUCT_DTYPES, probe, product_dtype, tiny,
)


def rule_matmul(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
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


def rule_vecfunc(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """NumPy 2's gufuncs matvec (..., m, n)(..., n), vecmat (..., n)(..., n, m) and vecdot
    (..., n)(..., n); vecmat and vecdot conjugate the vector in the first operand."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    dt = product_dtype(a, b)
    kind = spec.attr
    cores = {"matvec": (2, 1, 1), "vecmat": (1, 2, 1), "vecdot": (1, 1, 0)}[kind]
    if a.ndim < cores[0] or b.ndim < cores[1]:
        raise Unsupported(f"{kind} needs more dimensions")
    axis = ba.arguments.get("axis")
    if axis is not None and kind == "vecdot":
        ax_a, ax_b = norm_axis(axis, a.ndim), norm_axis(axis, b.ndim)
        a_ = np.moveaxis(a, ax_a, -1)  # views: only for the shapes and the layout probe
        b_ = np.moveaxis(b, ax_b, -1)
    elif axis is not None:
        raise Unsupported(f"axis= with {kind} is computed locally")
    else:
        a_, b_, ax_a, ax_b = a, b, a.ndim - 1, b.ndim - 1
    if kind == "matvec":
        ok, core_shape, k = a_.shape[-1] == b_.shape[-1], a_.shape[-2:-1], a_.shape[-1]
    elif kind == "vecmat":
        ok, core_shape, k = a_.shape[-1] == b_.shape[-2], b_.shape[-1:], a_.shape[-1]
    else:
        ok, core_shape, k = a_.shape[-1] == b_.shape[-1], (), a_.shape[-1]
    if not ok:
        raise Unsupported(f"core dimensions do not match for {kind}")
    batch = batch_of(a_.shape[:a_.ndim - cores[0]], b_.shape[:b_.ndim - cores[1]])
    shape = batch + core_shape
    out = out_arg(ba.arguments.get("out"), dt, shape)
    if out is not None and kind == "vecmat" and dt.kind == "c" and not out.flags.c_contiguous:
        # NumPy 2.4's complex vecmat writes a wrong answer into any out= that is not C-contiguous;
        # the program gets exactly that without the shim, so it gets it with the shim too
        raise Unsupported("complex vecmat into a non-C-contiguous out=: left to NumPy (it computes it wrong)")
    flops = 2.0 * math.prod(shape) * k * cfactor(dt)
    layout = gufunc_layout([(a_, cores[0]), (b_, cores[1])], batch, cores[2])
    params = {"cdtype": dt.str, "kind": kind, "axes": [ax_a, ax_b]}
    return Prepared(spec, [a, b], params, [(dt, shape)], [layout], flops, out, scalar_0d=True)


def rule_dot(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
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
    """``a @= b``. NumPy computes ``matmul(a, b, out=a)`` with ``axes=`` that forbid
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


def rule_vdot(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """vdot flattens both operands in C order (whatever their layout) and conjugates the first."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if a.size != b.size:
        raise Unsupported("vdot: operands differ in size")
    dt = product_dtype(a, b)
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, ())], ["C"], 2.0 * a.size * cfactor(dt),
                    scalar_0d=True)


def rule_inner(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("0-d operand: inner is an element-wise multiply")
    if a.shape[-1] != b.shape[-1]:
        raise Unsupported("inner: last dimensions differ")
    dt = product_dtype(a, b)
    shape = a.shape[:-1] + b.shape[:-1]
    flops = 2.0 * math.prod(shape) * a.shape[-1] * cfactor(dt)
    return Prepared(spec, [a, b], {"cdtype": dt.str, "axes": [[a.ndim - 1], [b.ndim - 1]]}, [(dt, shape)], ["C"],
                    flops, scalar_0d=True)


def rule_outer(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """``multiply(a.ravel()[:, None], b.ravel()[None, :], out)``; numpy.linalg.outer takes 1-d only."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if spec.module == "numpy.linalg" and (a.ndim != 1 or b.ndim != 1):
        raise Unsupported("numpy.linalg.outer takes 1-d operands only (NumPy raises)")
    dt = product_dtype(a, b)
    shape = (a.size, b.size)
    out = out_arg(ba.arguments.get("out"), dt, shape)
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, shape)], ["C"], float(a.size * b.size) * cfactor(dt),
                    out)


def rule_kron(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("0-d operand: kron is an element-wise multiply")
    dt = product_dtype(a, b)
    nd = max(a.ndim, b.ndim)
    sa = (1,) * (nd - a.ndim) + a.shape
    sb = (1,) * (nd - b.ndim) + b.shape
    shape = tuple(x * y for x, y in zip(sa, sb))
    layout = probe(spec, [tiny(a), tiny(b)], {})[0]
    return Prepared(spec, [a, b], {"cdtype": dt.str}, [(dt, shape)], [layout], float(math.prod(shape)) * cfactor(dt))


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
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    dt = product_dtype(a, b)
    xa, xb = _tensordot_axes(ba.arguments.get("axes", 2), a, b)
    if len(xa) > a.ndim or len(xb) > b.ndim:
        raise Unsupported("more axes than dimensions")
    if any(a.shape[i] != b.shape[j] for i, j in zip(xa, xb)):
        raise Unsupported("shape-mismatch for sum")
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
        bare = term.replace("...", "")
        if term.count("...") > 1 or "." in bare or (bare and not bare.isalpha()):  # '' labels a 0-d operand
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


def _einsum_label(x: Any) -> str:
    """D261: a label of the interleaved form as NumPy's C parser spells it: 0-25 'A'-'Z', 26-51 'a'-'z'
    (so that the implicit output, sorted, keeps the integers' order), Ellipsis '...'."""
    if x is Ellipsis:
        return "..."
    s = int_param(x, "sublist label")
    if not 0 <= s < 52:
        raise Unsupported(f"sublist label {s} is out of range (NumPy raises)")
    return chr(ord("A") + s) if s < 26 else chr(ord("a") + s - 26)


def einsum_operands(operands: tuple) -> tuple[str, list]:
    """(subscripts, operands) of either form: ``einsum("ij,jk", a, b)`` or the interleaved
    ``einsum(a, [0, 1], b, [1, 2], [0, 2])``, rewritten as the equivalent subscripts string."""
    if not operands:
        raise Unsupported("einsum without operands (NumPy raises)")
    if isinstance(operands[0], str):
        return operands[0], list(operands[1:])
    pairs, rest = len(operands) // 2, operands[len(operands) // 2 * 2:]
    terms, arrays = [], []
    for i in range(pairs):
        sub = operands[2 * i + 1]
        if not isinstance(sub, (list, tuple)):
            raise Unsupported("an interleaved einsum's sublist is not a list (NumPy raises)")
        terms.append("".join(_einsum_label(x) for x in sub))
        arrays.append(operands[2 * i])
    subscripts = ",".join(terms)
    if rest:
        if not isinstance(rest[0], (list, tuple)):
            raise Unsupported("an interleaved einsum's output is not a list (NumPy raises)")
        subscripts += "->" + "".join(_einsum_label(x) for x in rest[0])
    return subscripts, arrays


EINSUM_CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def _einsum_dtype(ba: inspect.BoundArguments, arrays: list[ndarray]) -> tuple[np.dtype, dict]:
    """The dtype einsum computes in, and its ``dtype=``/``casting=`` as given: NumPy casts every
    operand to ``dtype`` (else their common type) under ``casting`` (default 'safe'), and raises
    where that cast is not allowed: such a call is left to it."""
    kwargs = ba.arguments.get("kwargs") or {}
    given = {k: kwargs[k] for k in ("dtype", "casting") if k in kwargs}
    casting = given.get("casting", "safe")
    if casting not in EINSUM_CASTINGS:
        raise Unsupported(f"casting={casting!r} is not understood (NumPy raises)")
    if given.get("dtype") is None:
        dt = product_dtype(*arrays)
    else:
        try:
            dt = np.dtype(given["dtype"])
        except TypeError:
            raise Unsupported(f"dtype={given['dtype']!r} is not a dtype (NumPy raises)") from None
        if not dt.isnative or dt not in PRODUCT_DTYPES:
            raise Unsupported(f"einsum dtype={dt} is computed locally")
    for i, a in enumerate(arrays):
        if not np.can_cast(a.dtype, dt, casting):
            raise Unsupported(f"operand {i} ({a.dtype}) cannot be cast to {dt} under casting={casting!r} "
                              "(NumPy raises)")
    return dt, given


def rule_einsum(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    subscripts, operands = einsum_operands(ba.arguments.get("operands", ()))
    arrays = [array_arg(x, f"operand {i}") for i, x in enumerate(operands)]
    if len(arrays) < 2:
        raise Unsupported("single-operand einsum returns a view")
    optimize = ba.arguments.get("optimize", False)
    dt, given = _einsum_dtype(ba, arrays)
    if given and optimize is not False and len({native(a.dtype) for a in arrays}) > 1:
        # NumPy's pairwise path hands dtype=/casting= to its einsum steps but not to its BLAS ones
        raise Unsupported("einsum with optimize and dtype= or casting= over operands of several dtypes")
    mixed = len({a.dtype.newbyteorder("=") for a in arrays}) > 1
    if len(arrays) > 2 and mixed and optimize is not False:
        # NumPy contracts pairwise there, each intermediate in its pair's dtype (f4 with f4 stays f4)
        raise Unsupported("einsum with optimize over operands of several dtypes: NumPy's intermediates "
                          "take each pair's dtype")
    _, rhs, sizes, ell = _einsum_parse(subscripts, arrays)
    head, _, tail = rhs.partition("...") if "..." in rhs else (rhs, "", "")
    shape = tuple(sizes[c] for c in head) + (ell if "..." in rhs else ()) + tuple(sizes[c] for c in tail)
    flops = 2.0 * math.prod(sizes.values()) * math.prod(ell) * cfactor(dt) * (len(arrays) - 1)
    out = out_arg(ba.arguments.get("out"), dt, shape)
    layout, scalar = spec_einsum_layout(subscripts, arrays, len(shape), optimize, given)
    full = subscripts if "->" in subscripts else subscripts + "->" + rhs
    return Prepared(spec, arrays, {"cdtype": dt.str, "subscripts": full}, [(dt, shape)], [layout], flops, out,
                    scalar_0d=scalar)


try:  # NumPy's C einsum: never patched, so the layout probe below cannot recurse into the shim
    from numpy._core.multiarray import c_einsum as _c_einsum
except ImportError:  # pragma: no cover - a NumPy that moved it: results come back in C order
    _c_einsum = None


def spec_einsum_layout(subscripts: str, arrays: list[ndarray], ndim: int, optimize: Any = False,
                       given: dict | None = None) -> tuple[Any, bool]:
    """NumPy's einsum lays its output out following its operands (order 'K'). Reproduce that by
    running NumPy's own einsum on tiny operands with the same stride order (a few microseconds).
    With ``optimize`` NumPy contracts pairwise, through BLAS (matmul) where it can, along a path
    chosen from the real sizes, and the layout follows from that path: it is computed here from the
    real operands (shapes only, as NumPy does) and replayed on the tiny ones. Also returns whether
    a 0-d result is a scalar: C einsum returns one, a last pairwise (BLAS) step a 0-d array."""
    if optimize is False and (ndim < 2 or _c_einsum is None):
        return "C", True
    small = [tiny(a) for a in arrays]
    try:
        if optimize is False:
            res = _c_einsum(subscripts, *small, **(given or {}))
        else:
            from numpy._core.einsumfunc import einsum, einsum_path  # NumPy's own, never the shim's

            path = optimize if isinstance(optimize, list) else einsum_path(subscripts, *arrays,
                                                                            optimize=optimize)[0]
            res = einsum(subscripts, *small, optimize=path, **(given or {}))
    except Exception:
        if optimize is False:
            return "C", True
        raise Unsupported(f"optimize={optimize!r} is not understood") from None
    scalar = not isinstance(res, ndarray)
    if ndim < 2 or scalar or res.ndim != ndim:
        return "C", scalar
    return layout_of(res), scalar


def rule_cross(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """numpy.linalg.cross: 3-vectors along ``axis`` of both operands; the result is
    ``moveaxis(cp, -1, axis)`` of a C-ordered ``cp`` (broadcast batch..., 3), as numpy.cross builds it."""
    a, b = arg(spec, ba, 0), arg(spec, ba, 1)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("0-d operand to cross")
    axis = int_param(ba.arguments.get("axis", -1), "axis")
    ax_a, ax_b = norm_axis(axis, a.ndim), norm_axis(axis, b.ndim)
    if a.shape[ax_a] != 3 or b.shape[ax_b] != 3:
        raise Unsupported("cross takes 3-vectors only (NumPy raises)")
    dt = native(np.promote_types(a.dtype, b.dtype))
    if dt not in (np.dtype(t) for t in ("i4", "i8", "f4", "f8", "c8", "c16")):
        raise Unsupported(f"dtype {dt} is not offloaded for cross")
    batch = batch_of(np.delete(a.shape, ax_a), np.delete(b.shape, ax_b))
    nd = len(batch) + 1
    axc = norm_axis(axis, nd)
    shape = batch[:axc] + (3,) + batch[axc:]
    order = [i for i in range(nd) if i != axc] + [axc]  # slowest to fastest: cp's axes, moved
    params = {"cdtype": dt.str, "axes": [ax_a, ax_b, axc]}
    return Prepared(spec, [a, b], params, [(dt, shape)], [perm_layout(order)], 9.0 * math.prod(batch))


def trace_dtype(dt: np.dtype) -> np.dtype:
    """``add.reduce``'s default: small integers and bools widen to int64, unsigned to uint64."""
    dt = native(dt)
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 8):
        return np.dtype("i8")
    if dt.kind == "u":
        return np.dtype("u8")
    return dt


TRACE_DTYPES = frozenset(np.dtype(t) for t in ("i8", "f4", "f8", "c8", "c16"))


def rule_trace(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    a = arg(spec, ba, 0)
    if a.ndim < 2:
        raise Unsupported("trace needs at least 2 dimensions (NumPy raises)")
    offset = int_param(ba.arguments.get("offset", 0), "offset")
    dtype = ba.arguments.get("dtype")
    rdt = trace_dtype(a.dtype) if dtype is None else np.dtype(dtype)
    if rdt not in TRACE_DTYPES or a.dtype.kind not in "biufc" or (a.dtype.kind == "c" and rdt.kind != "c"):
        raise Unsupported(f"trace to dtype {rdt} is computed locally")
    batch = a.shape[:-2]
    layout = probe(spec, [tiny(a)], {"offset": offset})[0] if len(batch) >= 2 else "C"
    params = {"cdtype": native(a.dtype).str, "offset": offset, "rdtype": rdt.str}
    flops = float(math.prod(batch) * min(a.shape[-2:]))
    return Prepared(spec, [a], params, [(rdt, batch)], [layout], flops, scalar_0d=True)


def rule_multi_dot(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    arrays = ba.arguments["arrays"]
    if not isinstance(arrays, (list, tuple)):
        raise Unsupported("arrays is not a list or tuple")
    arrays = [array_arg(x, f"arrays[{i}]") for i, x in enumerate(arrays)]
    n = len(arrays)
    if n < 3:
        raise Unsupported("multi_dot of fewer than 3 arrays is one dot")  # NumPy: dot(a, b, out=out)
    if any(x.ndim != 2 for x in arrays[1:-1]) or arrays[0].ndim not in (1, 2) or arrays[-1].ndim not in (1, 2):
        raise Unsupported("multi_dot takes 2-d arrays (the first and last may be 1-d)")
    if any(arrays[i].shape[-1] != arrays[i + 1].shape[0] for i in range(n - 1)):
        raise Unsupported("shapes not aligned for multi_dot")
    dt = product_dtype(*arrays)
    if dt.kind == "i" and len({native(x.dtype) for x in arrays}) > 1:
        # NumPy multiplies pairwise, each product in its operands' dtype: mixed integer widths
        # would wrap at different widths than one product in the widest
        raise Unsupported("multi_dot of mixed integer dtypes is computed locally")
    first = arrays[0].shape[0] if arrays[0].ndim == 2 else None
    last = arrays[-1].shape[1] if arrays[-1].ndim == 2 else None
    shape = tuple(d for d in (first, last) if d is not None)
    out = ba.arguments.get("out")
    if out is not None and len(shape) != 2:
        raise Unsupported("out= with a 1-d first or last array is left to NumPy")
    out = out_arg(out, dt, shape, need_c=True)
    p = [first or 1] + [x.shape[-1] for x in arrays[:-1]] + [last or 1]
    flops = 2.0 * sum(p[0] * p[i] * p[i + 1] for i in range(1, n)) * cfactor(dt)
    return Prepared(spec, arrays, {"cdtype": dt.str}, [(dt, shape)], ["C"], flops, out, scalar_0d=True)

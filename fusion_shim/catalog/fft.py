"""Rules for numpy.fft: the 1-d transforms (fft, ifft, rfft, irfft, hfft, ihfft) and the n-d ones
(fft2, ifft2, fftn, ifftn, rfft2, irfft2, rfftn, irfftn), with ``n``/``s``, ``axis``/``axes``,
``norm`` and ``out=`` as NumPy 2 treats them (``numpy/fft/_pocketfft.py``). Single precision
stays single (pocketfft and torch both transform float32 in float32); integers transform in double.
Results follow the input's memory order (``empty_like``, order 'K') step after step.
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from .base import (
    C8, C16, F4, F8, OpSpec, Prepared, Unsupported, arg, follow_layout, int_param, native, ndarray, norm_axis,
    out_arg,
)

NORMS = (None, "backward", "ortho", "forward")


def fft_types(a: ndarray, real_in: bool) -> tuple[np.dtype, np.dtype]:
    """(real, complex) dtypes of a transform of ``a``: single for float32/complex64, else double."""
    dt = native(a.dtype)
    if real_in and dt.kind == "c":
        raise Unsupported("complex input to a real transform (NumPy raises)")
    if dt.kind in "fc" and dt not in (F4, F8, C8, C16):
        raise Unsupported(f"{dt} transforms are computed locally")
    single = dt in (F4, C8)
    return (F4, C8) if single else (F8, C16)


def norm_param(ba: inspect.BoundArguments) -> Any:
    norm = ba.arguments.get("norm")
    if norm not in NORMS:
        raise Unsupported(f"norm={norm!r} is not understood (NumPy raises)")
    return norm


def _n(n: Any) -> int:
    n = int_param(n, "n")
    if n < 1:
        raise Unsupported(f"invalid number of data points ({n}) (NumPy raises)")
    return n


def _flops(shape: tuple, sizes: list[int], real: bool) -> float:
    total = math.prod(shape)
    flops = sum(5.0 * total * math.log2(max(n, 2)) for n in sizes)
    return flops / 2 if real else flops


def rule_fft_1d(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """fft, ifft (complex to complex), rfft, ihfft (real to complex), irfft, hfft (complex to real)."""
    kind = spec.attr
    a = arg(spec, ba, 0)
    real_t, cplx_t = fft_types(a, real_in=kind in ("rfft", "ihfft"))
    norm = norm_param(ba)
    axis = norm_axis(ba.arguments.get("axis", -1), a.ndim)
    n = ba.arguments.get("n")
    m = a.shape[axis]
    if kind in ("irfft", "hfft"):
        length = _n(2 * (m - 1) if n is None else n)
        out_len, cdtype, rdtype = length, cplx_t, real_t
    elif kind in ("rfft", "ihfft"):
        length = _n(m if n is None else n)
        out_len, cdtype, rdtype = length // 2 + 1, real_t, cplx_t
    else:
        length = out_len = _n(m if n is None else n)
        cdtype = rdtype = cplx_t
    shape = a.shape[:axis] + (out_len,) + a.shape[axis + 1:]
    out = ba.arguments.get("out")
    if out is not None and kind == "hfft":
        raise Unsupported("out= with hfft: NumPy ignores it and returns a new array")
    out = out_arg(out, rdtype, shape)
    flops = _flops(shape, [length], real=kind not in ("fft", "ifft"))
    params = {"cdtype": cdtype.str, "n": length, "axis": axis, "norm": norm, "kind": kind}
    return Prepared(spec, [a], params, [(rdtype, shape)], [follow_layout(a)], flops, out)


def cook_nd(a: ndarray, s: Any, axes: Any, invreal: bool) -> tuple[list[int], list[int]]:
    """NumPy's ``_cook_nd_args`` with every case that warns or raises left to NumPy."""
    if s is None:
        if axes is None:
            sizes: list = list(a.shape)
            axes = list(range(-len(sizes), 0))
        else:
            try:
                axes = list(axes)
            except TypeError:
                raise Unsupported("axes is not a sequence") from None
            sizes = [a.shape[norm_axis(x, a.ndim, "axes")] for x in axes]
    else:
        if axes is None:
            raise Unsupported("s= without axes= (NumPy warns: deprecated)")
        try:
            sizes, axes = list(s), list(axes)
        except TypeError:
            raise Unsupported("s or axes is not a sequence") from None
        if any(x is None for x in sizes):
            raise Unsupported("None in s= (NumPy warns: deprecated)")
    if len(sizes) != len(axes):
        raise Unsupported("s and axes have different lengths (NumPy raises)")
    if not axes:
        raise Unsupported("no axes to transform")
    axes = [norm_axis(x, a.ndim, "axes") for x in axes]
    if len(set(axes)) != len(axes):
        raise Unsupported("repeated axes: NumPy transforms them twice")
    if invreal and s is None:
        sizes[-1] = (a.shape[axes[-1]] - 1) * 2
    sizes = [a.shape[ax] if int_param(x, "s") == -1 else int_param(x, "s") for x, ax in zip(sizes, axes)]
    for x in sizes:
        _n(x)
    return sizes, axes


def rule_fft_nd(spec: OpSpec, ba: inspect.BoundArguments) -> Prepared:
    """fft2, ifft2, fftn, ifftn (complex), rfft2, rfftn (real in), irfft2, irfftn (real out)."""
    kind = spec.attr.rstrip("2n")  # "fft", "ifft", "rfft", "irfft"
    a = arg(spec, ba, 0)
    real_t, cplx_t = fft_types(a, real_in=kind == "rfft")
    norm = norm_param(ba)
    default_axes = (-2, -1) if spec.attr.endswith("2") else None
    sizes, axes = cook_nd(a, ba.arguments.get("s"), ba.arguments.get("axes", default_axes), kind == "irfft")
    shape = list(a.shape)
    for ax, size in zip(axes, sizes):
        shape[ax] = size
    if kind == "rfft":
        shape[axes[-1]] = sizes[-1] // 2 + 1
    shape = tuple(shape)
    cdtype, rdtype = {"fft": (cplx_t, cplx_t), "ifft": (cplx_t, cplx_t), "rfft": (real_t, cplx_t),
                      "irfft": (cplx_t, real_t)}[kind]
    out = ba.arguments.get("out")
    if out is not None:
        if spec.attr in ("ifft2", "irfft2"):
            raise Unsupported(f"out= with {spec.attr}: NumPy 2 ignores it and returns a new array")
        if kind != "irfft" and any(a.shape[ax] != size for ax, size in zip(axes[:-1], sizes[:-1])):
            # NumPy transforms one axis at a time into out: it raises unless only the last axis resizes
            raise Unsupported("out= with s= resizing an axis but the last: NumPy raises")
    out = out_arg(out, rdtype, shape)
    flops = _flops(shape, sizes, real=kind in ("rfft", "irfft"))
    params = {"cdtype": cdtype.str, "s": sizes, "axes": axes, "norm": norm, "kind": kind}
    return Prepared(spec, [a], params, [(rdtype, shape)], [follow_layout(a)], flops, out)

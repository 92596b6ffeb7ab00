"""Shared by the differential suites (tests/catalog/test_differential.py, tests/catalog/test_hypothesis.py):
inputs in every memory layout, NumPy's original functions, and comparisons in the style of CuPy's
``numpy_cupy_allclose`` (same type, dtype, shape, layout; values within a dtype-aware tolerance)."""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from fusion_shim.catalog import BY_NAME
from fusion_shim.catalog.base import unwrap


def original(fn: Any) -> Any:
    """The library's own function behind the shim's wrapt.FunctionWrapper (the function itself if
    unwrapped; SciPy's and NumPy's own ``__wrapped__`` are left alone)."""
    return unwrap(fn)


def op(name: str) -> Any:
    """The catalog row's public attribute as the program sees it now (the shim's wrapper when installed)."""
    spec = BY_NAME[name]
    return getattr(importlib.import_module(spec.module), spec.attr)


def values(shape: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return rng.integers(-4, 5, size=shape).astype(dt)
    x = rng.standard_normal(shape)
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dt)


def lay_out(x: np.ndarray, layout: str) -> np.ndarray:
    """The same values in the given memory layout."""
    if layout == "C":
        return np.ascontiguousarray(x)
    if layout == "F":
        return np.asfortranarray(x)
    if layout == "strided":  # every other element of the last two axes of a bigger array
        axes = min(x.ndim, 2)
        big = np.zeros(x.shape[:x.ndim - axes] + tuple(2 * d for d in x.shape[x.ndim - axes:]), x.dtype)
        view = big[(Ellipsis,) + (slice(None, None, 2),) * axes]
        view[...] = x
        assert not view.flags.c_contiguous and not view.flags.f_contiguous
        return view
    if layout == "negstride":  # the first axis longer than 1 walked backwards
        ax = next(i for i, d in enumerate(x.shape) if d > 1)
        rev = (slice(None),) * ax + (slice(None, None, -1),)
        view = np.ascontiguousarray(x[rev])[rev]
        assert view.strides[ax] < 0
        return view
    if layout == "permuted":  # dense, the first axis varying fastest: neither C nor F from 3-d on
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 0, -1)), -1, 0)
    if layout == "byteswap":  # the same values in the other byte order
        return np.ascontiguousarray(x).astype(x.dtype.newbyteorder())
    if layout == "unaligned":  # C order one byte into a buffer: not aligned to the element size
        buf = np.zeros(x.nbytes + 1, np.uint8)
        view = buf[1:].view(x.dtype).reshape(x.shape)
        view[...] = x
        assert x.dtype.itemsize == 1 or x.size == 0 or not view.flags.aligned
        return view
    raise AssertionError(layout)


def rtol_for(dtype: np.dtype, size: int) -> float:
    """Relative tolerance (of the result's magnitude) for a problem with an inner dimension ``size``."""
    scale = max(1.0, size / 8)
    if dtype.kind in "iub":
        return 0.0
    if dtype in (np.dtype("f4"), np.dtype("c8")):
        return 1e-4 * scale
    return 1e-10 * scale


def outcome(call: Any) -> tuple[Any, BaseException | None]:
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - whatever the library raises, the shim must raise too
        return None, exc


def assert_meta(got: Any, exp: Any, what: str = "result") -> None:
    """Same type, dtype, shape, layout and writeability as NumPy's result."""
    assert type(got) is type(exp), f"{what}: type {type(got).__name__}, NumPy gives {type(exp).__name__}"
    if isinstance(exp, (tuple, list)):
        assert len(got) == len(exp)
        for i, (g, e) in enumerate(zip(got, exp)):
            assert_meta(g, e, f"{what}[{i}]")
        return
    assert got.dtype == exp.dtype, f"{what}: dtype {got.dtype}, NumPy gives {exp.dtype}"
    assert np.shape(got) == np.shape(exp), f"{what}: shape {np.shape(got)}, NumPy gives {np.shape(exp)}"
    if isinstance(exp, np.ndarray):
        flags = lambda a: (a.flags.c_contiguous, a.flags.f_contiguous)  # noqa: E731
        assert flags(got) == flags(exp), (
            f"{what}: (C, F) contiguous {flags(got)}, NumPy gives {flags(exp)} "
            f"(strides {got.strides} vs {exp.strides})")
        if not any(flags(exp)):
            assert got.strides == exp.strides, f"{what}: strides {got.strides}, NumPy gives {exp.strides}"
        assert got.flags.writeable == exp.flags.writeable, f"{what}: writeable differs"


def assert_close(got: Any, exp: Any, size: int, what: str = "values", ref: Any = None) -> None:
    """Values within the dtype's tolerance, relative to the largest magnitude of ``ref`` (the
    expected values by default); integers exactly."""
    exp = np.asarray(exp)
    got = np.asarray(got)
    if exp.dtype.kind in "iub":
        np.testing.assert_array_equal(got, exp, err_msg=what)
        return
    rtol = rtol_for(exp.dtype, size)
    ref = exp if ref is None else np.asarray(ref)
    mag = float(np.max(np.abs(ref))) if ref.size else 1.0
    np.testing.assert_allclose(got, exp, rtol=rtol, atol=rtol * max(mag, 1e-30), err_msg=what)


def herm(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a.conj(), -1, -2)


def eye_like(n: int, dtype: np.dtype, batch: tuple = ()) -> np.ndarray:
    return np.broadcast_to(np.eye(n, dtype=dtype), batch + (n, n))


def effective_input(a: np.ndarray, dtype: np.dtype, uplo: str | None = None) -> np.ndarray:
    """The matrix a linalg routine actually factors: cast to the result dtype; for eigh/cholesky
    the Hermitian matrix formed from the one triangle LAPACK reads."""
    a = np.array(a, dtype=dtype)
    if uplo is None:
        return a
    n = a.shape[-1]
    keep = np.tril(np.ones((n, n), bool)) if uplo == "L" else np.triu(np.ones((n, n), bool))
    tri = np.where(keep, a, 0)
    full = tri + herm(tri)
    idx = np.arange(n)
    full[..., idx, idx] = a[..., idx, idx].real
    return full




# --- checks: values, or the invariants of decompositions defined up to signs and phases -----------

def _eps_of(dt: np.dtype) -> float:
    return float(np.finfo(dt).eps) if dt.kind in "fc" else 0.0


def check_result(check: str, size: int, a_args: tuple, kwargs: dict, got: Any, exp: Any) -> None:
    """``got`` (the shim's) against ``exp`` (the library's): same type, dtype, shape and layout
    (``assert_meta``), then values, or for a decomposition its invariants (reconstruction,
    orthogonality, ordering) and the parts that are unique (singular values, eigenvalues)."""
    assert_meta(got, exp)
    CHECKS[check](size, a_args, kwargs, got, exp)


def _values(size, a_args, kwargs, got, exp):
    if isinstance(exp, (tuple, list)):
        for g, e in zip(got, exp):
            assert_close(g, e, size)
    else:
        assert_close(got, exp, size)


def _svd(size, a_args, kwargs, got, exp):
    if not kwargs.get("compute_uv", True):
        assert_close(got, exp, size, "singular values")
        return
    u, s, vh = got
    assert_close(s, exp[1], size, "singular values")
    assert np.all(np.diff(s, axis=-1) <= 0), "singular values are not descending"
    k = s.shape[-1]
    a = a_args[0]
    aa = effective_input(a, u.dtype, "L" if kwargs.get("hermitian") else None)
    assert_close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], aa, size, "U S Vh = A", ref=aa)
    assert_close(herm(u) @ u, eye_like(u.shape[-1], u.dtype, u.shape[:-2]), size, "U unitary")
    assert_close(vh @ herm(vh), eye_like(vh.shape[-2], vh.dtype, vh.shape[:-2]), size, "Vh unitary")


def _eigh(size, a_args, kwargs, got, exp, uplo=None):
    uplo = uplo or str(kwargs.get("UPLO", "L")).upper()
    if not isinstance(got, (tuple, list)):  # eigenvalues only
        assert_close(got, exp, size, "eigenvalues")
        assert np.all(np.diff(got, axis=-1) >= 0), "eigenvalues are not ascending"
        return
    w, v = got
    assert_close(w, exp[0], size, "eigenvalues", ref=exp[0])
    assert np.all(np.diff(w, axis=-1) >= 0), "eigenvalues are not ascending"
    aa = effective_input(a_args[0], v.dtype, uplo)
    assert_close((v * w[..., None, :]) @ herm(v), aa, size, "V diag(w) V^H = A", ref=aa)
    assert_close(herm(v) @ v, eye_like(v.shape[-1], v.dtype, v.shape[:-2]), size, "V unitary")


def _s_eigh(size, a_args, kwargs, got, exp):
    _eigh(size, a_args, kwargs, got, exp, uplo="L" if kwargs.get("lower", True) else "U")


def _spectrum_close(got: np.ndarray, exp: np.ndarray, size: int, scale: float) -> None:
    """Eigenvalues of a non-normal matrix as multisets: matched greedily, within a tolerance that
    allows for their sensitivity (a defective eigenvalue moves by sqrt(eps))."""
    eps = _eps_of(np.result_type(got.dtype, np.float32)) if got.dtype.kind in "fc" else 0
    tol = max(rtol_for(np.dtype(got.dtype), size), 30 * np.sqrt(max(eps, 1e-16)) if eps < 1e-10 else 3e-2) * max(
        scale, 1e-30)
    g, e = got.reshape(-1, got.shape[-1]), exp.reshape(-1, exp.shape[-1])
    for gv, ev in zip(g, e):
        left = list(ev)
        for x in gv:
            d = [abs(x - y) for y in left]
            j = int(np.argmin(d))
            assert d[j] <= tol, f"eigenvalue {x} is {d[j]} from NumPy's nearest (tol {tol}); NumPy: {ev}"
            left.pop(j)


def _eig(size, a_args, kwargs, got, exp):
    a = np.asarray(a_args[0])
    vectors = isinstance(got, (tuple, list))
    w = got[0] if vectors else got
    ew = exp[0] if vectors else exp
    scale = float(np.max(np.abs(a))) * a.shape[-1] if a.size else 1.0
    _spectrum_close(w, ew, size, scale)
    if not vectors:
        return
    v = got[1]
    aa = effective_input(a, np.result_type(v.dtype, a.dtype))
    assert_close(aa @ v, v * w[..., None, :], size, "A V = V diag(w)", ref=scale)
    assert_close(np.linalg.norm(v, axis=-2), np.ones(v.shape[:-2] + v.shape[-1:], v.real.dtype), size, "|v| = 1")


def _det(size, a_args, kwargs, got, exp):
    """Relative to Hadamard's bound (the product of the column norms): rounding in an LU moves a
    determinant by about eps times that, whatever the determinant itself."""
    a = effective_input(a_args[0], np.result_type(a_args[0].dtype, np.float64))
    bound = np.prod(np.linalg.norm(a, axis=-2), axis=-1)
    tol = rtol_for(np.asarray(exp).dtype, size) * (bound + 1e-300)
    if isinstance(exp, (tuple, list)):  # slogdet
        gs, gl = got
        es, el = exp
        assert np.array_equal(np.asarray(gs) == 0, np.asarray(es) == 0), f"sign {gs} vs {es}"
        both = np.asarray(es) != 0
        gd = np.where(both, np.asarray(gs) * np.exp(np.where(both, gl, 0) - np.log(bound + 1e-300)), 0)
        ed = np.where(both, np.asarray(es) * np.exp(np.where(both, el, 0) - np.log(bound + 1e-300)), 0)
        np.testing.assert_allclose(gd, ed, atol=rtol_for(np.asarray(el).dtype, size) * 4, rtol=0,
                                   err_msg="sign * exp(logabsdet) / bound")
        return
    assert np.all(np.abs(np.asarray(got) - np.asarray(exp)) <= tol), f"det {got} vs {exp} (tol {tol})"


def _lstsq(size, a_args, kwargs, got, exp):
    x, res, rank, s = got
    assert rank == exp[2] and type(rank) is type(exp[2]), f"rank {rank!r}, NumPy {exp[2]!r}"
    assert_close(s, exp[3], size, "singular values")
    assert_close(x, exp[0], size * 4, "solution")
    b = np.asarray(a_args[1])
    assert_close(res, exp[1], size * 4, "residuals", ref=np.sum(np.abs(b) ** 2) if b.size else 1)


def _rank(size, a_args, kwargs, got, exp):
    np.testing.assert_array_equal(got, exp)


def _cond(size, a_args, kwargs, got, exp):
    """A condition number c carries a relative error of about eps * c."""
    e = np.asarray(exp, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    assert np.array_equal(np.isinf(g), np.isinf(e)), f"cond {got} vs {exp}"
    fin = np.isfinite(e)
    dt = np.asarray(exp).dtype
    tol = (rtol_for(dt, size) + 16 * size * _eps_of(dt) * e[fin]) * e[fin]
    assert np.all(np.abs(g[fin] - e[fin]) <= tol), f"cond {got} vs {exp}"


def _cholesky(size, a_args, kwargs, got, exp, upper=None):
    upper = kwargs.get("upper", False) if upper is None else upper
    assert_close(got, exp, size, "factor (unique for HPD input)")
    tri = np.triu(got) if upper else np.tril(got)
    np.testing.assert_array_equal(got, tri, err_msg="factor is not triangular")
    aa = effective_input(a_args[0], got.dtype, "U" if upper else "L")
    prod = herm(got) @ got if upper else got @ herm(got)
    assert_close(prod, aa, size, "L L^H = A", ref=aa)


def _s_cholesky(size, a_args, kwargs, got, exp):
    _cholesky(size, a_args, kwargs, got, exp, upper=not kwargs.get("lower", False))


def _qr(size, a_args, kwargs, got, exp):
    mode = kwargs.get("mode", "reduced")
    if mode == "raw":  # LAPACK's Householder form: deterministic up to rounding
        assert_close(got[0], exp[0], size, "h")
        assert_close(got[1], exp[1], size, "tau", ref=2.0)
        return
    scipy_r = mode == "r" and isinstance(got, (tuple, list))
    if mode in ("r",):
        r, er = (got[0], exp[0]) if scipy_r else (got, exp)
    else:
        r, er = got[1], exp[1]
    np.testing.assert_array_equal(r, np.triu(r), err_msg="R is not upper triangular")
    aa = effective_input(a_args[0], r.dtype)
    k = min(r.shape[-2:])
    if mode == "r":  # R is defined up to row phases: R^H R = A^H A
        gram = herm(aa) @ aa
        assert_close(herm(r) @ r, gram, size, "R^H R = A^H A", ref=gram)
    else:
        q = got[0]
        assert_close(q @ r, aa, size, "Q R = A", ref=aa)
        assert_close(herm(q) @ q, eye_like(q.shape[-1], q.dtype, q.shape[:-2]), size, "Q unitary")
    # |R_kk| is unique up to the first roundoff-level one (a rank deficiency): past it, an unpivoted
    # QR's later steps depend on the rounding that decided the zero column's reflector
    gd, ed = np.abs(np.diagonal(r, 0, -2, -1))[..., :k], np.abs(np.diagonal(er, 0, -2, -1))[..., :k]
    scale = float(np.max(np.abs(er))) if er.size else 0.0
    tiny_k = np.abs(ed) <= 1e3 * _eps_of(er.dtype) * max(scale, 1e-300)
    unique = np.cumsum(tiny_k, axis=-1) == 0
    assert_close(np.where(unique, gd, 0), np.where(unique, ed, 0), size, "|diag R|", ref=er)


def _lu(size, a_args, kwargs, got, exp):
    """P L U = A, with LAPACK's row interchanges (0-based) and a unit lower L."""
    lu, piv = got
    a = np.asarray(a_args[0], dtype=lu.dtype)
    m, n = a.shape[-2:]
    k = min(m, n)
    assert piv.dtype == np.int32 and piv.min() >= 0 and piv.max() < m
    perm = np.arange(m)
    for i, p in enumerate(piv):
        perm[i], perm[p] = perm[p], perm[i]
    low = np.tril(lu[:, :k], -1) + np.eye(m, k, dtype=lu.dtype)
    up = np.triu(lu[:k, :])
    assert_close(low @ up, a[perm], size, "P L U = A", ref=a)


def _expm(size, a_args, kwargs, got, exp):
    a = np.asarray(a_args[0])
    norm = float(np.max(np.sum(np.abs(a), axis=-2))) if a.size else 0.0
    assert_close(got, exp, int(size * (1 + norm) ** 2), "expm")


CHECKS = {"values": _values, "svd": _svd, "eigh": _eigh, "s_eigh": _s_eigh, "eig": _eig, "det": _det,
          "lstsq": _lstsq, "rank": _rank, "cond": _cond, "cholesky": _cholesky, "s_cholesky": _s_cholesky,
          "qr": _qr, "lu": _lu, "expm": _expm}

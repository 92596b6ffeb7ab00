"""The catalog's rows, as data: one :class:`~.spec.OpSpec` per intercepted function, by family.

A row names its rule as ``"module.function"`` of this package (loaded on the row's first use,
D116), so that NumPy's import loads this table and not the rules. The family modules
(:mod:`.products`, :mod:`.linalg`, :mod:`.fft`, :mod:`.scipy`, :mod:`.numba`) hold the rules.
"""
from __future__ import annotations

import inspect

from .spec import OpSpec


# --- products -------------------------------------------------------------------------------------

X12 = ("x1", "x2")
UFUNC_KW = ("out",)
# D45: a products rule reads only dtypes, shapes, strides and plain arguments: its calls may repeat from a template
P = "products"
PRODUCTS: tuple[OpSpec, ...] = (
    OpSpec("numpy.matmul", "numpy", "matmul", P, "products.rule_matmul", UFUNC_KW, args=X12, repeat=True,
           result_size="sizes.matmul"),
    OpSpec("numpy.dot", "numpy", "dot", P, "products.rule_dot", ("out",), repeat=True, result_size="sizes.dot"),
    OpSpec("numpy.vdot", "numpy", "vdot", P, "products.rule_vdot", repeat=True),
    OpSpec("numpy.inner", "numpy", "inner", P, "products.rule_inner", kernel="tensordot", repeat=True,
           result_size="sizes.tensordot"),
    OpSpec("numpy.outer", "numpy", "outer", P, "products.rule_outer", ("out",), repeat=True,
           result_size="sizes.outer"),
    # kron has as many elements as outer: the product of its operands' sizes
    OpSpec("numpy.kron", "numpy", "kron", P, "products.rule_kron", repeat=True, result_size="sizes.outer"),
    OpSpec("numpy.tensordot", "numpy", "tensordot", P, "products.rule_tensordot", ("axes",), repeat=True,
           result_size="sizes.tensordot"),
    OpSpec("numpy.einsum", "numpy", "einsum", P, "products.rule_einsum",
           ("out", "optimize"), args=("operands",), keywords=("dtype", "casting"), repeat=True,
           result_size="sizes.einsum"),
    OpSpec("numpy.matvec", "numpy", "matvec", P, "products.rule_vecfunc",
           UFUNC_KW, kernel="vecfunc", args=X12, repeat=True, result_size="sizes.vecfunc"),
    OpSpec("numpy.vecmat", "numpy", "vecmat", P, "products.rule_vecfunc",
           UFUNC_KW, kernel="vecfunc", args=X12, repeat=True, result_size="sizes.vecfunc"),
    OpSpec("numpy.vecdot", "numpy", "vecdot", P, "products.rule_vecfunc", ("out", "axis"), kernel="vecfunc",
           args=X12, repeat=True, result_size="sizes.vecfunc"),
    OpSpec("numpy.linalg.matmul", "numpy.linalg", "matmul", P, "products.rule_matmul",
           kernel="matmul", args=X12, repeat=True, result_size="sizes.matmul"),
    OpSpec("numpy.linalg.outer", "numpy.linalg", "outer", P, "products.rule_outer", kernel="outer", args=X12,
           repeat=True, result_size="sizes.outer"),
    OpSpec("numpy.linalg.tensordot", "numpy.linalg", "tensordot", P, "products.rule_tensordot", ("axes",),
           kernel="tensordot", args=X12, repeat=True, result_size="sizes.tensordot"),
    OpSpec("numpy.linalg.vecdot", "numpy.linalg", "vecdot", P, "products.rule_vecfunc", ("axis",),
           kernel="vecfunc", args=X12, repeat=True, result_size="sizes.vecfunc"),
    OpSpec("numpy.linalg.cross", "numpy.linalg", "cross", P, "products.rule_cross", ("axis",), args=X12,
           repeat=True, result_size="sizes.cross"),
    OpSpec("numpy.linalg.trace", "numpy.linalg", "trace", P, "products.rule_trace", ("offset", "dtype"),
           args=("x",), repeat=True),
    OpSpec("numpy.linalg.multi_dot", "numpy.linalg", "multi_dot", P, "products.rule_multi_dot", ("out",),
           args=("arrays",), nested=True, repeat=True, result_size="sizes.multi_dot"),
)

# The ndarray operators and method the C trampolines route here (fusion_shim/intercept/native.py).
# Not patched by attribute: ``attr`` only names them. Their signatures are the ones the trampolines
# call with: ``a @ b`` is np.matmul, ``a.dot(b, out=None)`` is np.dot, ``a @= b`` is matmul into a.
# Indexed by the trampolines' kind: 0 ``@``, 1 ``@=``, 2 ``.dot``.
_P = inspect.Parameter
OPERATORS: tuple[OpSpec, ...] = (
    OpSpec("numpy.ndarray.__matmul__", "numpy", "ndarray.__matmul__", P, "products.rule_matmul", ("out",),
           kernel="matmul", args=X12, repeat=True, result_size="sizes.matmul"),
    OpSpec("numpy.ndarray.__imatmul__", "numpy", "ndarray.__imatmul__", P, "products.rule_imatmul",
           kernel="matmul", args=X12, repeat=True, result_size="sizes.matmul"),
    OpSpec("numpy.ndarray.dot", "numpy", "ndarray.dot", P, "products.rule_dot", ("out",), kernel="dot",
           repeat=True, result_size="sizes.dot"),
)
OPERATOR_SIGNATURES: tuple[inspect.Signature, ...] = (
    inspect.Signature([_P("x1", _P.POSITIONAL_ONLY), _P("x2", _P.POSITIONAL_ONLY),
                       _P("out", _P.KEYWORD_ONLY, default=None)]),
    inspect.Signature([_P("x1", _P.POSITIONAL_ONLY), _P("x2", _P.POSITIONAL_ONLY)]),
    inspect.Signature([_P("a", _P.POSITIONAL_OR_KEYWORD), _P("b", _P.POSITIONAL_OR_KEYWORD),
                       _P("out", _P.POSITIONAL_OR_KEYWORD, default=None)]),
)


# --- linalg ----------------------------------------------------------------------------------------

L = "numpy.linalg"
A = ("a",)
LINALG: tuple[OpSpec, ...] = (
    OpSpec("numpy.linalg.solve", L, "solve", "linalg", "linalg.rule_solve"),
    OpSpec("numpy.linalg.inv", L, "inv", "linalg", "linalg.rule_inv", args=A),
    OpSpec("numpy.linalg.pinv", L, "pinv", "linalg", "linalg.rule_pinv", ("rcond", "hermitian", "rtol"), args=A),
    OpSpec("numpy.linalg.tensorsolve", L, "tensorsolve", "linalg", "linalg.rule_tensorsolve", ("axes",)),
    OpSpec("numpy.linalg.tensorinv", L, "tensorinv", "linalg", "linalg.rule_tensorinv", ("ind",), args=A),
    OpSpec("numpy.linalg.lstsq", L, "lstsq", "linalg", "linalg.rule_lstsq", ("rcond",), result_size="sizes.lstsq"),
    OpSpec("numpy.linalg.cholesky", L, "cholesky", "linalg", "linalg.rule_cholesky", ("upper",), args=A),
    OpSpec("numpy.linalg.qr", L, "qr", "linalg", "linalg.rule_qr", ("mode",), args=A, result_size="sizes.qr"),
    OpSpec("numpy.linalg.svd", L, "svd", "linalg", "linalg.rule_svd",
           ("full_matrices", "compute_uv", "hermitian"), args=A, result_size="sizes.svd"),
    OpSpec("numpy.linalg.svdvals", L, "svdvals", "linalg", "linalg.rule_svd", kernel="linalg.svd", args=("x",),
           result_size="sizes.svd"),
    OpSpec("numpy.linalg.eig", L, "eig", "linalg", "linalg.rule_eig", args=A),
    OpSpec("numpy.linalg.eigvals", L, "eigvals", "linalg", "linalg.rule_eig", kernel="linalg.eig", args=A),
    OpSpec("numpy.linalg.eigh", L, "eigh", "linalg", "linalg.rule_eigh", ("UPLO",), args=A),
    OpSpec("numpy.linalg.eigvalsh", L, "eigvalsh", "linalg", "linalg.rule_eigh",
           ("UPLO",), kernel="linalg.eigh", args=A),
    OpSpec("numpy.linalg.det", L, "det", "linalg", "linalg.rule_det", args=A),
    OpSpec("numpy.linalg.slogdet", L, "slogdet", "linalg", "linalg.rule_det", kernel="linalg.det", args=A),
    OpSpec("numpy.linalg.norm", L, "norm", "linalg", "linalg.rule_norm", ("ord", "axis", "keepdims"), args=("x",)),
    OpSpec("numpy.linalg.matrix_norm", L, "matrix_norm", "linalg", "linalg.rule_norm", ("ord", "keepdims"),
           kernel="linalg.norm", args=("x",)),
    OpSpec("numpy.linalg.vector_norm", L, "vector_norm", "linalg", "linalg.rule_norm", ("ord", "axis", "keepdims"),
           kernel="linalg.norm", args=("x",)),
    OpSpec("numpy.linalg.cond", L, "cond", "linalg", "linalg.rule_cond", ("p",), args=("x",)),
    OpSpec("numpy.linalg.matrix_rank", L, "matrix_rank", "linalg", "linalg.rule_matrix_rank",
           ("tol", "hermitian", "rtol"),
           args=("A",)),
    OpSpec("numpy.linalg.matrix_power", L, "matrix_power", "linalg", "linalg.rule_matrix_power", ("n",), args=A),
)


# --- fft -------------------------------------------------------------------------------------------

FFT1 = ("n", "axis", "norm", "out")
FFTN = ("s", "axes", "norm", "out")
N, S = ("n",), ("s",)  # D325: the kernels' output lengths as sent: fft1's and r2r's "n", fftn's "s"
FFT: tuple[OpSpec, ...] = tuple(
    OpSpec(f"numpy.fft.{name}", "numpy.fft", name, "fft", "fft.rule_fft_1d", FFT1, kernel="fft.fft1", args=("a",),
           size_params=N)
    for name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
) + tuple(
    OpSpec(f"numpy.fft.{name}", "numpy.fft", name, "fft", "fft.rule_fft_nd", FFTN, kernel="fft.fftn", args=("a",),
           size_params=S)
    for name in ("fft2", "ifft2", "fftn", "ifftn", "rfft2", "irfft2", "rfftn", "irfftn")
)


# --- scipy -----------------------------------------------------------------------------------------

SL, SF = "scipy.linalg", "scipy.fft"
SOLVE_P = ("lower", "overwrite_a", "overwrite_b", "check_finite", "assume_a", "transposed")
SFFT1 = ("n", "axis", "norm", "overwrite_x", "workers", "plan")
SFFTN = ("s", "axes", "norm", "overwrite_x", "workers", "plan")
SR2R = ("type", "n", "axis", "norm", "overwrite_x", "workers", "orthogonalize")
SCIPY: tuple[OpSpec, ...] = (
    OpSpec("scipy.linalg.solve", SL, "solve", "linalg", "scipy.rule_solve", SOLVE_P, trigger=SL),
    OpSpec("scipy.linalg.inv", SL, "inv", "linalg", "scipy.rule_inv",
           ("overwrite_a", "check_finite", "assume_a", "lower"),
           args=("a",), trigger=SL),
    OpSpec("scipy.linalg.svd", SL, "svd", "linalg", "scipy.rule_svd",
           ("full_matrices", "compute_uv", "overwrite_a", "check_finite", "lapack_driver"), kernel="linalg.svd",
           args=("a",), trigger=SL, result_size="sizes.svd"),
    OpSpec("scipy.linalg.eigh", SL, "eigh", "linalg", "scipy.rule_eigh",
           ("b", "lower", "eigvals_only", "overwrite_a", "overwrite_b", "type", "check_finite", "subset_by_index",
            "subset_by_value", "driver"), kernel="linalg.eigh", args=("a",), trigger=SL),
    OpSpec("scipy.linalg.cholesky", SL, "cholesky", "linalg", "scipy.rule_cholesky",
           ("lower", "overwrite_a", "check_finite"),
           kernel="linalg.cholesky", args=("a",), trigger=SL),
    OpSpec("scipy.linalg.lu_factor", SL, "lu_factor", "linalg", "scipy.rule_lu_factor", ("overwrite_a", "check_finite"),
           args=("a",), trigger=SL),
    OpSpec("scipy.linalg.lu_solve", SL, "lu_solve", "linalg", "scipy.rule_lu_solve",
           ("trans", "overwrite_b", "check_finite"),
           args=("lu_and_piv", "b"), trigger=SL, nested=True),
    OpSpec("scipy.linalg.qr", SL, "qr", "linalg", "scipy.rule_qr",
           ("overwrite_a", "lwork", "mode", "pivoting", "check_finite"),
           args=("a",), trigger=SL, result_size="sizes.s_qr"),  # sent as torch's mode and r_only
    OpSpec("scipy.linalg.expm", SL, "expm", "linalg", "scipy.rule_expm", args=("A",), trigger=SL),
) + tuple(
    OpSpec(f"scipy.fft.{name}", SF, name, "fft", "scipy.rule_sfft_1d",
           SFFT1, kernel="fft.fft1", args=("x",), trigger=SF, size_params=N)
    for name in ("fft", "ifft", "rfft", "irfft")
) + tuple(
    OpSpec(f"scipy.fft.{name}", SF, name, "fft", "scipy.rule_sfft_nd",
           SFFTN, kernel="fft.fftn", args=("x",), trigger=SF, size_params=S)
    for name in ("fft2", "fftn")
) + tuple(
    OpSpec(f"scipy.fft.{name}", SF, name, "fft", "scipy.rule_sfft_r2r", SR2R, kernel="fft.r2r", args=("x",),
           trigger=SF, size_params=N)
    for name in ("dct", "idct", "dst", "idst")
)


# --- numba -----------------------------------------------------------------------------------------

NUMBA: tuple[OpSpec, ...] = (
    OpSpec("numpy.bincount", "numpy", "bincount", "products", "numba.rule_bincount",
           ("minlength",), kernel="numba.bincount",
           args=("x", "weights"), size_params=N),  # D325: its number of bins
    OpSpec("numpy.convolve", "numpy", "convolve", "products", "numba.rule_convolve",
           ("mode",), kernel="numba.correlate",
           args=("a", "v"), size_params=("length",)),  # D325: its output's length
    OpSpec("numpy.correlate", "numpy", "correlate", "products", "numba.rule_correlate",
           ("mode",), kernel="numba.correlate",
           args=("a", "v"), size_params=("length",)),  # D325: its output's length
    OpSpec("numpy.interp", "numpy", "interp", "products", "numba.rule_interp", ("left", "right", "period"),
           kernel="numba.interp", args=("x", "xp", "fp")),
)

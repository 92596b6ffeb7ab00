"""Differential tests: every catalog row, offloaded (policy remote, in-process torch CPU worker),
against plain NumPy, in the style of CuPy's ``numpy_cupy_allclose``.

Each case builds its inputs, calls NumPy's *original* function (the one the shim wrapped, reached
through the wrapper's ``__wrapped__``) for the expected result, then calls the op the normal way
(``np.linalg.solve(...)``: the shim's wrapper) and checks that

1. the call really ran on the worker (the ledger's last record has kind ``worker``), or, for a case
   that is legitimately not offloaded, that it was recorded ``unsupported`` (with the reason why);
2. the result has NumPy's exact type (ndarray, NumPy scalar, or the linalg named tuple), dtype,
   shape, memory layout (C/F contiguity, strides otherwise) and writeability;
3. the values agree within a dtype-aware tolerance (integers exactly); decompositions whose factors
   are defined only up to signs/phases (svd, eigh, qr) are compared by their invariants.

Cases are parametrized over dtypes (float32, float64, complex64, complex128, int64 where NumPy
accepts it) and input layouts (C order, Fortran order, a strided view of a bigger array, a view
with a negative stride, and for 3-d operands a dense permuted order, neither C nor F).

Further: ``out=`` (written in place and returned, or left to NumPy where NumPy treats it
specially), NumPy's own exceptions reaching the caller, calls that stay local (subclasses,
array-likes, object dtype, ...) giving NumPy's exact result, and a check that every catalog row
has differential cases. The shim is installed once for the module (see ``shim`` below).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

from tests.helpers.shims import last_record, shim_fixture, start_fresh
from tests.helpers.workers import thread_worker
from tests.helpers.diffutil import assert_close, assert_meta, check_result, lay_out, op, original, values
from fusion_shim.catalog import CATALOG
from fusion_shim.intercept import bypassed

DTYPES = ("float32", "float64", "complex64", "complex128", "int64")
REAL_DTYPES = ("float32", "float64", "int64")
LAYOUTS = ("C", "F", "strided", "negstride")
ND_LAYOUTS = LAYOUTS + ("permuted",)  # for cases with 3-d and higher operands
VEC_LAYOUTS = ("C", "strided", "negstride")  # 1-d operands: F is C
INDEX_DTYPES = ("int64", "int32", "uint16")   # bincount's x
INTERP_DTYPES = ("float64", "float32", "complex128")  # interp's fp (x and xp float64)


# The worker's device: the conftest's in-process CPU worker unless FUSION_DIFF_DEVICE names another
# ("cuda": the same differential suite against the GPU kernels, where a machine has one).
DEVICE = os.environ.get("FUSION_DIFF_DEVICE", "cpu")


@pytest.fixture(scope="module")
def worker_url(request):
    if DEVICE == "cpu":
        yield request.getfixturevalue("inproc_worker")
        return
    with thread_worker("differential", device=DEVICE) as (url, _):
        yield url


# conftest's ``shim`` installed once for this module: installing calibrates the local side
# (0.1 to 0.8 s here), which per test would take minutes
shim = shim_fixture("worker_url", scope="module")


@pytest.fixture(autouse=True)
def _fresh(shim):
    """Each test starts with an empty ledger and a ready worker, as with a fresh install."""
    start_fresh(shim)
    yield


# --- helpers ---------------------------------------------------------------------------------------

class Maker:
    """Builds a case's inputs in one dtype and layout; every array goes through :func:`lay_out`."""

    def __init__(self, dtype: str, layout: str, seed: int = 0):
        self.dtype, self.layout = dtype, layout
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape: int) -> np.ndarray:
        return lay_out(values(shape, self.dtype, self.rng), self.layout)

    def index(self, n: int, top: int) -> np.ndarray:
        """``n`` non-negative integers below ``top`` in the case's dtype (bincount's x)."""
        return lay_out(self.rng.integers(0, top, n).astype(self.dtype), self.layout)

    def curve(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """interp's (xp, fp): ``n`` increasing float64 points (the same on every call) and values
        in the case's dtype."""
        xp = np.sort(np.random.default_rng(7).standard_normal(n) * 2)
        return lay_out(xp, self.layout), lay_out(values((n,), self.dtype, self.rng), self.layout)

    def real(self, *shape: int) -> np.ndarray:
        """float64 values whatever the case's dtype (interp's x)."""
        return lay_out(values(shape, "float64", self.rng), self.layout)

    def wellcond(self, *shape: int) -> np.ndarray:
        """A (stack of) square matrices with a dominant diagonal: invertible, well conditioned."""
        n = shape[-1]
        x = values(shape, self.dtype, self.rng) + (4 * n + 1) * np.eye(n, dtype=self.dtype)
        return lay_out(x.astype(self.dtype), self.layout)

    def hpd(self, *shape: int) -> np.ndarray:
        """A (stack of) Hermitian positive definite matrices X @ X^H + n*I, exactly Hermitian."""
        n = shape[-1]
        x = values(shape, self.dtype, self.rng)
        a = x @ np.swapaxes(x.conj(), -1, -2) + n * np.eye(n, dtype=self.dtype)
        if a.dtype.kind != "i":
            a = (a + np.swapaxes(a.conj(), -1, -2)) / 2  # exactly Hermitian, real diagonal
        return lay_out(a.astype(self.dtype), self.layout)

    def one_triangle(self, *shape: int, valid: str) -> np.ndarray:
        """HPD in the ``valid`` ("L" or "U") triangle, garbage in the other: LAPACK reads only one."""
        a = np.array(self.hpd(*shape))
        n = shape[-1]
        other = np.triu(np.ones((n, n), bool), 1) if valid == "L" else np.tril(np.ones((n, n), bool), -1)
        a[..., other] = 77
        return lay_out(a, self.layout)


@dataclass
class Case:
    op: str                                    # catalog name
    id: str
    build: Callable[[Maker], tuple[tuple, dict]]
    dtypes: tuple = DTYPES
    check: str = "values"                      # "values" | "svd" | "eigh" | "qr" | "cholesky"
    size: int = 8                              # the problem's inner dimension: scales the tolerance
    layouts: tuple = LAYOUTS
    marks: tuple = field(default_factory=tuple)


def args(*a, **k):
    return a, k


CASES: list[Case] = [
    # numpy.matmul
    Case("numpy.matmul", "2d", lambda m: args(m(7, 5), m(5, 6)), size=5),
    Case("numpy.matmul", "batched", lambda m: args(m(3, 6, 6), m(3, 6, 6)), size=6, layouts=ND_LAYOUTS),
    Case("numpy.matmul", "broadcast", lambda m: args(m(2, 1, 5, 4), m(3, 4, 6)), size=4, layouts=ND_LAYOUTS),
    Case("numpy.matmul", "two_batch_axes", lambda m: args(m(2, 3, 5, 4), m(2, 3, 4, 6)), size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.matmul", "two_batch_axes_vec", lambda m: args(m(2, 3, 5, 4), m(4)), size=4, layouts=ND_LAYOUTS),
    Case("numpy.matmul", "mat_vec", lambda m: args(m(6, 5), m(5)), size=5),
    Case("numpy.matmul", "vec_mat", lambda m: args(m(5), m(5, 6)), size=5),
    Case("numpy.matmul", "vec_vec_scalar", lambda m: args(m(9), m(9)), size=9),
    Case("numpy.matmul", "large", lambda m: args(m(40, 33), m(33, 37)), size=33),
    # numpy.dot
    Case("numpy.dot", "2d", lambda m: args(m(7, 5), m(5, 6)), size=5),
    Case("numpy.dot", "mat_vec", lambda m: args(m(6, 5), m(5)), size=5),
    Case("numpy.dot", "vec_vec_scalar", lambda m: args(m(9), m(9)), size=9),
    Case("numpy.dot", "vec_mat", lambda m: args(m(5), m(5, 6)), size=5),
    Case("numpy.dot", "nd", lambda m: args(m(2, 3, 4), m(5, 4, 6)), size=4, layouts=ND_LAYOUTS),
    # numpy.tensordot
    Case("numpy.tensordot", "int_axes_default", lambda m: args(m(3, 4, 5), m(4, 5, 6)), size=20,
         layouts=ND_LAYOUTS),
    Case("numpy.tensordot", "int_axes_1", lambda m: args(m(6, 5), m(5, 3), axes=1), size=5),
    Case("numpy.tensordot", "int_axes_0_outer", lambda m: args(m(4, 3), m(5), axes=0), size=1),
    Case("numpy.tensordot", "int_pair_axes", lambda m: args(m(6, 5), m(5, 3), axes=(1, 0)), size=5),
    Case("numpy.tensordot", "list_axes", lambda m: args(m(3, 4, 5), m(5, 3, 6), axes=([0, 2], [1, 0])), size=15),
    Case("numpy.tensordot", "negative_axes", lambda m: args(m(3, 4, 5), m(5, 6), axes=([-1], [0])), size=5),
    Case("numpy.tensordot", "vec_vec_0d", lambda m: args(m(9), m(9), axes=1), size=9),
    # numpy.einsum
    Case("numpy.einsum", "explicit", lambda m: args("ij,jk->ik", m(7, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "explicit_transposed", lambda m: args("ij,jk->ki", m(7, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "implicit", lambda m: args("ij,jk", m(7, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "implicit_reordered", lambda m: args("kj,ji", m(7, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "ellipsis", lambda m: args("...ij,...jk->...ik", m(3, 4, 5), m(3, 5, 6)), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.einsum", "ellipsis_implicit", lambda m: args("...ij,...jk", m(3, 4, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "batched_3d", lambda m: args("bij,bjk->bik", m(3, 4, 5), m(3, 5, 6)), size=5),
    Case("numpy.einsum", "permuted_3d", lambda m: args("ijk,kl->jil", m(3, 4, 5), m(5, 6)), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.einsum", "diagonal", lambda m: args("ii,ij->j", m(5, 5), m(5, 6)), size=5),
    Case("numpy.einsum", "outer", lambda m: args("i,j->ij", m(5), m(6)), size=1),
    Case("numpy.einsum", "broadcast_ellipsis", lambda m: args("...ij,...jk", m(1, 4, 5), m(3, 5, 6)), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.einsum", "rowwise_dot", lambda m: args("ij,ij->i", m(6, 7), m(6, 7)), size=7),
    Case("numpy.einsum", "scalar", lambda m: args("i,i", m(9), m(9)), size=9),
    Case("numpy.einsum", "three_operands", lambda m: args("ij,jk,kl->il", m(4, 5), m(5, 6), m(6, 3)), size=30),
    Case("numpy.einsum", "optimize_true", lambda m: args("ij,jk,kl->il", m(4, 5), m(5, 6), m(6, 3),
                                                         optimize=True), size=30),
    Case("numpy.einsum", "optimize_true_2op", lambda m: args("ij,jk", m(7, 5), m(5, 6), optimize=True), size=5),
    Case("numpy.einsum", "optimize_greedy_ellipsis", lambda m: args("...ij,...jk", m(3, 4, 5), m(3, 5, 6),
                                                                    optimize="greedy"), size=5, layouts=ND_LAYOUTS),
    Case("numpy.einsum", "optimize_permuted_3d", lambda m: args("ijk,kl,lm->mji", m(3, 4, 5), m(5, 6), m(6, 2),
                                                                optimize=True), size=30, layouts=ND_LAYOUTS),
    Case("numpy.einsum", "optimize_explicit_path", lambda m: args("ij,jk,kl->il", m(4, 5), m(5, 6), m(6, 3),
                                                                  optimize=["einsum_path", (1, 2), (0, 1)]),
         size=30),
    # einsum's interleaved form (sublists of ints, Ellipsis), casting= and dtype= (D261)
    Case("numpy.einsum", "interleaved", lambda m: args(m(7, 5), [0, 1], m(5, 6), [1, 2], [0, 2]), size=5),
    Case("numpy.einsum", "interleaved_implicit", lambda m: args(m(7, 5), [3, 1], m(5, 6), [1, 2]), size=5),
    Case("numpy.einsum", "interleaved_labels_past_25", lambda m: args(m(7, 5), [30, 1], m(5, 6), [1, 27]), size=5),
    Case("numpy.einsum", "interleaved_ellipsis", lambda m: args(m(3, 4, 5), [Ellipsis, 0, 1], m(3, 5, 6),
                                                                [Ellipsis, 1, 2], [Ellipsis, 0, 2]), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.einsum", "ellipsis_in_the_middle", lambda m: args("i...j,j...k->...ik", m(4, 3, 5), m(5, 3, 6)),
         size=5, layouts=ND_LAYOUTS),
    Case("numpy.einsum", "casting_same_kind", lambda m: args("ij,jk->ik", m(7, 5), m(5, 6), casting="same_kind"),
         size=5),
    Case("numpy.einsum", "dtype_complex", lambda m: args("ij,jk->ik", m(7, 5), m(5, 6), dtype=np.complex128),
         size=5),
    Case("numpy.einsum", "dtype_single_unsafe", lambda m: args("ij,jk->ik", m(7, 5), m(5, 6), dtype="float32",
                                                               casting="unsafe"), dtypes=REAL_DTYPES, size=5),
    # array-likes, converted as NumPy converts them (D260)
    Case("numpy.matmul", "lists", lambda m: args(m(7, 5).tolist(), m(5, 6)), size=5, layouts=("C",)),
    Case("numpy.dot", "tuples", lambda m: args(m(6, 5), tuple(m(5).tolist())), size=5, layouts=("C",)),
    Case("numpy.tensordot", "lists", lambda m: args(m(4, 5).tolist(), m(5, 3).tolist(), axes=1), size=5,
         layouts=("C",)),
    Case("numpy.einsum", "lists", lambda m: args("ij,jk", m(4, 5).tolist(), m(5, 3)), size=5, layouts=("C",)),
    Case("numpy.linalg.solve", "lists", lambda m: args(m.wellcond(5, 5).tolist(), m(5).tolist()), size=5,
         layouts=("C",)),
    Case("numpy.fft.fft", "list", lambda m: args(m(64).tolist()), size=64, layouts=("C",)),
    # numpy.linalg.solve
    Case("numpy.linalg.solve", "2d", lambda m: args(m.wellcond(6, 6), m(6, 4)), size=6),
    Case("numpy.linalg.solve", "vector_b", lambda m: args(m.wellcond(6, 6), m(6)), size=6),
    Case("numpy.linalg.solve", "batched", lambda m: args(m.wellcond(3, 6, 6), m(3, 6, 2)), size=6,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.solve", "two_batch_axes", lambda m: args(m.wellcond(2, 3, 5, 5), m(2, 3, 5, 2)), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.solve", "two_batch_axes_vector_b", lambda m: args(m.wellcond(2, 3, 5, 5), m(5)), size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.solve", "batched_vector_b", lambda m: args(m.wellcond(3, 6, 6), m(6)), size=6),
    Case("numpy.linalg.solve", "broadcast", lambda m: args(m.wellcond(2, 1, 5, 5), m(3, 5, 2)), size=5),
    Case("numpy.linalg.solve", "large", lambda m: args(m.wellcond(40, 40), m(40, 3)), size=40),
    # numpy.linalg.inv
    Case("numpy.linalg.inv", "2d", lambda m: args(m.wellcond(7, 7)), size=7),
    Case("numpy.linalg.inv", "batched", lambda m: args(m.wellcond(3, 5, 5)), size=5, layouts=ND_LAYOUTS),
    Case("numpy.linalg.inv", "two_batch_axes", lambda m: args(m.wellcond(2, 3, 5, 5)), size=5, layouts=ND_LAYOUTS),
    Case("numpy.linalg.inv", "large", lambda m: args(m.wellcond(40, 40)), size=40),
    # numpy.linalg.svd
    Case("numpy.linalg.svd", "tall_full", lambda m: args(m(7, 5)), check="svd", size=7),
    Case("numpy.linalg.svd", "wide_full", lambda m: args(m(5, 7)), check="svd", size=7),
    Case("numpy.linalg.svd", "reduced", lambda m: args(m(9, 5), full_matrices=False), check="svd", size=9),
    Case("numpy.linalg.svd", "values_only", lambda m: args(m(6, 8), compute_uv=False), check="svd", size=8),
    Case("numpy.linalg.svd", "batched", lambda m: args(m(2, 6, 4)), check="svd", size=6, layouts=ND_LAYOUTS),
    Case("numpy.linalg.svd", "two_batch_axes", lambda m: args(m(2, 3, 4, 5)), check="svd", size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.svd", "batched_values_only", lambda m: args(m(2, 3, 4, 6), compute_uv=False), check="svd",
         size=6, layouts=ND_LAYOUTS),
    # numpy.linalg.eigh
    Case("numpy.linalg.eigh", "lower", lambda m: args(m.hpd(6, 6)), check="eigh", size=6),
    Case("numpy.linalg.eigh", "upper", lambda m: args(m.hpd(6, 6), UPLO="U"), check="eigh", size=6),
    Case("numpy.linalg.eigh", "batched", lambda m: args(m.hpd(3, 5, 5)), check="eigh", size=5, layouts=ND_LAYOUTS),
    Case("numpy.linalg.eigh", "two_batch_axes", lambda m: args(m.hpd(2, 3, 4, 4), UPLO="U"), check="eigh", size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.eigh", "reads_lower_only", lambda m: args(m.one_triangle(6, 6, valid="L")),
         check="eigh", size=6),
    Case("numpy.linalg.eigh", "reads_upper_only", lambda m: args(m.one_triangle(6, 6, valid="U"), UPLO="U"),
         check="eigh", size=6),
    # numpy.linalg.cholesky
    Case("numpy.linalg.cholesky", "lower", lambda m: args(m.hpd(6, 6)), check="cholesky", size=6),
    Case("numpy.linalg.cholesky", "upper", lambda m: args(m.hpd(6, 6), upper=True), check="cholesky", size=6),
    Case("numpy.linalg.cholesky", "batched", lambda m: args(m.hpd(3, 5, 5)), check="cholesky", size=5,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.cholesky", "two_batch_axes", lambda m: args(m.hpd(2, 3, 4, 4), upper=True), check="cholesky",
         size=4, layouts=ND_LAYOUTS),
    Case("numpy.linalg.cholesky", "reads_lower_only", lambda m: args(m.one_triangle(6, 6, valid="L")),
         check="cholesky", size=6),
    Case("numpy.linalg.cholesky", "reads_upper_only",
         lambda m: args(m.one_triangle(6, 6, valid="U"), upper=True), check="cholesky", size=6),
    # rows and parameters issue 4 added (tests/catalog/test_hypothesis.py generates calls for every
    # row; these pin each dtype and layout)
    Case("numpy.linalg.svd", "hermitian", lambda m: args(m.hpd(5, 5), hermitian=True), check="svd", size=5),
    Case("numpy.linalg.svd", "hermitian_batched_values", lambda m: args(m.hpd(2, 3, 4, 4), hermitian=True,
                                                                        compute_uv=False), size=4, layouts=ND_LAYOUTS),
    Case("numpy.linalg.qr", "raw_tall", lambda m: args(m(8, 5), mode="raw"), check="qr", size=8),
    Case("numpy.linalg.qr", "raw_batched_wide", lambda m: args(m(2, 3, 4, 6), mode="raw"), check="qr", size=6,
         layouts=ND_LAYOUTS),
    Case("numpy.fft.fft2", "axes_none_3d", lambda m: args(m(4, 3, 8), axes=None), size=96, layouts=ND_LAYOUTS),
    Case("numpy.linalg.det", "batched", lambda m: args(m.wellcond(2, 3, 4, 4)), check="det", size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.slogdet", "2d", lambda m: args(m.wellcond(5, 5)), check="det", size=5),
    Case("numpy.linalg.eig", "batched", lambda m: args(m(2, 3, 4, 4)), check="eig", size=4, layouts=ND_LAYOUTS),
    Case("numpy.linalg.eigvals", "2d", lambda m: args(m(5, 5)), check="eig", size=5),
    Case("numpy.linalg.eigvalsh", "batched_upper", lambda m: args(m.hpd(2, 3, 4, 4), UPLO="U"), check="eigh",
         size=4, layouts=ND_LAYOUTS),
    Case("numpy.linalg.pinv", "tall", lambda m: args(m(7, 4)), size=7),
    Case("numpy.linalg.pinv", "batched_hermitian", lambda m: args(m.hpd(2, 3, 4, 4), hermitian=True), size=8,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.lstsq", "tall_matrix_b", lambda m: args(m(8, 4), m(8, 2)), check="lstsq", size=8),
    Case("numpy.linalg.lstsq", "vector_b", lambda m: args(m(6, 6), m(6)), check="lstsq", size=8),
    Case("numpy.linalg.matrix_rank", "batched", lambda m: args(m.wellcond(2, 3, 4, 4)), check="rank", size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.norm", "nuc_axes", lambda m: args(m(3, 4, 5), ord="nuc", axis=(2, 0)), size=16,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.norm", "ord3_keepdims", lambda m: args(m(3, 4, 5), ord=3, axis=1, keepdims=True), size=16,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.vector_norm", "axes_tuple", lambda m: args(m(3, 4, 5), axis=(0, 2)), size=16,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.matrix_norm", "batched_inf", lambda m: args(m(2, 4, 5), ord=np.inf), size=16,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.cond", "batched_fro", lambda m: args(m.wellcond(2, 3, 4, 4), "fro"), check="cond", size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.matrix_power", "cube", lambda m: args(m(3, 4, 4), 3), size=32, layouts=ND_LAYOUTS),
    Case("numpy.linalg.matrix_power", "inverse_squared", lambda m: args(m.wellcond(3, 4, 4), -2), size=32,
         layouts=ND_LAYOUTS),
    Case("numpy.kron", "3d_2d", lambda m: args(m(2, 3, 2), m(3, 2)), size=1, layouts=ND_LAYOUTS),
    Case("numpy.vdot", "matrices", lambda m: args(m(3, 4), m(4, 3)), size=12),
    Case("numpy.inner", "3d_2d", lambda m: args(m(2, 3, 4), m(5, 4)), size=4, layouts=ND_LAYOUTS),
    Case("numpy.matvec", "batched", lambda m: args(m(2, 3, 4, 5), m(5)), size=5, layouts=ND_LAYOUTS),
    Case("numpy.linalg.trace", "batched_offset", lambda m: args(m(2, 3, 4, 5), offset=1), size=4,
         layouts=ND_LAYOUTS),
    Case("numpy.fft.rfftn", "3d", lambda m: args(m(4, 6, 8)), dtypes=REAL_DTYPES, size=192, layouts=ND_LAYOUTS),
    Case("numpy.fft.irfftn", "3d_s", lambda m: args(m(4, 6, 5), s=(4, 6, 8), axes=(0, 1, 2)), size=192,
         layouts=ND_LAYOUTS),
    Case("numpy.fft.hfft", "rows", lambda m: args(m(4, 9)), size=16),
    Case("numpy.fft.ihfft", "rows_n", lambda m: args(m(4, 16), n=12), dtypes=REAL_DTYPES, size=16),
    # numpy.linalg.qr
    Case("numpy.linalg.qr", "reduced_tall", lambda m: args(m(8, 5)), check="qr", size=8),
    Case("numpy.linalg.qr", "reduced_wide", lambda m: args(m(5, 8)), check="qr", size=8),
    Case("numpy.linalg.qr", "complete", lambda m: args(m(8, 5), mode="complete"), check="qr", size=8),
    Case("numpy.linalg.qr", "r_only", lambda m: args(m(8, 5), mode="r"), check="qr", size=8),
    Case("numpy.linalg.qr", "batched", lambda m: args(m(2, 7, 4)), check="qr", size=7, layouts=ND_LAYOUTS),
    Case("numpy.linalg.qr", "batched_wide_complete", lambda m: args(m(3, 4, 6), mode="complete"), check="qr", size=6,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.qr", "two_batch_axes_r", lambda m: args(m(2, 3, 6, 4), mode="r"), check="qr", size=6,
         layouts=ND_LAYOUTS),
    Case("numpy.linalg.qr", "two_batch_axes", lambda m: args(m(2, 3, 4, 4)), check="qr", size=4,
         layouts=ND_LAYOUTS),
    # numpy.fft.fft
    Case("numpy.fft.fft", "1d", lambda m: args(m(64)), size=64),
    Case("numpy.fft.fft", "rows", lambda m: args(m(4, 64)), size=64),
    Case("numpy.fft.fft", "axis0", lambda m: args(m(64, 4), axis=0), size=64),
    Case("numpy.fft.fft", "n_pad", lambda m: args(m(3, 48), n=64), size=64),
    Case("numpy.fft.fft", "n_truncate", lambda m: args(m(3, 64), n=40), size=64),
    Case("numpy.fft.fft", "n_axis0", lambda m: args(m(64, 3), n=50, axis=0), size=64),
    Case("numpy.fft.fft", "3d_middle_axis", lambda m: args(m(3, 64, 2), axis=1), size=64, layouts=ND_LAYOUTS),
    Case("numpy.fft.fft", "norm_backward", lambda m: args(m(64), norm="backward"), size=64),
    Case("numpy.fft.fft", "norm_ortho", lambda m: args(m(4, 64), norm="ortho"), size=64),
    Case("numpy.fft.fft", "norm_forward", lambda m: args(m(4, 64), norm="forward"), size=64),
    # numpy.fft.ifft
    Case("numpy.fft.ifft", "1d", lambda m: args(m(64)), size=64),
    Case("numpy.fft.ifft", "axis0_n", lambda m: args(m(64, 3), n=70, axis=0), size=70),
    Case("numpy.fft.ifft", "norm_ortho", lambda m: args(m(4, 64), norm="ortho"), size=64),
    Case("numpy.fft.ifft", "norm_forward", lambda m: args(m(4, 64), norm="forward"), size=64),
    # numpy.fft.rfft (real input only)
    Case("numpy.fft.rfft", "1d", lambda m: args(m(64)), dtypes=REAL_DTYPES, size=64),
    Case("numpy.fft.rfft", "rows_odd_n", lambda m: args(m(4, 64), n=63), dtypes=REAL_DTYPES, size=64),
    Case("numpy.fft.rfft", "axis0_pad", lambda m: args(m(40, 3), n=64, axis=0), dtypes=REAL_DTYPES, size=64),
    Case("numpy.fft.rfft", "3d_axis0", lambda m: args(m(64, 3, 2), axis=0), dtypes=REAL_DTYPES, size=64,
         layouts=ND_LAYOUTS),
    Case("numpy.fft.rfft", "norm_ortho", lambda m: args(m(4, 64), norm="ortho"), dtypes=REAL_DTYPES, size=64),
    Case("numpy.fft.rfft", "norm_forward", lambda m: args(m(64), norm="forward"), dtypes=REAL_DTYPES, size=64),
    # numpy.fft.irfft (real input is read as complex)
    Case("numpy.fft.irfft", "1d", lambda m: args(m(33)), size=64),
    Case("numpy.fft.irfft", "rows_n_odd", lambda m: args(m(4, 33), n=63), size=64),
    Case("numpy.fft.irfft", "axis0_n_pad", lambda m: args(m(20, 3), n=64, axis=0), size=64),
    Case("numpy.fft.irfft", "3d_last", lambda m: args(m(2, 3, 33)), size=64, layouts=ND_LAYOUTS),
    Case("numpy.fft.irfft", "norm_ortho", lambda m: args(m(4, 33), norm="ortho"), size=64),
    Case("numpy.fft.irfft", "norm_forward", lambda m: args(m(33), norm="forward"), size=64),
    # numpy.fft.fft2
    Case("numpy.fft.fft2", "2d", lambda m: args(m(8, 16)), size=128),
    Case("numpy.fft.fft2", "s", lambda m: args(m(8, 16), s=(6, 20)), size=128),
    Case("numpy.fft.fft2", "axes_swapped", lambda m: args(m(8, 16), axes=(1, 0)), size=128),
    Case("numpy.fft.fft2", "3d_axes_0_2", lambda m: args(m(4, 3, 16), axes=(0, 2)), size=64, layouts=ND_LAYOUTS),
    Case("numpy.fft.fft2", "3d_s_axes", lambda m: args(m(4, 3, 16), s=(5, 12), axes=(2, 0)), size=64,
         layouts=ND_LAYOUTS),
    Case("numpy.fft.fft2", "norm_ortho", lambda m: args(m(8, 16), norm="ortho"), size=128),
    Case("numpy.fft.fft2", "norm_forward", lambda m: args(m(8, 16), norm="forward"), size=128),
    # numpy.fft.ifft2
    Case("numpy.fft.ifft2", "2d", lambda m: args(m(8, 16)), size=128),
    Case("numpy.fft.ifft2", "s", lambda m: args(m(8, 16), s=(10, 12)), size=128),
    Case("numpy.fft.ifft2", "3d_axes", lambda m: args(m(3, 8, 16), axes=(0, 1)), size=128, layouts=ND_LAYOUTS),
    Case("numpy.fft.ifft2", "norm_ortho", lambda m: args(m(8, 16), norm="ortho"), size=128),
    Case("numpy.fft.ifft2", "norm_backward", lambda m: args(m(8, 16), norm="backward"), size=128),
] + [
    # --- issue 9: rows with numba.cuda kernels (under numba's CUDA SIMULATOR on the CPU: see conftest) ---
    Case("numpy.bincount", "counts", lambda m: args(m.index(60, 20)), dtypes=INDEX_DTYPES, layouts=VEC_LAYOUTS),
    Case("numpy.bincount", "minlength", lambda m: args(m.index(60, 20), minlength=40), dtypes=INDEX_DTYPES,
         layouts=VEC_LAYOUTS),
    Case("numpy.bincount", "weights", lambda m: args(m.index(60, 20), weights=lay_out(values((60,), "float64", m.rng),
                                                                                      m.layout)),
         dtypes=INDEX_DTYPES, layouts=VEC_LAYOUTS, size=60),
    Case("numpy.bincount", "int_weights", lambda m: args(m.index(60, 5), weights=m.index(60, 9)),
         dtypes=INDEX_DTYPES, layouts=VEC_LAYOUTS),
    Case("numpy.interp", "2d_x", lambda m: args(m.real(3, 7) * 2, *m.curve(20)), dtypes=INTERP_DTYPES, size=20,
         layouts=LAYOUTS),
    Case("numpy.interp", "left_right", lambda m: args(m.real(40) * 3, *m.curve(12), left=-7.0, right=9),
         dtypes=INTERP_DTYPES, layouts=VEC_LAYOUTS, size=12),
    Case("numpy.interp", "on_the_points", lambda m: args(m.curve(12)[0], *m.curve(12)),
         dtypes=INTERP_DTYPES, layouts=VEC_LAYOUTS, size=12),
] + [
    Case(name, f"{mode}{'_swapped' if swap else ''}",
         (lambda mode, swap: lambda m: args(*((m(5), m(11)) if swap else (m(11), m(5))), mode=mode))(mode, swap),
         layouts=VEC_LAYOUTS, size=11)
    for name in ("numpy.convolve", "numpy.correlate") for mode in ("full", "same", "valid") for swap in (False, True)
] + [
    Case("numpy.correlate", "default_mode_equal_lengths", lambda m: args(m(9), m(9)), layouts=VEC_LAYOUTS, size=9),
    Case("numpy.convolve", "default_mode_length_one", lambda m: args(m(9), m(1)), layouts=("C",), size=1),
]


def _params():
    for case in CASES:
        for dtype in case.dtypes:
            for layout in case.layouts:
                yield pytest.param(case, dtype, layout, id=f"{case.op.removeprefix('numpy.')}-{case.id}-{dtype}-{layout}",
                                   marks=case.marks)


# --- comparison --------------------------------------------------------------------------------------

def run_both(shim, name: str, a_args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    """NumPy's result (original function, not recorded), the shim's result, and the shim's record."""
    fn = op(name)
    assert original(fn) is not fn, f"{name} is not intercepted"
    n_before = len(shim.ledger.records)
    with bypassed():  # the library alone: its own inner calls (e.g. x.dot(x)) untouched too
        exp = original(fn)(*a_args, **kwargs)
    assert len(shim.ledger.records) == n_before, "the original function was intercepted"
    got = fn(*a_args, **kwargs)
    assert len(shim.ledger.records) == n_before + 1, "the shim's call left no record"
    return exp, got, last_record(shim)


# --- the differential table -------------------------------------------------------------------------

@pytest.mark.parametrize("case,dtype,layout", list(_params()))
def test_differential(shim, case: Case, dtype: str, layout: str):
    a_args, kwargs = case.build(Maker(dtype, layout))
    snapshot = [np.array(x, copy=True) for x in a_args if isinstance(x, np.ndarray)]
    exp, got, rec = run_both(shim, case.op, a_args, kwargs)
    assert rec.kind == "worker", f"{case.op} ran {rec.kind}: {rec.reason}"
    check_result(case.check, case.size, a_args, kwargs, got, exp)
    for before, x in zip(snapshot, [x for x in a_args if isinstance(x, np.ndarray)]):
        np.testing.assert_array_equal(x, before, err_msg="an input was modified")


def test_every_catalog_row_has_differential_cases():
    """Every row has cases here or generated ones in tests/catalog/test_hypothesis.py (all rows)."""
    from tests.catalog.test_hypothesis import STRATEGIES

    covered = {case.op for case in CASES} | set(STRATEGIES)
    missing = sorted(spec.name for spec in CATALOG if spec.name not in covered)
    assert not missing, f"catalog rows without a differential case: {missing}"
    unknown = sorted(covered - {spec.name for spec in CATALOG})
    assert not unknown, f"cases for ops that are not catalog rows: {unknown}"


def test_case_ids_are_unique():
    ids = [(c.op, c.id) for c in CASES]
    assert len(ids) == len(set(ids))


# --- mixed dtypes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,build", [
    ("numpy.matmul", lambda r: args(values((5, 4), "int64", r), values((4, 3), "float32", r))),
    ("numpy.dot", lambda r: args(values((5, 4), "float32", r), values((4, 3), "complex128", r))),
    ("numpy.einsum", lambda r: args("ij,jk->ik", values((5, 4), "int32", r), values((4, 3), "float32", r))),
    ("numpy.tensordot", lambda r: args(values((5, 4), "int32", r), values((4, 3), "int64", r), axes=1)),
    ("numpy.linalg.solve", lambda r: args(values((4, 4), "float32", r) + 20 * np.eye(4, dtype="f4"),
                                          values((4, 2), "complex64", r))),
    ("numpy.linalg.solve", lambda r: args(values((4, 4), "int64", r) + 20 * np.eye(4, dtype="i8"),
                                          values((4,), "float32", r))),
], ids=["matmul-i8-f4", "dot-f4-c16", "einsum-i4-f4", "tensordot-i4-i8", "solve-f4-c8", "solve-i8-f4"])
def test_mixed_dtypes(shim, name, build):
    a_args, kwargs = build(np.random.default_rng(3))
    exp, got, rec = run_both(shim, name, a_args, kwargs)
    assert rec.kind == "worker", f"{name} ran {rec.kind}: {rec.reason}"
    assert_meta(got, exp)
    assert_close(got, exp, 4)


# --- out= -------------------------------------------------------------------------------------------

OUT_CASES = {
    "numpy.matmul": lambda m: args(m(6, 5), m(5, 7)),
    "numpy.dot": lambda m: args(m(6, 5), m(5, 7)),
    "numpy.einsum": lambda m: args("ij,jk->ik", m(6, 5), m(5, 7)),
    "numpy.fft.fft": lambda m: args(m(4, 64)),
    "numpy.fft.ifft": lambda m: args(m(4, 64), n=32),
    "numpy.fft.rfft": lambda m: args(m(4, 64)),
    "numpy.fft.irfft": lambda m: args(m(4, 33)),
    "numpy.fft.fft2": lambda m: args(m(8, 16)),
    "numpy.fft.fft2/s": lambda m: args(m(8, 16), s=(8, 20)),  # only the last axis resized: NumPy copes
}


def _out_params():
    for key in sorted(OUT_CASES):
        for dtype in ("float32", "float64", "complex128"):
            if key == "numpy.fft.rfft" and dtype.startswith("complex"):
                continue  # rfft takes real input only
            for out_layout in ("C", "F"):
                if key == "numpy.dot" and out_layout == "F":
                    continue  # numpy.dot refuses a non-C-contiguous out: see test_out_numpy_decides
                yield pytest.param(key, dtype, out_layout, id=f"{key.removeprefix('numpy.')}-{dtype}-{out_layout}")


@pytest.mark.parametrize("key,dtype,out_layout", list(_out_params()))
def test_out(shim, key, dtype, out_layout):
    name = key.split("/")[0]
    a_args, kwargs = OUT_CASES[key](Maker(dtype, "C"))
    fn = op(name)
    ref = original(fn)(*a_args, **kwargs)
    exp_out = np.zeros(ref.shape, ref.dtype, order=out_layout)
    got_out = np.zeros(ref.shape, ref.dtype, order=out_layout)
    exp = original(fn)(*a_args, out=exp_out, **kwargs)
    assert exp is exp_out
    got = fn(*a_args, out=got_out, **kwargs)
    rec = last_record(shim)
    assert rec.kind == "worker", f"{name} ran {rec.kind}: {rec.reason}"
    assert got is got_out, "the returned object is not the out array"
    assert_close(got_out, exp_out, 64)


def _readonly(arr):
    arr.flags.writeable = False
    return arr


OUT_LOCAL = [
    # (name, id, build, out given the plain result, what the ledger's reason says)
    ("numpy.matmul", "cast", lambda m: args(m(6, 5), m(5, 7)), lambda r: np.zeros(r.shape, np.complex128),
     "out= is complex128"),
    ("numpy.dot", "fortran_out", lambda m: args(m(6, 5), m(5, 7)), lambda r: np.zeros(r.shape, r.dtype, order="F"),
     "not C-contiguous"),  # NumPy raises its own ValueError
    ("numpy.fft.fft", "readonly", lambda m: args(m(64)), lambda r: _readonly(np.zeros(r.shape, r.dtype)),
     "read-only"),
    ("numpy.einsum", "wrong_shape", lambda m: args("ij,jk->ik", m(6, 5), m(5, 7)),
     lambda r: np.zeros((7, 6), r.dtype), "out= is"),
    # NumPy 2's ifft2 ignores out= and returns a new array, leaving out untouched
    ("numpy.fft.ifft2", "ignored", lambda m: args(m(8, 16)), lambda r: np.zeros(r.shape, r.dtype), "ignores"),
    ("numpy.fft.ifft2", "ignored_s", lambda m: args(m(8, 16), s=(4, 8)), lambda r: np.zeros(r.shape, r.dtype),
     "ignores"),
    # fft2 with s= resizing a first axis transforms into out one axis at a time: NumPy raises ValueError
    ("numpy.fft.fft2", "s_resizes_first_axis", lambda m: args(m(8, 16), s=(4, 16)),
     lambda r: np.zeros(r.shape, r.dtype), "NumPy raises"),
]


@pytest.mark.parametrize("name,build,out_of,why", [(n, b, o, w) for n, _, b, o, w in OUT_LOCAL],
                         ids=[f"{n.removeprefix('numpy.')}-{i}" for n, i, _, _, _ in OUT_LOCAL])
def test_out_numpy_decides(shim, name, build, out_of, why):
    """An out= NumPy would treat specially (cast into, refuse, ignore) is left to NumPy: same
    result, same exception, same returned object, same contents of out."""
    a_args, kwargs = build(Maker("float64", "C"))
    fn = op(name)
    ref = original(fn)(*a_args, **kwargs)
    exp_out, got_out = out_of(ref), out_of(ref)
    exp, exp_exc = _outcome(lambda: original(fn)(*a_args, out=exp_out, **kwargs))
    got, got_exc = _outcome(lambda: fn(*a_args, out=got_out, **kwargs))
    rec = last_record(shim)
    assert rec.kind == ("unsupported" if exp_exc is None else "raised"), f"{name} ran {rec.kind}: {rec.reason}"
    assert why in rec.reason, rec.reason
    assert type(got_exc) is type(exp_exc), f"NumPy: {exp_exc!r}, shim: {got_exc!r}"
    if exp_exc is None:
        assert (got is got_out) == (exp is exp_out)
        np.testing.assert_array_equal(got, exp)
    np.testing.assert_array_equal(got_out, exp_out)


def _outcome(call):
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - whatever NumPy raises, the shim must raise too
        return None, exc


# --- NumPy's own errors reach the caller --------------------------------------------------------------

ERROR_CASES = [
    ("numpy.linalg.solve", "singular", lambda: args(np.zeros((5, 5)), np.ones((5, 2)))),
    ("numpy.linalg.solve", "singular_batched", lambda: args(np.stack([np.eye(4), np.zeros((4, 4))]), np.ones(4))),
    ("numpy.linalg.inv", "singular", lambda: args(np.ones((5, 5)))),
    ("numpy.linalg.inv", "singular_f32", lambda: args(np.zeros((5, 5), np.float32))),
    ("numpy.linalg.cholesky", "not_pd", lambda: args(-np.eye(5))),
    ("numpy.linalg.cholesky", "not_pd_upper", lambda: args(np.diag([1.0, 2.0, -3.0, 4.0]), upper=True)),
    ("numpy.matmul", "mismatched", lambda: args(np.ones((3, 4)), np.ones((5, 6)))),
    ("numpy.matmul", "batch_mismatch", lambda: args(np.ones((2, 3, 4)), np.ones((3, 4, 5)))),
    ("numpy.dot", "mismatched", lambda: args(np.ones((3, 4)), np.ones((5, 6)))),
    ("numpy.fft.rfft", "complex_input", lambda: args(np.ones(16, np.complex128))),
    ("numpy.linalg.inv", "not_square", lambda: args(np.ones((3, 4)))),
    ("numpy.fft.fft", "n_zero", lambda: args(np.ones(16), n=0)),
    ("numpy.fft.fft2", "1d_input", lambda: args(np.ones(16))),
    # the worker's torch raises too: recorded as a fallback, NumPy's LinAlgError reaches the caller
    ("numpy.linalg.eigh", "nan", lambda: args(np.full((4, 4), np.nan))),
    ("numpy.linalg.svd", "nan", lambda: args(np.full((4, 3), np.nan))),
]


@pytest.mark.parametrize("name,build", [(n, b) for n, _, b in ERROR_CASES],
                         ids=[f"{n.removeprefix('numpy.')}-{i}" for n, i, _ in ERROR_CASES])
def test_numpy_errors_reach_the_caller(shim, name, build):
    a_args, kwargs = build()
    fn = op(name)
    with pytest.raises(Exception) as exp_info:
        original(fn)(*a_args, **kwargs)
    exp_type = type(exp_info.value)
    assert exp_type is not AssertionError
    with pytest.raises(exp_type) as got_info:
        fn(*a_args, **kwargs)
    assert type(got_info.value) is exp_type
    rec = last_record(shim)
    assert rec.kind == "raised", rec  # NumPy's error, raised here: the worker's failure is never the answer
    assert rec.raised == exp_type.__name__


# --- legitimately not offloaded: runs locally with NumPy's exact result ------------------------------

def _masked(shape, seed=0):
    r = np.random.default_rng(seed)
    return np.ma.masked_array(r.standard_normal(shape), mask=r.random(shape) < 0.2)


PASS_THROUGH = [
    # (name, id, build, why)
    ("numpy.dot", "matrix", lambda: args(np.matrix(np.arange(12.0).reshape(3, 4)), np.matrix(np.ones((4, 2)))),
     "subclass"),
    ("numpy.matmul", "matrix", lambda: args(np.matrix(np.arange(12.0).reshape(3, 4)), np.matrix(np.ones((4, 2)))),
     "subclass"),
    ("numpy.dot", "masked", lambda: args(_masked((4, 5)), _masked((5, 3), 1)), "subclass"),
    # NumPy's matmul on masked arrays raises its own ValueError: so must the shim
    ("numpy.matmul", "masked", lambda: args(_masked((4, 5)), _masked((5, 3), 1)), "subclass"),
    ("numpy.linalg.inv", "matrix", lambda: args(np.matrix(np.eye(3) * 2 + 0.5)), "subclass"),
    ("numpy.fft.fft", "masked", lambda: args(_masked(16)), "subclass"),
    ("numpy.dot", "object", lambda: args(np.arange(6).reshape(2, 3).astype(object),
                                         np.arange(3).astype(object)), "dtype object"),
    ("numpy.matmul", "object", lambda: args(np.arange(6).reshape(2, 3).astype(object),
                                            np.arange(6).reshape(3, 2).astype(object)), "dtype object"),
    ("numpy.einsum", "object", lambda: args("ij,jk", np.ones((2, 3), object), np.ones((3, 2), object)),
     "dtype object"),
    ("numpy.matmul", "float16", lambda: args(np.ones((3, 4), np.float16), np.ones((4, 2), np.float16)),
     "not offloaded for products"),
    ("numpy.matmul", "bool", lambda: args(np.ones((3, 4), bool), np.ones((4, 2), bool)),
     "not offloaded for products"),
    ("numpy.linalg.inv", "float16", lambda: args(np.eye(3, dtype=np.float16)), "float16"),  # NumPy: TypeError
    ("numpy.einsum", "single_operand_view", lambda: args("ij->ji", np.ones((3, 4))), "single-operand"),
    ("numpy.matmul", "empty", lambda: args(np.ones((0, 3)), np.ones((3, 2))), "empty"),
    ("numpy.matmul", "dtype_kw", lambda: args(np.ones((2, 3)), np.ones((3, 2)), dtype=np.float32),
     "unsupported keyword dtype"),
]


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("name,build,why", [(n, b, w) for n, _, b, w in PASS_THROUGH],
                         ids=[f"{n.removeprefix('numpy.')}-{i}" for n, i, _, _ in PASS_THROUGH])
def test_not_offloaded_runs_numpy(shim, name, build, why):
    a_args, kwargs = build()
    fn = op(name)
    exp, exp_exc = _outcome(lambda: original(fn)(*a_args, **kwargs))
    got, got_exc = _outcome(lambda: fn(*a_args, **kwargs))
    rec = last_record(shim)
    assert rec.kind == ("unsupported" if exp_exc is None else "raised"), f"{name} ran {rec.kind}: {rec.reason}"
    assert why in rec.reason, rec.reason
    assert type(got_exc) is type(exp_exc), f"NumPy: {exp_exc!r}, shim: {got_exc!r}"
    if exp_exc is not None:
        assert rec.raised == type(exp_exc).__name__
        return
    assert type(got) is type(exp)
    exp_parts = exp if isinstance(exp, tuple) else (exp,)
    got_parts = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got_parts, exp_parts):
        assert type(g) is type(e)
        assert np.asarray(g).dtype == np.asarray(e).dtype and np.shape(g) == np.shape(e)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))  # computed by NumPy itself: bit-identical
        if isinstance(e, np.ma.MaskedArray):
            np.testing.assert_array_equal(np.ma.getmaskarray(g), np.ma.getmaskarray(e))

"""Result dtypes and scalar types under offload are NumPy's own (D199): for every dtype the product
rows admit, spelled every way NumPy spells it ('q' and 'l' are both int64, yet NumPy keeps 'q'),
in either byte order, the offloaded result has NumPy's ``dtype.char`` and byte order, and a 0-d
result is a scalar of NumPy's type (``np.longlong``, not ``np.int64``)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from fusion_shim.catalog.base import PRODUCT_DTYPES
from fusion_shim.intercept import bypassed
from tests.helpers.diffutil import op, original
from tests.helpers.shims import last_record, shim_fixture, start_fresh

shim = shim_fixture(scope="module")

# every spelling of the admitted dtypes (int64 is 'l' and 'q' here), then swapped byte order
CHARS = sorted({c for c in np.typecodes["All"] if c not in "OSUVMmb?c" and np.dtype(c) in PRODUCT_DTYPES})
SPELLINGS = CHARS + [">" + c for c in CHARS if np.dtype(c).itemsize > 1 and np.dtype(c).kind != "c"] + [">c16"]


@pytest.fixture(autouse=True)
def _fresh(shim):
    start_fresh(shim)
    yield


def arr(shape: tuple, dt: str) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) % 5 + 1).reshape(shape).astype(dt)


# (catalog name, id, inputs in one dtype)
CASES: list[tuple[str, str, Callable[[str], tuple]]] = [
    ("numpy.matmul", "2d", lambda d: (arr((3, 4), d), arr((4, 2), d))),
    ("numpy.matmul", "0d", lambda d: (arr((5,), d), arr((5,), d))),
    ("numpy.dot", "2d", lambda d: (arr((3, 4), d), arr((4, 2), d))),
    ("numpy.dot", "0d", lambda d: (arr((5,), d), arr((5,), d))),
    ("numpy.inner", "2d", lambda d: (arr((3, 4), d), arr((2, 4), d))),
    ("numpy.inner", "0d", lambda d: (arr((5,), d), arr((5,), d))),
    ("numpy.vdot", "0d", lambda d: (arr((3, 4), d), arr((3, 4), d))),
    ("numpy.tensordot", "0d", lambda d: (arr((5,), d), arr((5,), d), 1)),
    ("numpy.tensordot", "2d", lambda d: (arr((3, 4), d), arr((4, 2), d), 1)),
    ("numpy.einsum", "0d", lambda d: ("i,i", arr((5,), d), arr((5,), d))),
    ("numpy.einsum", "2d", lambda d: ("ij,jk->ik", arr((3, 4), d), arr((4, 2), d))),
    ("numpy.outer", "2d", lambda d: (arr((3,), d), arr((4,), d))),
    ("numpy.kron", "2d", lambda d: (arr((2, 3), d), arr((3, 2), d))),
    ("numpy.matvec", "1d", lambda d: (arr((3, 4), d), arr((4,), d))),
    ("numpy.vecdot", "0d", lambda d: (arr((5,), d), arr((5,), d))),
    ("numpy.linalg.matmul", "2d", lambda d: (arr((3, 4), d), arr((4, 2), d))),
    ("numpy.linalg.vecdot", "0d", lambda d: (arr((5,), d), arr((5,), d))),
]


def identity(x: Any) -> tuple:
    """What must match NumPy's exactly: the type, and for arrays and scalars the dtype's char and
    byte order."""
    dt = getattr(x, "dtype", None)
    return type(x), None if dt is None else (dt.char, dt.byteorder, dt.isnative)


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("name,case,build", CASES, ids=[f"{c[0].removeprefix('numpy.')}-{c[1]}" for c in CASES])
def test_an_offloaded_result_has_numpys_dtype_char_and_scalar_type(shim, name, case, build, spelling):
    fn = op(name)
    args = build(spelling)
    with bypassed():
        want = original(fn)(*args)
    got = fn(*args)
    rec = last_record(shim)
    assert rec.kind == "worker", (rec.kind, rec.reason)
    assert identity(got) == identity(want)
    assert np.array_equal(got, want)


def test_longlong_matmul_keeps_q_and_its_scalar_is_longlong(shim):
    m, v = np.ones((2, 2), "q"), np.ones(2, "q")
    assert (m @ m).dtype.char == "q"
    assert type(v @ v) is np.longlong
    assert type(np.dot(v, v)) is np.longlong and type(np.vdot(v, v)) is np.longlong
    assert type(np.inner(v, v)) is np.longlong
    assert last_record(shim).kind == "worker"


def test_the_spellings_cover_every_admitted_dtype():
    assert {np.dtype(s) for s in SPELLINGS} >= PRODUCT_DTYPES
    assert "q" in SPELLINGS and "l" in SPELLINGS

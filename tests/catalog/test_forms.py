"""The forms of a call NumPy and SciPy accept, offloaded with NumPy's own answer (policy remote,
in-process CPU worker): einsum's interleaved form, ``dtype=``, ``casting=`` and ellipses anywhere;
array-likes as operands of any row; scipy.fft's dct/dst family; and what a row refuses up front
(an exponent past the kernel's range) or a request this side cannot encode, neither of which
marks the worker down."""
from __future__ import annotations

import numpy as np
import pytest

from fusion_shim.client import remote
from tests.helpers.diffutil import assert_close, assert_meta, op, original
from tests.helpers.shims import last_record, shim_fixture, start_fresh

sfft = pytest.importorskip("scipy.fft")
shim = shim_fixture(scope="module")


@pytest.fixture(autouse=True)
def _fresh(shim):
    start_fresh(shim)
    yield


def _both(shim, name, a_args, kwargs, size=8, where="worker"):
    fn = op(name)
    exp = original(fn)(*a_args, **kwargs)
    got = fn(*a_args, **kwargs)
    rec = last_record(shim)
    assert rec.kind == where, f"{name} ran {rec.kind}: {rec.reason}"
    assert_meta(got, exp)
    assert type(got) is type(exp)
    assert_close(got, exp, size)
    return rec


R = np.random.default_rng(3)
A34, B45, C52 = R.standard_normal((3, 4)), R.standard_normal((4, 5)), R.standard_normal((5, 2))
I4, I8 = np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(20, dtype=np.int64).reshape(4, 5)

EINSUM = [
    ("interleaved", (A34, [0, 1], B45, [1, 2], [0, 2]), {}),
    ("interleaved_implicit", (A34, [30, 0], B45, [0, 31]), {}),
    ("interleaved_tuples", (A34, (0, 1), B45, (1, 2)), {}),
    ("interleaved_ellipsis", (np.ones((2, 3, 4)), [Ellipsis, 0, 1], B45, [1, 2], [Ellipsis, 0, 2]), {}),
    ("interleaved_three", (A34, [0, 1], B45, [1, 2], C52, [2, 3], [3, 0]), {}),
    ("mixed_int_widths", ("ij,jk->ik", I4, I8), {}),
    ("mixed_int_widths_dtype", ("ij,jk->ik", I4, I8), {"dtype": np.int64}),
    ("dtype_f4_unsafe", ("ij,jk", A34, B45), {"dtype": np.float32, "casting": "unsafe"}),
    ("dtype_f8_from_ints", ("ij,jk", I4, I8), {"dtype": "f8"}),
    ("casting_same_kind", ("ij,jk", A34.astype(np.float32), B45), {"casting": "same_kind"}),
    ("casting_no_same_dtypes", ("ij,jk", A34, B45), {"casting": "no"}),
    ("ellipsis_middle", ("i...j,j...k->...ik", np.ones((3, 2, 4)), np.ones((4, 2, 5))), {}),
    ("ellipsis_broadcast", ("...ij,jk", np.ones((2, 1, 3, 4)), B45), {}),
    ("ellipsis_both_ends", ("...j,j...->...", np.ones((3, 4)), np.ones((4, 3))), {}),
    ("ellipsis_implicit_output", ("i...,i...", A34, A34), {}),
]


@pytest.mark.parametrize("a_args,kwargs", [c[1:] for c in EINSUM], ids=[c[0] for c in EINSUM])
def test_einsum_forms_run_on_the_worker_with_numpys_result(shim, a_args, kwargs):
    _both(shim, "numpy.einsum", a_args, kwargs)


@pytest.mark.parametrize("a_args,kwargs", [
    (("ij,jk", A34, B45), {"dtype": np.float32}),  # f8 -> f4 is not 'safe': NumPy raises
    (("ij,jk", I4, I8), {"casting": "no"}),
    ((A34, [0, 60], B45, [60, 1]), {}),  # a label past 51
], ids=["dtype_not_safe", "casting_no_mixed", "label_out_of_range"])
def test_einsum_forms_numpy_rejects_are_refused_up_front(shim, a_args, kwargs):
    fn = op("numpy.einsum")
    with pytest.raises(Exception) as exp:
        original(fn)(*a_args, **kwargs)
    with pytest.raises(type(exp.value)):
        fn(*a_args, **kwargs)
    assert last_record(shim).kind in ("unsupported", "raised")


ARRAY_LIKES = [
    ("numpy.matmul", ([[1, 2], [3, 4]], [[5], [6]]), {}),
    ("numpy.matmul", ([[1.0, 2.0]], np.ones((2, 3), np.float32)), {}),
    ("numpy.dot", ([1.5, 2.0], (3.0, 4.0)), {}),
    ("numpy.tensordot", ([[1.0, 2.0]], [[3.0], [4.0]]), {"axes": 1}),
    ("numpy.einsum", ("ij,jk", [[1.0, 2.0]], [[3.0], [4.0]]), {}),
    ("numpy.einsum", (",i->i", 2.0, np.ones(3, np.float32)), {}),
    ("numpy.einsum", (",i->i", 2, np.arange(3, dtype=np.int32)), {}),
    ("numpy.outer", (2.0, np.ones(3, np.float32)), {}),
    ("numpy.kron", ([1, 2], np.ones(2, np.float32)), {}),
    ("numpy.linalg.solve", ([[2.0, 1.0], [1.0, 3.0]], [1.0, 2.0]), {}),
    ("numpy.linalg.inv", (((2, 1), (1, 3)),), {}),
    ("numpy.linalg.det", ([[2, 1], [1, 3]],), {}),
    ("numpy.fft.fft", ([1.0, 2.0, 3.0, 4.0],), {}),
    ("numpy.fft.irfft", ([1.0, 2.0, 3.0],), {}),
    ("scipy.fft.dct", ([1.0, 2.0, 3.0, 4.0],), {}),
]


@pytest.mark.parametrize("name,a_args,kwargs", ARRAY_LIKES,
                         ids=[f"{n.rpartition('.')[2]}-{i}" for i, (n, _, _) in enumerate(ARRAY_LIKES)])
def test_array_likes_are_converted_as_numpy_converts_them(shim, name, a_args, kwargs):
    _both(shim, name, a_args, kwargs)


def test_a_ragged_list_is_left_to_numpy_and_raises_its_error(shim):
    fn = op("numpy.matmul")
    with pytest.raises(ValueError):
        fn([[1.0, 2.0], [3.0]], np.ones((2, 2)))
    assert last_record(shim).kind in ("unsupported", "raised")


R2R = [(k, t, nm, dt) for k in ("dct", "idct", "dst", "idst") for t in (1, 2, 3, 4)
       for nm in (None, "backward", "ortho", "forward") for dt in ("float32", "float64")]


@pytest.mark.parametrize("kind,type_,norm,dtype", R2R, ids=[f"{k}{t}-{nm}-{dt}" for k, t, nm, dt in R2R])
def test_dct_dst_family_matches_scipy(shim, kind, type_, norm, dtype):
    x = np.random.default_rng(type_).standard_normal((3, 7)).astype(dtype)
    _both(shim, f"scipy.fft.{kind}", (x, type_), {"norm": norm}, size=16)


@pytest.mark.parametrize("kwargs", [{"axis": 0}, {"n": 10}, {"n": 4, "axis": 0}, {"n": 3}],
                         ids=["axis0", "pad", "cut_axis0", "cut"])
@pytest.mark.parametrize("kind", ["dct", "idst"])
def test_dct_dst_axis_and_n_match_scipy(shim, kind, kwargs):
    x = np.asfortranarray(np.random.default_rng(1).standard_normal((6, 5)))
    _both(shim, f"scipy.fft.{kind}", (x, 2), kwargs, size=16)


def test_dct_of_integers_is_double_as_in_scipy(shim):
    _both(shim, "scipy.fft.dct", (np.arange(8, dtype=np.int16),), {"norm": "ortho"}, size=16)


@pytest.mark.parametrize("a_args,kwargs", [((np.ones(1), 1), {}), ((np.ones(4),), {"orthogonalize": False}),
                                           ((np.ones(4, complex),), {}), ((np.ones(4), 5), {})],
                         ids=["dct1_of_one_point", "orthogonalize", "complex", "type5"])
def test_dct_forms_not_served_are_refused_up_front(shim, a_args, kwargs):
    fn = op("scipy.fft.dct")
    exp = exp_exc = None
    try:
        exp = original(fn)(*a_args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - SciPy's error must reach the caller
        exp_exc = exc
    if exp_exc is not None:
        with pytest.raises(type(exp_exc)):
            fn(*a_args, **kwargs)
    else:
        np.testing.assert_array_equal(fn(*a_args, **kwargs), exp)
    assert last_record(shim).kind in ("unsupported", "raised")


def test_matrix_power_past_the_kernels_range_runs_here_and_the_worker_stays_up(shim):
    a = np.eye(3) * 0.5
    exp = original(np.linalg.matrix_power)(a, 2**100 + 1)
    got = np.linalg.matrix_power(a, 2**100 + 1)
    rec = last_record(shim)
    assert rec.kind == "unsupported" and "range" in rec.reason, rec.reason
    np.testing.assert_array_equal(got, exp)
    assert shim.link.state in ("ready", "busy")
    _both(shim, "numpy.linalg.matrix_power", (a, 3), {})


def test_a_request_this_side_cannot_encode_runs_here_and_is_no_worker_fault(shim, monkeypatch):
    header = remote.call_header
    monkeypatch.setattr(remote, "call_header",
                        lambda rid, prep, keep=False: {**header(rid, prep, keep), "params": {"cdtype": "<f8",
                                                                                             "n": 2**70}})
    a, b = A34 + 0.0, B45 + 0.0  # a layout no template holds yet
    got = np.matmul(a, b)
    rec = last_record(shim)
    assert rec.kind == "fallback" and "could not be encoded" in rec.reason, rec.reason
    assert rec.fallback == "unencodable"  # D323
    assert shim.ledger.snapshot_ops()["numpy.matmul"]["fallbacks_by_kind"] == {"unencodable": 1}
    np.testing.assert_array_equal(got, original(np.matmul)(a, b))
    monkeypatch.undo()
    assert shim.link.state in ("ready", "busy")
    _both(shim, "numpy.matmul", (a, b), {})

"""NumPy's floating-point error state under offload (D198): every row that can produce inf or nan,
offload forced (policy remote, the in-process CPU worker, as in test_differential), under each mode
of ``np.errstate`` (ignore, warn, raise, call, print, log) gives the program what plain NumPy gives:
the same exception with its message, the same warnings, the same calls of the error handler, the
same printed line. A call whose result holds inf or nan while the state asks to hear of them is
computed here (NumPy reports it itself); ``under`` other than ignore computes every call here."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

from fusion_shim.intercept import bypassed
from tests.helpers.diffutil import op, original
from tests.helpers.shims import last_record, shim_fixture, start_fresh

shim = shim_fixture(scope="module")

MODES = ("ignore", "warn", "raise", "call", "print", "log")
INF, BIG = np.inf, 1e300


@pytest.fixture(autouse=True)
def _fresh(shim):
    start_fresh(shim)
    yield


def mat(n: int, m: int, fill: float = 1.0, dtype: str = "float64") -> np.ndarray:
    """An n x m matrix of ones whose first row holds +inf, -inf (then ``fill``): inf - inf is nan."""
    a = np.ones((n, m), dtype)
    a[0, :2] = INF, -INF
    if fill != 1.0:
        a[1:] = fill
    return a


def vec(n: int, dtype: str = "float64") -> np.ndarray:
    v = np.ones(n, dtype)
    v[:2] = INF, -INF
    return v


def big(*shape: int, dtype: str = "float64") -> np.ndarray:
    return np.full(shape, BIG, dtype)


ones = np.ones
# (catalog name, id, inputs): each makes inf or nan in its result; NumPy reports it for some (it
# checks the flags after products and FFTs; numpy.linalg sets its own state, vdot and einsum none)
CASES: list[tuple[str, str, Callable[[], tuple[tuple, dict]]]] = [
    ("numpy.matmul", "nan", lambda: ((mat(4, 3), ones((3, 5))), {})),
    # D354: a result the worker scans itself (its bytes in the window): its reply must not say finite
    ("numpy.matmul", "nan_64", lambda: ((mat(64, 64), ones((64, 64))), {})),
    ("numpy.matmul", "over", lambda: ((big(4, 3), big(3, 5)), {})),
    ("numpy.matmul", "nan_complex", lambda: ((mat(4, 3, dtype="complex128"), ones((3, 2), "complex128")), {})),
    ("numpy.dot", "vec_nan", lambda: ((np.array([1.0, 1.0]), np.array([-INF, INF])), {})),
    ("numpy.dot", "nd_nan", lambda: ((np.stack([mat(3, 4)] * 2), ones((2, 4, 3))), {})),
    ("numpy.dot", "over", lambda: ((big(3, 4), big(4, 2)), {})),
    ("numpy.vdot", "nan", lambda: ((vec(6), ones(6)), {})),
    ("numpy.inner", "nan", lambda: ((mat(3, 4), ones((2, 4))), {})),
    ("numpy.outer", "over", lambda: ((big(4), big(5)), {})),
    ("numpy.kron", "over", lambda: ((big(2, 3), big(3, 2)), {})),
    ("numpy.tensordot", "nan", lambda: ((mat(3, 4), ones((4, 2))), {"axes": 1})),
    ("numpy.einsum", "nan", lambda: (("ij,jk->ik", mat(3, 4), ones((4, 2))), {})),
    ("numpy.matvec", "nan", lambda: ((mat(3, 4), ones(4)), {})),
    ("numpy.vecdot", "nan", lambda: ((vec(5), ones(5)), {})),
    ("numpy.linalg.multi_dot", "over", lambda: (([big(3, 4), big(4, 5), ones((5, 2))],), {})),
    ("numpy.linalg.solve", "over", lambda: ((np.eye(4) * 1e-300, big(4, 2)), {})),
    ("numpy.linalg.inv", "inf", lambda: ((np.diag([INF, 1.0, 1.0, 1.0]),), {})),
    ("numpy.linalg.inv", "tiny", lambda: ((np.eye(4) * 1e-310,), {})),
    ("numpy.linalg.det", "over", lambda: ((np.eye(4) * 1e200,), {})),
    ("numpy.linalg.norm", "over", lambda: ((big(5, 4),), {})),
    ("numpy.linalg.svd", "big", lambda: ((np.full((5, 4), 1e308),), {"compute_uv": False})),
    ("numpy.linalg.matrix_power", "over", lambda: ((big(3, 3), 3), {})),
    ("numpy.fft.fft", "inf", lambda: ((vec(16),), {})),
    ("numpy.fft.ifft", "inf", lambda: ((vec(16, "complex128"),), {})),
    ("numpy.fft.rfft", "inf", lambda: ((vec(16),), {})),
    ("numpy.fft.irfft", "inf", lambda: ((vec(9, "complex128"),), {})),
    ("numpy.fft.fft2", "inf", lambda: ((mat(4, 8),), {})),
    ("numpy.fft.rfftn", "inf", lambda: ((np.stack([mat(4, 8)] * 2),), {})),
    ("numpy.fft.fft", "over", lambda: ((np.full(16, 1e308),), {})),
]


def outcome(fn: Callable, a_args: tuple, kwargs: dict, mode: str, capfd: Any, under: str = "ignore") -> tuple:
    """What the program sees of one call under ``mode`` for divide, over and invalid: (exception
    type and message, warnings, error-handler calls, printed text)."""
    calls: list = []

    class Log:
        def write(self, msg: str) -> None:
            calls.append(("log", msg))

    handler = {"call": lambda err, flag: calls.append(("call", err, flag)), "log": Log()}.get(mode)
    capfd.readouterr()
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with np.errstate(divide=mode, over=mode, invalid=mode, under=under, call=handler):
            try:
                fn(*a_args, **kwargs)
            except Exception as exc:
                raised = (type(exc), str(exc))
    out = capfd.readouterr()
    return raised, [(w.category, str(w.message)) for w in caught], calls, out.out + out.err


def numpy_and_shim(shim, name: str, build: Callable, mode: str, capfd: Any, under: str = "ignore") -> tuple:
    fn = op(name)
    assert original(fn) is not fn, f"{name} is not intercepted"
    a_args, kwargs = build()
    with bypassed():
        want = outcome(original(fn), a_args, kwargs, mode, capfd, under)
    a_args, kwargs = build()
    got = outcome(fn, a_args, kwargs, mode, capfd, under)
    return want, got, last_record(shim)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,case,build", CASES, ids=[f"{c[0].removeprefix('numpy.')}-{c[1]}" for c in CASES])
def test_an_offloaded_call_reports_floating_point_errors_as_numpy_does(shim, capfd, name, case, build, mode):
    want, got, rec = numpy_and_shim(shim, name, build, mode, capfd)
    assert got == want
    # the worker refuses some rows' inf inputs; else the call stays there unless the result holds
    # inf or nan and the state asks to hear of them (never under ignore)
    here = rec.kind in ("fallback", "raised")  # raised: NumPy's error, the state's mode being raise
    refused = here and "non-finite input" in rec.reason
    reported_here = mode != "ignore" and here and "np.geterr()" in rec.reason
    assert rec.kind == "worker" or refused or reported_here, (rec.kind, rec.reason)
    # D323: a raised call is no fallback; the worker's refusal and the error state's are their own kinds
    assert rec.fallback == (None if rec.kind != "fallback" else "not_reproducible" if refused else "error_state")


def test_numpy_reports_something_for_cases_of_each_family(shim, capfd):
    """Else the test above would prove nothing but silence for that family."""
    reported = set()
    for name, case, build in CASES:
        a_args, kwargs = build()
        with bypassed():
            raised, caught, _, _ = outcome(original(op(name)), a_args, kwargs, "warn", capfd)
        if raised is not None or caught:
            reported.add(name)
    assert {"numpy.matmul", "numpy.dot", "numpy.inner", "numpy.fft.fft"} <= reported, reported
    assert any(n.startswith("numpy.linalg.") for n in reported), reported


def test_the_cases_cover_the_products_linalg_and_fft_rows():
    names = {c[0] for c in CASES}
    assert {"numpy.matmul", "numpy.dot", "numpy.vdot", "numpy.inner", "numpy.einsum", "numpy.tensordot"} <= names
    assert any(n.startswith("numpy.linalg.") and n != "numpy.linalg.multi_dot" for n in names)
    assert any(n.startswith("numpy.fft.") for n in names)


def test_invalid_raise_in_dot_raises_numpys_floating_point_error(shim):
    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError, match="invalid value encountered in dot"):
        np.dot(np.array([1.0, 1.0]), np.array([-INF, INF]))
    rec = last_record(shim)
    assert rec.kind == "raised" and "inf or nan" in rec.reason


def test_the_default_state_warns_as_numpy_does(shim):
    with pytest.warns(RuntimeWarning, match="invalid value encountered in matmul"):
        np.matmul(mat(4, 3), ones((3, 5)))


def test_a_finite_result_stays_on_the_worker_under_the_default_state(shim):
    got = np.matmul(ones((4, 3)), ones((3, 5)))
    assert last_record(shim).kind == "worker" and (got == 3).all()


@pytest.mark.parametrize("mode", [m for m in MODES if m != "ignore"])
def test_underflow_reported_in_any_mode_computes_the_call_here(shim, capfd, mode):
    tiny = np.full((3, 3), 1e-200)
    want, got, rec = numpy_and_shim(shim, "numpy.matmul", lambda: ((tiny, tiny), {}), "ignore", capfd,
                                    under=mode)
    assert got == want
    assert rec.kind in ("fallback", "raised") and f"under={mode!r}" in rec.reason
    assert rec.fallback == ("error_state" if rec.kind == "fallback" else None)  # D323


def test_seterr_outside_a_context_is_honoured_too(shim):
    old = np.seterr(over="raise")
    try:
        with pytest.raises(FloatingPointError, match="overflow encountered in matmul"):
            np.matmul(big(3, 3), big(3, 3))
    finally:
        np.seterr(**old)
    with pytest.warns(RuntimeWarning, match="overflow encountered in matmul"):  # the default state again
        np.matmul(big(3, 3), big(3, 3))
    with np.errstate(all="ignore"):
        np.matmul(big(3, 3), big(3, 3))
    assert last_record(shim).kind == "worker"


def test_the_error_state_is_read_once_per_state_not_per_call(monkeypatch):
    from fusion_shim.client import call

    reads = []
    real = np.geterr
    monkeypatch.setattr(call.np, "geterr", lambda: reads.append(1) or real())
    with np.errstate(invalid="raise"):
        first = call.fp_state()
        assert call.fp_state() == first == (None, True)
        n = len(reads)
        assert n <= 1
        with np.errstate(all="ignore"):
            assert call.fp_state() == (None, False)
        assert len(reads) == n + 1
        with np.errstate(under="log"):
            assert call.fp_state()[0] is not None


def test_the_operators_and_the_dot_method_honour_the_error_state_too(shim):
    a, b = mat(4, 3), ones((3, 5))
    with np.errstate(invalid="raise"):
        with pytest.raises(FloatingPointError, match="invalid value encountered in matmul"):
            a @ b
        with pytest.raises(FloatingPointError, match="invalid value encountered in dot"):
            a.dot(b)
    assert last_record(shim).kind == "raised"


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8", "c8", "c16", "g"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (5,)])
def test_a_result_is_found_nonfinite_exactly_where_isfinite_says_so(dtype, shape):
    from fusion_shim.client.remote import nonfinite

    values = [1.0, np.inf, -np.inf, np.nan, complex(1, np.nan), complex(np.inf, 0)]
    for v in values if np.dtype(dtype).kind == "c" else values[:4]:
        a = np.ones(shape, dtype)
        a.flat[-1] = v
        assert nonfinite([a]) == (not np.isfinite(a).all()), (dtype, shape, v)
    big = np.array([np.longdouble("1e400") if dtype == "g" else 1.0], dtype)  # finite past float64's range
    assert nonfinite([big]) == (not np.isfinite(big).all())

"""A call is the program's only when the program makes it (D285): the calls NumPy and SciPy make
inside an intercepted function, or from their own frames, pass straight through to NumPy, uncounted
and undecided, the same under every policy."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import fusion_shim
from tests.helpers.environment import NATIVE_OFF
from tests.helpers.shims import READY_S

pytestmark = pytest.mark.usefixtures("no_shim_after")

PATHS = [pytest.param(False, id="wrapt")] + ([] if NATIVE_OFF else [pytest.param(True, id="C")])


def _program() -> None:
    """Six calls of the program's own; NumPy's norm and SciPy's expm make more inside them."""
    rng = np.random.default_rng(0)
    v, m = rng.standard_normal(300), rng.standard_normal((40, 40)) / 40
    np.linalg.norm(v)  # a catalog row whose NumPy body calls v.dot(v)
    np.linalg.norm(m, 2)  # calls svd inside
    scipy.linalg.expm(m)  # not a row: SciPy's frames call np.dot, @ and solve
    scipy.linalg.solve_sylvester(m, m.T, m)  # not a row: np.dot four times from SciPy's frames
    scipy.linalg.solve(m + np.eye(40), v[:40])
    np.dot(m, m)
    np.linalg.inv(m + np.eye(40))


def _counted(rt) -> int:
    ops = fusion_shim.report(format="json")["ops"]
    return sum(agg["calls"] + agg["below_floor"] for agg in ops.values())


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("policy", ["local", "auto", "remote"])
def test_calls_made_inside_numpy_and_scipy_count_as_the_outer_call(inproc_worker, policy, native):
    options = {} if policy == "local" else {"worker": inproc_worker, "timeout": 60.0}
    rt = fusion_shim.install(policy=policy, quiet=True, native=native, **options)
    if policy != "local":
        assert rt.link.wait_ready(READY_S), list(rt.ledger.events)
    rt.ledger.clear()
    _program()
    assert _counted(rt) == 6, fusion_shim.report(format="json")["ops"]


@pytest.mark.skipif(NATIVE_OFF, reason="FUSION_SHIM_NATIVE=0 was set for this run: no extension")
def test_a_product_called_from_a_library_frame_passes_through(inproc_worker):
    from scipy.sparse.linalg import aslinearoperator

    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, timeout=60.0)
    assert rt.link.wait_ready(READY_S), list(rt.ledger.events)
    a, x = np.ones((40, 30)), np.ones((30, 5))
    rt.ledger.clear()
    aslinearoperator(a).matmat(x)  # SciPy's _matmat: self.A.dot(X), from SciPy's frame
    a.dot(x)  # the program's
    assert [r.op for r in rt.ledger.records] == ["numpy.ndarray.dot"]
    assert "test_outer_calls.py" in rt.ledger.records[0].site


def test_library_modules_are_numpy_and_scipy_and_their_submodules_but_not_their_tests():
    from fusion_shim.intercept import _library_module

    assert [_library_module(n) for n in ("numpy", "numpy.linalg._linalg", "scipy.sparse", "numpy_helpers",
                                          "__main__", None, "numpy.linalg.tests.test_linalg", "scipy.tests")] \
        == [True, True, True, False, False, False, False, False]


@pytest.mark.skipif(NATIVE_OFF, reason="FUSION_SHIM_NATIVE=0 was set for this run: no extension")
@pytest.mark.parametrize("name, library", [("scipy.linalg._solvers", True), ("numpy.linalg.tests.test_linalg", False),
                                           ("numpy.tests", False), ("numpyish", False), ("app", False)])
def test_the_c_check_classifies_a_callers_module_as_python_does(name, library):
    from fusion_shim.intercept import LIBRARIES, _library_module, native

    assert native.available()
    native.publish_libraries(LIBRARIES)
    probe = eval("lambda: library_caller()", {"__name__": name, "library_caller": native._native.library_caller})
    assert probe() is library is _library_module(name)

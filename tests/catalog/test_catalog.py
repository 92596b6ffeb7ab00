"""The catalog as data (issue 4): every public function of numpy.linalg and numpy.fft is a row or
is listed as not offloaded with its reason; every row matches the installed library's signature,
names a kernel the worker has and a trigger module the interceptor hooks; a rule that trips over
an argument makes the call local instead of raising; and the worker refuses the decisions another
LAPACK could take the other way (``NotReproducible``)."""
from __future__ import annotations

import importlib
import inspect

import numpy as np
import numpy.fft
import numpy.linalg
import pytest

from fusion_shim import intercept
from fusion_shim.catalog.base import unwrap
from fusion_shim.catalog import BY_NAME, CATALOG, NOT_ARRAY_FUNCTIONS, NOT_OFFLOADED, OpSpec, Unsupported, \
    check_names, check_signature, prepare
from fusion_shim.catalog import _parameter_names

from tests.helpers.environment import ROOT

torch = pytest.importorskip("torch")
from fusion_shim.worker import kernels, numba_kernels  # noqa: E402  (the worker side needs torch)
from fusion_shim.worker.kernels import common, linalg, scipy_linalg  # noqa: E402


def _public_functions(module) -> set[str]:
    return {f"{module.__name__}.{name}" for name in dir(module)
            if not name.startswith("_") and callable(getattr(module, name))}


@pytest.mark.parametrize("module", [numpy.linalg, numpy.fft], ids=["numpy.linalg", "numpy.fft"])
def test_every_public_function_is_a_row_or_says_why_not(module):
    public = _public_functions(module) - NOT_ARRAY_FUNCTIONS
    rows = {spec.name for spec in CATALOG}
    unaccounted = sorted(public - rows - set(NOT_OFFLOADED))
    assert not unaccounted, f"neither a row nor in NOT_OFFLOADED: {unaccounted}"


def test_not_offloaded_names_exist_have_reasons_and_are_not_rows():
    for name, reason in NOT_OFFLOADED.items():
        module, _, attr = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), name
        assert name not in BY_NAME, f"{name} is a row and listed as not offloaded"
        assert len(reason) > 20, f"{name}: say why"
    for name in NOT_ARRAY_FUNCTIONS:
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name


def test_rows_are_unique_and_named_after_where_they_live():
    names = [spec.name for spec in CATALOG]
    assert len(names) == len(set(names))
    for spec in CATALOG:
        assert spec.name == f"{spec.module}.{spec.attr}", spec.name
        assert spec.module == spec.trigger or spec.module.startswith(spec.trigger + "."), spec.name


def test_every_trigger_is_hooked_by_the_interceptor():
    assert {spec.trigger for spec in CATALOG} == set(intercept.TRIGGERS)
    assert intercept.TRIGGERS[0] == "numpy"  # NumPy's hook creates the runtime; the others follow it


@pytest.mark.parametrize("spec", CATALOG, ids=lambda s: s.name)
def test_row_matches_the_installed_signature_and_has_a_kernel(spec):
    if spec.trigger != "numpy":
        pytest.importorskip(spec.trigger)
    func = getattr(importlib.import_module(spec.module), spec.attr)
    func = unwrap(func)
    sig = check_signature(spec, func)
    assert spec.args and all(a in sig.parameters for a in spec.args)
    names = _parameter_names(func)  # what the install checks, read off the code (D116)
    if names is not None:  # a ufunc has no code to read: check_names asks inspect
        assert names == set(sig.parameters)
    check_names(spec, func)
    # numba rows (issue 9) have their kernels in numba_kernels, offered where numba can run them
    assert spec.kernel_id in kernels.KERNELS or spec.kernel_id in numba_kernels.KERNEL_IDS, \
        f"{spec.name}: no kernel {spec.kernel_id!r} on the worker"
    assert spec.family in ("products", "linalg", "fft")


def test_a_rule_that_trips_makes_the_call_local():
    def clumsy(spec, ba):
        return {}["missing"]  # a bug in a rule, not the caller's error

    spec = OpSpec("numpy.dot", "numpy", "dot", "products", clumsy, ("out",))
    with pytest.raises(Unsupported, match="rule error: KeyError"):
        prepare(spec, inspect.signature(np.dot), (np.ones(2), np.ones(2)), {})


def test_unknown_keywords_stay_local():
    spec = BY_NAME["numpy.einsum"]
    with pytest.raises(Unsupported, match="unsupported keyword order"):
        prepare(spec, inspect.signature(np.einsum), ("ij,jk", np.ones((2, 2)), np.ones((2, 2))),
                {"order": "F"})


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((3,), (2, 3)), ((2, 1, 3), (4, 3))])
def test_cross_of_plain_and_batched_vectors_is_offloaded(shapes):
    """A batch computed with np.delete is an array, empty for plain vectors: the rule reads its length."""
    spec = BY_NAME["numpy.linalg.cross"]
    a, b = (np.ones(s, np.int32) for s in shapes)
    prep = prepare(spec, inspect.signature(np.linalg.cross), (a, b), {})
    assert prep.results[0][1] == np.linalg.cross(a, b).shape


def test_linalg_computes_in_double_and_returns_numpys_type():
    """numpy.linalg runs LAPACK in double and casts single-precision results back: the row asks the
    worker for exactly that."""
    spec = BY_NAME["numpy.linalg.inv"]
    prep = prepare(spec, inspect.signature(np.linalg.inv), (np.eye(3, dtype=np.float32) * 2,), {})
    assert prep.params["cdtype"] == np.dtype("f8").str and prep.params["rdtypes"] == [np.dtype("f4").str]
    assert prep.results[0][0] == np.float32
    spec = BY_NAME["numpy.linalg.solve"]
    prep = prepare(spec, inspect.signature(np.linalg.solve), (np.eye(3, dtype=">c8"), np.ones(3, np.int64)), {})
    assert prep.params["cdtype"] == np.dtype("c16").str and prep.results[0][0] == np.complex128


# --- the worker's refusals -------------------------------------------------------------------------

def t(x, dtype=torch.float64):
    return torch.tensor(np.asarray(x), dtype=dtype)


def test_worker_refuses_a_nearly_singular_solve_but_not_a_well_posed_one():
    with pytest.raises(common.NotReproducible):
        linalg._solve([t([[1.0, 2.0], [2.0, 4.0 + 1e-17]]), t([1.0, 1.0])], {})
    x = linalg._solve([t([[2.0, 1.0], [1.0, 3.0]]), t([1.0, 2.0])], {})[0]
    np.testing.assert_allclose(x.numpy(), np.linalg.solve([[2.0, 1.0], [1.0, 3.0]], [1.0, 2.0]))


def test_worker_decides_eig_realness_only_when_it_is_clear_cut():
    rotation = t([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: clearly complex
    assert linalg._eig([rotation], {"vectors": False, "real_input": True})[0].imag.abs().max() == 1
    distinct = t([[1.0, 5.0], [0.0, 2.0]])  # 1 and 2: clearly real
    linalg._eig([distinct], {"vectors": True, "real_input": True})
    jordan = t([[1.0, 1.0], [0.0, 1.0]])  # a double eigenvalue: another LAPACK may split it
    with pytest.raises(common.NotReproducible):
        linalg._eig([jordan], {"vectors": True, "real_input": True})
    stack = torch.stack([jordan, rotation])  # one clearly complex eigenvalue decides for the stack
    linalg._eig([stack], {"vectors": False, "real_input": True})


def test_worker_refuses_a_singular_value_next_to_the_cutoff():
    s = torch.tensor([1.0, 0.5, 3e-16], dtype=torch.float64)
    with pytest.raises(common.NotReproducible):
        common._check_cut(s, 3 * 2.2e-16, 3)  # matrix_rank's default tolerance for 3x3: too close
    common._check_cut(s, 1e-3, 3)  # far from every singular value
    common._check_cut(torch.zeros(3, dtype=torch.float64), 0.0, 3)  # the zero matrix: exactly rank 0


def test_worker_refuses_non_finite_input():
    with pytest.raises(common.NotReproducible):
        linalg._inv([t([[1.0, np.nan], [0.0, 1.0]])], {})


def test_scipy_condition_estimate_is_a_lower_bound_close_to_the_truth():
    rng = np.random.default_rng(0)
    for n in (2, 5, 20):
        a = torch.tensor(rng.standard_normal((n, n)))
        solve, solve_h = scipy_linalg._s_factor(a, "gen")
        est = float(scipy_linalg._inv_norm1_estimate(solve, solve_h, a))
        exact = float(np.abs(np.linalg.inv(a.numpy())).sum(0).max())
        assert exact / 3 <= est <= exact * (1 + 1e-12), (n, est, exact)


_NO_LAZY_IMPORTS = r'''
import sys
from tests.catalog import test_differential as td
from fusion_shim.catalog import BY_NAME, Unsupported, prepare
from fusion_shim.catalog.base import unwrap
from fusion_shim.client.remote import call_message
from fusion_shim.worker.server import Worker
import inspect, scipy.linalg  # noqa: F401  (the scipy rows' functions)
from fusion_shim.protocol import wire
worker = Worker("cpu")
ran = []
for case in td.CASES:
    spec = BY_NAME[case.op]
    a, k = case.build(td.Maker(case.dtypes[0], "C"))
    fn = unwrap(td.op(case.op))
    try:
        prep = prepare(spec, inspect.signature(fn), a, k)
    except Unsupported:
        continue
    header, _ = wire.decode(worker.handle(call_message(1, prep)))
    ran.append((case.op, header["t"]))
assert sum(t == "result" for _, t in ran) > 100, ran
print(sorted(m for m in sys.modules if m.split(".")[0] in ("sympy", "mpmath")))
'''


def test_no_kernel_imports_sympy_on_its_first_call():
    """torch.broadcast_shapes' first call imports sympy (487 modules): 0.28-0.45 s charged to the
    first solve a worker ran, which the planner then priced that op off. Every differential case's
    kernel runs once in a fresh worker, and none may pull it in."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_LAZY_IMPORTS], capture_output=True, text=True, timeout=600,
                         cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]


def test_check_names_refuses_a_row_naming_a_parameter_the_function_lacks():
    def solve(a, b, *, lower=False):
        return a

    assert _parameter_names(solve) == {"a", "b", "lower"}
    check_names(OpSpec("x.solve", "x", "solve", "linalg", "linalg.rule_solve", ("lower",)), solve)
    with pytest.raises(TypeError, match="'upper'"):
        check_names(OpSpec("x.solve", "x", "solve", "linalg", "linalg.rule_solve", ("upper",)), solve)

    def wrapped(*args, **kwargs):
        return solve(*args, **kwargs)

    wrapped.__wrapped__ = solve
    assert _parameter_names(wrapped) == {"a", "b", "lower"}  # inspect follows __wrapped__ too

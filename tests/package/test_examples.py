"""Every example prints the same numbers through the shim (forced remote) as under plain python,
and across the examples the report shows each family computed on the worker."""
import json
import subprocess
import sys

import pytest

from tests.helpers.environment import NATIVE_OFF, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
SIZE = "512"  # smaller than the defaults: the point is equal answers, not speed


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def families_on_worker():
    return set()


@pytest.fixture(scope="module")
def reports():
    return {}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_same_output_under_remote(example, tmp_path, families_on_worker, reports):
    plain = _run(str(example), SIZE)
    assert plain.returncode == 0, plain.stderr
    report = tmp_path / "run.json"
    shim = _run("-m", "fusion_shim", "--policy", "remote", "--report", str(report), str(example), SIZE)
    assert shim.returncode == 0, shim.stderr
    assert shim.stdout == plain.stdout
    assert "fusion_shim report" in shim.stderr  # the table, on stderr
    data = json.loads(report.read_text())
    assert data["schema"] == "fusion_shim.report/1"
    reports[example.stem] = data
    if example.stem == "mlp_numpy" and NATIVE_OFF:
        return  # its products are all operators: without the extension nothing is intercepted
    ops = data["ops"]
    assert ops and all(o["fallback"] == 0 for o in ops.values()), ops
    for o in ops.values():
        if o["worker"]:
            families_on_worker.add(o["family"])
    assert sum(o["worker"] for o in ops.values()) > 0


def test_every_family_ran_on_the_worker(families_on_worker):
    if len(families_on_worker) == 0:
        pytest.skip("runs after the example tests")
    assert families_on_worker == {"products", "linalg", "fft"}


@pytest.mark.skipif(NATIVE_OFF, reason="FUSION_SHIM_NATIVE=0 was set for this run: no extension")
def test_operator_only_example_computes_its_products_on_the_worker(reports):
    """examples/mlp_numpy.py multiplies only with `@`, `@=` and `.dot` (issue 3): every product it
    makes is intercepted by the C trampolines and computed on the worker."""
    source = (ROOT / "examples" / "mlp_numpy.py").read_text()
    assert "np.matmul" not in source and "np.dot" not in source and "einsum" not in source
    if "mlp_numpy" not in reports:
        pytest.skip("runs after the example tests")
    data = reports["mlp_numpy"]
    assert data["operators"]["intercepted"] is True, data["operators"]
    ops = data["ops"]
    assert set(ops) == {"numpy.ndarray.__matmul__", "numpy.ndarray.__imatmul__", "numpy.ndarray.dot"}, ops
    for name, o in ops.items():
        assert o["calls"] == o["worker"] > 0 and o["below_floor"] == 0, (name, o)


def test_example_same_output_under_auto():
    example = ROOT / "examples" / "lstsq_fit.py"
    plain = _run(str(example), SIZE)
    shim = _run("-m", "fusion_shim", "--quiet", str(example), SIZE)
    assert shim.returncode == 0, shim.stderr
    assert shim.stdout == plain.stdout

"""The pytest plugin: ``pytest --fusion-shim=POLICY`` runs a user's suite through the shim, with one
report for the session, per-test records, xdist's processes merged, and pytest-benchmark's
``extra_info``; off unless asked. Each suite runs in a pytest subprocess that loads the plugin by name
(``-p``: an install registers it as a ``pytest11`` entry point), with this tree's package."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusion_shim
from tests.helpers.environment import ROOT
from tests.helpers.shims import READY_S

PACKAGE_ROOT = str(Path(fusion_shim.__file__).resolve().parents[1])
TIMEOUT = 1800  # a deadline for a hung run, not a target: NumPy's suites under remote on a loaded host

USER_SUITE = """\
    import sys
    import numpy as np
    import pytest

    def test_solve():
        a = np.eye(300) * 2.0
        assert np.allclose(np.linalg.solve(a, np.ones(300)), 0.5)

    def test_fft():
        assert np.fft.fft(np.ones(4096)).real[0] == 4096

    @pytest.mark.xfail(strict=True)
    def test_known_bad():
        assert np.linalg.det(np.eye(3)) == 2.0

    def test_nothing_of_numpy():
        pass
"""


def pytest_run(tmp_path: Path, *args: str, suite: str | None = USER_SUITE, **env: str) -> subprocess.CompletedProcess:
    if suite is not None:
        (tmp_path / "test_user.py").write_text(textwrap.dedent(suite))
    child = {k: v for k, v in os.environ.items() if not k.startswith(("FUSION_SHIM", "PYTEST_"))}
    child.update(PYTHONPATH=PACKAGE_ROOT, CUDA_VISIBLE_DEVICES="-1", FUSION_SHIM_READY_TIMEOUT=str(READY_S), **env)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fusion_shim.pytest_plugin", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, env=child)


def counts(r: subprocess.CompletedProcess) -> dict[str, int]:
    """pytest's closing line, as {outcome: n}."""
    line = [ln for ln in r.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)][-1]
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"(\d+) (\w+)", line) if m.group(2) != "in"}


def test_the_entry_point_is_declared_and_the_plugin_is_off_unless_asked(tmp_path):
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # named as the module, so that `-p fusion_shim.pytest_plugin` (as here) finds it already registered
    assert project["project"]["entry-points"]["pytest11"] == {"fusion_shim.pytest_plugin": "fusion_shim.pytest_plugin"}
    r = pytest_run(tmp_path, "-n0", "-q", suite="""\
        import sys
        import numpy as np

        def test_no_shim():
            np.linalg.solve(np.eye(300), np.ones(300))
            assert "fusion_shim.intercept" not in sys.modules and "fusion_shim.config" not in sys.modules
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fusion_shim" not in r.stdout


def test_an_invalid_setting_is_a_usage_error_that_lists_the_valid_ones(tmp_path):
    r = pytest_run(tmp_path, "-n0", "--fusion-shim=sometimes")
    assert r.returncode == 4 and "auto, local, remote" in r.stderr


def test_a_remote_session_reports_each_test_and_the_worker_did_the_work(tmp_path):
    r = pytest_run(tmp_path, "-n0", "-q", "--fusion-shim=remote", "--fusion-shim-verify=all",
                   "--fusion-shim-report", "run.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert counts(r) == {"passed": 3, "xfailed": 1}
    assert "= fusion_shim =" in r.stdout and "report written to run.json" in r.stdout
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["schema"] == "fusion_shim.pytest/1" and report["policy"] == "remote"
    tests = {t["nodeid"].split("::")[1]: t for t in report["tests"]}
    assert {name: t["outcome"] for name, t in tests.items()} == {
        "test_solve": "passed", "test_fft": "passed", "test_known_bad": "xfailed", "test_nothing_of_numpy": "passed"}
    assert tests["test_solve"]["offloaded_ops"] == {"numpy.linalg.solve": 1}
    assert tests["test_fft"]["offloaded_ops"] == {"numpy.fft.fft": 1}
    assert tests["test_nothing_of_numpy"]["calls"] == 0
    assert tests["test_solve"]["verified"] == 1 and report["summary"]["mismatches"] == 0
    (proc,) = report["processes"]
    assert proc["schema"] == "fusion_shim.report/1" and proc["worker"]["state"] == "ready"
    assert report["summary"]["worker"] == proc["summary"]["calls"]["worker"] >= 3


def test_under_xdist_each_process_reports_and_the_controller_merges_them(tmp_path):
    suite = "import numpy as np\n" + "".join(
        f"def test_{i}():\n    np.ones(3) @ np.ones(3)\n    np.linalg.inv(np.eye(2))\n" for i in range(8))
    r = pytest_run(tmp_path, "-n", "2", "-q", "--fusion-shim=auto", "--fusion-shim-report", "run.json", suite=suite)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert len(report["processes"]) == 2 and len(report["tests"]) == 8
    assert {t["process"] for t in report["tests"]} == {"gw0", "gw1"}
    per_test = sum(t["below_floor"] + t["calls"] for t in report["tests"])
    assert per_test == report["summary"]["below_floor"] + report["summary"]["calls"] >= 8
    assert "2 test process(es), 8 tests" in r.stdout


def test_a_saved_benchmark_run_carries_the_shims_summary_in_extra_info(tmp_path):
    suite = """\
        import numpy as np

        def test_solve_speed(benchmark):
            a = np.eye(300) * 2.0
            benchmark.pedantic(np.linalg.solve, (a, np.ones(300)), rounds=3, iterations=1)
    """
    r = pytest_run(tmp_path, "-n0", "-q", "--fusion-shim=remote", "--benchmark-json", "bench.json", suite=suite)
    assert r.returncode == 0, r.stdout + r.stderr
    (bench,) = json.loads((tmp_path / "bench.json").read_text())["benchmarks"]
    info = bench["extra_info"]["fusion_shim"]
    assert info["policy"] == "remote" and info["offloaded_ops"] == {"numpy.linalg.solve": 3}
    assert info["worker"] == 3 and info["bytes_sent"] + info["shm_sent"] >= 300 * 300 * 8  # once: then by reference
    assert info["time_s"]["worker"] > 0


# -- NumPy's own suites ---------------------------------------------------------------------------

# D114: the stacked-matrix cases make 90% of the calls; FUSION_TEST_NUMPY_SUITES=full runs them
NUMPY_SELECTION = [] if os.environ.get("FUSION_TEST_NUMPY_SUITES") == "full" else ["-k", "not generalized"]


def test_numpys_linalg_and_fft_suites_pass_under_remote_exactly_as_without_and_the_worker_did_the_work(tmp_path):
    args = ["-p", "no:xdist", "-q", "--pyargs", "numpy.linalg", "numpy.fft", *NUMPY_SELECTION]
    (tmp_path / "plain").mkdir()
    (tmp_path / "shim").mkdir()
    child = {k: v for k, v in os.environ.items() if not k.startswith(("FUSION_SHIM", "PYTEST_"))}
    child.update(PYTHONPATH=PACKAGE_ROOT, CUDA_VISIBLE_DEVICES="-1")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    plain = subprocess.Popen(cmd, cwd=tmp_path / "plain", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=child)  # beside the shim's run: the two take their own cores
    shim = pytest_run(tmp_path / "shim", *args, "--fusion-shim=remote", "--fusion-shim-report", "run.json",
                      suite=None)
    plain_out, _ = plain.communicate(timeout=TIMEOUT)
    plain_run = subprocess.CompletedProcess(cmd, plain.returncode, plain_out, "")
    assert plain.returncode == 0, plain_out[-3000:]
    assert shim.returncode == 0, shim.stdout[-3000:] + shim.stderr[-3000:]
    assert counts(shim) == counts(plain_run) and counts(plain_run)["passed"] > 500
    report = json.loads((tmp_path / "shim" / "run.json").read_text())
    offloaded = report["summary"]["offloaded_ops"]
    for op in ("numpy.linalg.solve", "numpy.linalg.inv", "numpy.linalg.svd", "numpy.linalg.eig",
               "numpy.fft.fft", "numpy.fft.irfft", "numpy.fft.fftn"):
        assert offloaded.get(op, 0) > 0, op
    assert report["summary"]["worker"] > 10 * report["summary"]["fallback"]
    (proc,) = report["processes"]
    assert proc["worker"]["state"] == "ready" and proc["worker"]["info"]["device"] == "cpu"

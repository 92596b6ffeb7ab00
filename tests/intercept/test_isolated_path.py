"""The processes the shim starts never import from the working directory (D185): a ``msgpack.py``,
``numpy.py``, ``torch.py`` or ``zmq.py`` left there is never run, by the launcher nor by the
embedded worker, under ``python -m fusion_shim`` and under ``FUSION_SHIM=1 python /abs/app.py``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fusion_shim.client import embedded

PY = sys.executable
TIMEOUT = 300  # per subprocess: a hang fails the test instead of the suite
SHADOWED = ("msgpack", "numpy", "torch", "zmq")
APP = """
    import numpy as np
    a = (np.arange(640 * 640, dtype=np.float64).reshape(640, 640) % 7) - 3
    b = np.ascontiguousarray(a.T)
    print(repr(float((a @ b).trace())))
"""


@pytest.fixture
def layout(tmp_path):
    """A working directory of modules that leave a marker when imported, and the program elsewhere."""
    cwd, app, marker = tmp_path / "cwd", tmp_path / "app", tmp_path / "marker"
    cwd.mkdir()
    app.mkdir()
    for name in SHADOWED:
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} imported\\n')\n")
    (app / "app.py").write_text(textwrap.dedent(APP))
    return cwd, app / "app.py", marker, tmp_path / "report.json"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    out.pop("PYTHONPATH", None)
    out.update(extra)
    return out


def check(run: subprocess.CompletedProcess, marker, report) -> None:
    assert run.returncode == 0, run.stderr
    assert not marker.exists(), marker.read_text()
    a = (__import__("numpy").arange(640 * 640, dtype=float).reshape(640, 640) % 7) - 3
    assert float(run.stdout) == float((a @ a.T).trace())
    ops = json.loads(report.read_text())["ops"]
    assert ops["numpy.ndarray.__matmul__"]["worker"] == 1, ops  # the worker served the call


def test_the_launcher_and_its_worker_import_nothing_from_the_working_directory(layout):
    cwd, app, marker, report = layout
    run = subprocess.run([PY, "-m", "fusion_shim", "--quiet", "--policy", "remote", "--report", str(report),
                          str(app)], cwd=cwd, env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    check(run, marker, report)


def test_a_program_launched_by_the_variable_and_its_worker_import_nothing_from_the_working_directory(layout):
    cwd, app, marker, report = layout
    run = subprocess.run([PY, str(app)], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                         env=env(FUSION_SHIM="1", FUSION_SHIM_POLICY="remote", FUSION_SHIM_QUIET="1",
                                 FUSION_SHIM_REPORT=str(report)))
    check(run, marker, report)


def test_a_launched_script_still_finds_its_own_directory_first(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "main.py").write_text("import sys, helper\nprint(helper.VALUE, sys.path[0])\n")
    run = subprocess.run([PY, "-m", "fusion_shim", "--quiet", "--policy", "local", str(tmp_path / "main.py")],
                         cwd="/", env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["42", os.path.realpath(tmp_path)]


def test_the_worker_path_holds_the_package_and_absolute_entries_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(embedded.__file__))))
    paths = embedded.import_paths(os.pathsep.join(["", ".", "rel/dir", str(tmp_path), "/opt/abs"]))
    assert paths == [pkg_parent, "/opt/abs"]


def test_the_worker_runs_isolated_with_its_paths_put_first(tmp_path):
    py, isolated, c, boot = embedded.isolated_python(["/opt/abs"])
    assert (py, isolated, c) == (PY, "-I", "-c")
    probe = boot.split("from fusion_shim")[0] + "print(sys.flags.isolated); print(*sys.path, sep='\\n')"
    run = subprocess.run([py, isolated, c, probe], cwd=tmp_path, env=env(PYTHONPATH=str(tmp_path)),
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    flag, first, *rest = run.stdout.splitlines()
    assert (flag, first) == ("1", "/opt/abs")
    assert str(tmp_path) not in rest and "" not in rest

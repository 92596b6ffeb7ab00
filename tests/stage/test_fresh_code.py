"""Each program run's stages run the code its modules hold now, from fresh module state (D190): two
runs against one long-lived ``--allow-code`` worker, the stage's module edited between them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = """
import numpy as np
CALLS = [0]
def step(a):
    CALLS[0] += 1
    return float((a * {factor}).sum()), CALLS[0]
"""
PROGRAM = """
import numpy as np
import stalemod
a = np.ones(1000)
print([stalemod.step(a) for _ in range(2)])
"""


@pytest.fixture
def project():
    path = tempfile.mkdtemp(prefix="fusion-shim-fresh-")  # readable by the stage process's user
    os.chmod(path, 0o755)
    (Path(path) / "app.py").write_text(PROGRAM)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _env(project: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join((str(project), str(ROOT)))
    return env


def _write(project: Path, factor: int) -> None:
    path = project / "stalemod.py"
    path.write_text(MODULE.format(factor=factor))
    os.utime(path, (time.time() + factor, time.time() + factor))  # a new mtime even within one second


def _run(project: Path, url: str, *shim: str) -> str:
    out = subprocess.run([sys.executable, *shim, str(project / "app.py")], capture_output=True, text=True,
                         timeout=300, cwd=project, env=_env(project))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip(), out.stderr


def test_a_module_edited_between_two_runs_on_one_worker_gives_plain_pythons_answer(project):
    url = f"ipc://{project}/w.sock"
    worker = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu",
                               "--allow-code"], env=_env(project), cwd=project, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (project / "w.sock").exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the worker did not bind"
            time.sleep(0.05)
        shim = ("-m", "fusion_shim", "--policy", "remote", "--worker", url, "--stage", "stalemod:step")
        for factor in (2, 3):
            _write(project, factor)
            got, report = _run(project, url, *shim)
            want, _ = _run(project, url)
            assert got == want == f"[({1000.0 * factor}, 1), ({1000.0 * factor}, 2)]", report[-3000:]
            assert "stage stalemod:step" in report and "fallback" not in report.split("stage stalemod:step")[1][:200]
    finally:
        worker.terminate()
        worker.wait(30)

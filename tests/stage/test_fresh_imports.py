"""A stage's identity covers the modules of the program's tree that its module imports (D342): two
runs against one long-lived ``--allow-code`` worker, a helper module edited between them, imported
as a module or by name; and a worker whose copy of the helper differs gets the stage by value."""
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
STAGE = {
    "module": "import numpy as np\nimport helpermod\ndef step(a):\n    return float(helpermod.scale(a).sum())\n",
    "name": "import numpy as np\nfrom helpermod import scale\ndef step(a):\n    return float(scale(a).sum())\n",
}
HELPER = "def scale(x):\n    return x * {factor}\n"
PROGRAM = """
import numpy as np
import stagemod
a = np.ones(1000)
print([stagemod.step(a) for _ in range(2)])
"""


def _tree() -> Path:
    path = Path(tempfile.mkdtemp(prefix="fusion-shim-imports-"))  # readable by the stage process's user
    os.chmod(path, 0o755)
    (path / "app.py").write_text(PROGRAM)
    return path


@pytest.fixture
def project():
    path = _tree()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join((str(path), str(ROOT)))
    return env


def _write(path: Path, name: str, text: str, bump: int) -> None:
    (path / name).write_text(text)
    os.utime(path / name, (time.time() + bump, time.time() + bump))  # a new mtime even within one second


def _run(project: Path, *shim: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, *shim, str(project / "app.py")], capture_output=True, text=True,
                         timeout=300, cwd=project, env=_env(project))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip(), out.stderr


class _Worker:
    def __init__(self, tree: Path, url: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu",
                                      "--allow-code"], env=_env(tree), cwd=tree, stderr=subprocess.PIPE, text=True)
        sock, deadline = Path(url[len("ipc://"):]), time.monotonic() + 120
        while not sock.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the worker did not bind"
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _shim(url: str) -> tuple[str, ...]:
    return ("-m", "fusion_shim", "--policy", "remote", "--worker", url, "--stage", "stagemod:step")


def _ran_there(report: str) -> None:
    assert "stage stagemod:step" in report and "fallback" not in report.split("stage stagemod:step")[1][:200], \
        report[-3000:]


@pytest.mark.parametrize("imported", ["module", "name"])
def test_a_helper_edited_between_two_runs_on_one_worker_gives_plain_pythons_answer(project, imported):
    url = f"ipc://{project}/w.sock"
    _write(project, "stagemod.py", STAGE[imported], 0)
    worker = _Worker(project, url)
    try:
        for factor in (2, 3):
            _write(project, "helpermod.py", HELPER.format(factor=factor), factor)
            got, report = _run(project, *_shim(url))
            want, _ = _run(project)
            assert got == want == f"[{1000.0 * factor}, {1000.0 * factor}]", report[-3000:]
            _ran_there(report)
            assert "sent by value" not in report, report[-3000:]  # the same tree: by reference
    finally:
        worker.close()


@pytest.mark.parametrize("imported", ["module", "name"])
def test_a_worker_whose_helper_differs_runs_the_programs_helper(project, imported):
    theirs = _tree()  # the worker's tree: the same stage module, another helper
    url = f"ipc://{project}/w.sock"
    for tree, factor in ((project, 3), (theirs, 2)):
        _write(tree, "stagemod.py", STAGE[imported], 0)
        _write(tree, "helpermod.py", HELPER.format(factor=factor), factor)
    worker = _Worker(theirs, url)
    try:
        got, report = _run(project, *_shim(url))
        want, _ = _run(project)
        assert got == want == "[3000.0, 3000.0]", report[-3000:]
        _ran_there(report)
        assert "the worker cannot import it" in report, report[-3000:]  # D342: by value
    finally:
        worker.close()
        shutil.rmtree(theirs, ignore_errors=True)


def test_a_reference_names_the_programs_modules_its_module_reaches_and_no_library(tmp_path, monkeypatch):
    from fusion_shim.protocol import code

    (tmp_path / "deepmod.py").write_text("def k():\n    return 2\n")
    (tmp_path / "helpermod.py").write_text("import deepmod\ndef scale(x):\n    return x * deepmod.k()\n")
    (tmp_path / "localmod.py").write_text("N = 1\n")
    (tmp_path / "stagemod.py").write_text("import numpy as np\nfrom helpermod import scale\n"
                                          "def step(a):\n    import localmod\n    return np.sum(scale(a)) + localmod.N\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("deepmod", "helpermod", "localmod", "stagemod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import localmod  # noqa: F401  (the stage's own import, as its first run would make it)
    import stagemod

    ref = code.by_reference(stagemod.step)
    assert ref["imports"] == ["deepmod", "helpermod", "localmod"]
    _write(tmp_path, "deepmod.py", "def k():\n    return 3\n", 5)  # edited after this process imported it
    assert code.by_reference(stagemod.step)["hash"] != ref["hash"]

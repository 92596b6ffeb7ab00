"""Stages are opt-in: without them nothing pickles, and the settings that name them are checked."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fusion_shim.cli import parse_run
from fusion_shim.config import Config, ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = """
import os, sys
import numpy as np
from tests.stage.conftest import stage_worker
before = set(sys.modules)  # NumPy itself loads the standard library's pickle
import fusion_shim

@fusion_shim.stage
def early(a):
    return a * 2

url = "inproc://opt-in-%d" % os.getpid()
_, thread, stop = stage_worker(url, allow_code=None)
rt = fusion_shim.install(policy="remote", worker=url, quiet=True)
assert rt.link.wait_ready(600)
a = np.ones((300, 300))
assert (a @ a == 300.0).all() and rt.ledger.records[-1].kind == "worker"

@fusion_shim.stage
def after(a):
    return a + 1

assert (early(a) == 2).all() and isinstance(after, fusion_shim.stages.Stage)  # marked, never called
fusion_shim.uninstall()
stop.set()
print(sorted(m for m in ("cloudpickle", "pickle", "_pickle", "fusion_shim.protocol.code",
                         "fusion_shim.stages.runner") if m in sys.modules and m not in before))
"""


def test_a_program_that_configured_no_stages_never_loads_cloudpickle():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=900, env=env,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_decorator_outside_a_shim_gives_the_function_back():
    code = ("import sys, fusion_shim\n"
            "def f(x):\n    return x\n"
            "assert fusion_shim.stage(f) is f\n"
            "print('cloudpickle' in sys.modules, 'fusion_shim.intercept' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_stage_specs_are_checked_and_add_up():
    assert Config.load({"FUSION_SHIM_STAGES": "app:step, pkg.mod:C.g"}).stages == ("app:step", "pkg.mod:C.g")
    with pytest.raises(ConfigError, match="MODULE:QUALNAME"):
        Config.load({"FUSION_SHIM_STAGES": "app.step"})
    with pytest.raises(ConfigError, match="MODULE:QUALNAME"):
        Config.load({"FUSION_SHIM_STAGES": "app:1step"})
    settings, script, _, _ = parse_run(["--stage", "a:f", "--stage=b:C.g", "app.py"])
    assert script == "app.py" and Config.load({}, **settings).stages == ("a:f", "b:C.g")

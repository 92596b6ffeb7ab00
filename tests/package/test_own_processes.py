"""The package's own processes never intercept, even where they inherit ``FUSION_SHIM=1``: the
bootstrap does not arm its NumPy hook in them, so the client side never loads there."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fusion_shim


@pytest.mark.parametrize("argv,own", [
    (["py", "-m", "fusion_shim.worker.testing", "--bind", "ipc:///x"], True),
    (["py", "-I", "-m", "fusion_shim.worker.stagechild", "3"], True),
    (["py", "-X", "importtime", "-m", "fusion_shim.pool.actor"], True),
    (["py", "-m", "fusion_shim", "worker", "--bind", "ipc:///x"], True),
    (["py", "-m", "fusion_shim", "app.py"], False),
    (["py", "app.py", "-m", "fusion_shim.worker.testing"], False),
    (["py", "-c", "import numpy", "-m", "fusion_shim.worker.x"], False),
    (["py", "-m", "mypkg.main"], False),
    ([], False),
])
def test_own_processes_are_told_from_programs(argv, own):
    assert fusion_shim._own_process(argv) is own


def _client_modules_loaded(*args: str) -> list[str]:
    env = {**os.environ, "FUSION_SHIM": "1"}
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, env=env,
                          timeout=600)
    return [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
            if "fusion_shim.intercept" in line or "fusion_shim.client" in line]


def test_a_worker_under_fusion_shim_1_never_loads_the_interception():
    assert _client_modules_loaded("-m", "fusion_shim.worker.testing", "--help") == []
    assert _client_modules_loaded("-c", "import numpy") != []  # a program under the same variable does

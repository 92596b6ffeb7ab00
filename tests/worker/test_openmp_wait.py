"""The worker's OpenMP threads wait asleep unless the user chose otherwise (D70): a spinning pool
burns the CPUs that a program beside a same-host worker needs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROBE = ("import os, fusion_shim.worker.backend, torch; torch.ones(64, 64) @ torch.ones(64, 64); "
         "print(os.environ['OMP_WAIT_POLICY'])")


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_worker_sets_passive_waiting_unless_told(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected

"""D175: a stage process sends the stage's NumPy calls to its worker's device through a shim of its
own (an ``inproc://`` worker in a thread). This host has no GPU: the device is the CPU here
(SIMULATED: torch's CPU kernels stand in for the GPU's), and a device that cannot start leaves the
stage running with NumPy."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.helpers.environment import ROOT
from tests.helpers.shims import install
from tests.stage import stagefns

PROGRAM = """
import numpy as np
import fusion_shim
from fusion_shim.worker import stagechild
from tests.stage import stagefns
rng = np.random.default_rng(5)
A, X = rng.standard_normal((96, 96)), rng.standard_normal((96, 12))
rt = stagechild.device_shim("cpu")
got = stagefns.chain(A, X.copy(), 4)
kinds = sorted({(r.op, r.kind) for r in rt.ledger.records})
fusion_shim.uninstall()
want = stagefns.chain(A, X.copy(), 4)
np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
assert got.dtype == want.dtype and got.shape == want.shape
print(kinds)
"""


def test_a_stage_process_sends_the_stages_numpy_calls_to_its_device_worker():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "('numpy.ndarray.__matmul__', 'worker')" in out.stdout, out.stdout


def test_a_stage_process_whose_device_cannot_start_still_runs_the_stage(code_worker):
    from fusion_shim.worker.stages import StageHost

    url, worker = code_worker
    worker.stages = StageHost(worker.allow_code, worker.max_bytes, "cuda")  # as a GPU worker's; torch sees none
    rng = np.random.default_rng(6)
    A, X = rng.standard_normal((64, 64)), rng.standard_normal((64, 8))
    want = stagefns.chain(A, X.copy(), 3)
    rt = install(url, stages=("tests.stage.stagefns:chain",))
    got = stagefns.chain(A, X.copy(), 3)
    assert [r for r in rt.ledger.records if r.op == "stage tests.stage.stagefns:chain"][-1].kind == "worker"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # a GPU's sums may round otherwise
    if not _torch_sees_cuda():  # said in the report, not only on the worker's stderr
        said = [e for e in rt.ledger.events if "NumPy calls ran on the worker's CPUs, not its cuda" in str(e)]
        assert said, rt.ledger.events


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()

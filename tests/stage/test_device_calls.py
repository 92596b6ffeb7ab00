"""D307: a stage process runs the NumPy calls the catalog admits on its worker's device through the
worker's own backend and kernels, in that process; anything else runs in NumPy. This host has no
GPU: the device is the CPU here, named explicitly (SIMULATED: torch's CPU kernels stand in for the
GPU's)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

import numpy as np
import pytest

from fusion_shim.protocol import code, messages, wire
from tests.helpers.diffutil import assert_close, assert_meta
from tests.helpers.environment import ROOT
from tests.helpers.shims import install
from tests.stage import stagefns

pytest.importorskip("torch")

CHILD = ("import sys; from fusion_shim.worker import stagechild; "
         "sys.exit(stagechild.main(sys.argv[1:], 'started by a test', devices=('cpu',)))")
ANSWER_S = 120  # a busy host: torch's import and the first kernels of each kind


def _operands(dtype="f8"):
    rng = np.random.default_rng(11)
    A = rng.standard_normal((48, 48)) + 48 * np.eye(48)
    return A.astype(dtype), np.asfortranarray(rng.standard_normal((48, 5))).astype(dtype, order="K"), \
        rng.standard_normal(48).astype(dtype)


@pytest.fixture
def stage_process():
    ours, theirs = socket.socketpair()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno()), "cpu"], pass_fds=[theirs.fileno()],
                            cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    theirs.close()
    conn = Connection(ours.detach())
    try:
        yield conn
    finally:
        conn.close()
        proc.kill()
        proc.wait(60)


def _run_stage(conn: Connection, fn, *args):
    """One job as a worker sends it (the function by reference), and the stage's value."""
    payload, arrays = code.dumps((None, args, {}))
    metas = [wire.to_wire(a)[0] for a in arrays]
    messages.send_stage_job(conn, code.by_reference(fn), metas, payload, arrays)
    assert conn.poll(ANSWER_S), "the stage process did not answer"
    header, value, out = messages.recv_stage_answer(conn, 1 << 30)
    assert header.get("ok") and not header["raised"], header
    return code.loads(value, list(out[:header["nres"]]))


def test_a_stage_process_runs_its_numpy_calls_on_the_device_with_numpys_results(stage_process):
    A, B, b = _operands()
    got = _run_stage(stage_process, stagefns.numpy_mix, A, B, b)
    want = stagefns.numpy_mix(A, B, b)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape)
        assert (g.flags.c_contiguous, g.flags.f_contiguous) == (w.flags.c_contiguous, w.flags.f_contiguous), i
        assert_close(g, w, 48, f"result {i}")
    modules, served = _run_stage(stage_process, stagefns.device_state)
    assert not [m for m in modules if m.startswith("fusion_shim.client")], modules
    assert "fusion_shim.intercept" not in modules and "fusion_shim.plan" not in modules, modules
    for op in ("numpy.matmul", "numpy.linalg.solve", "numpy.fft.fft", "numpy.ndarray.__matmul__"):
        assert served.get(op), (op, served)


@pytest.fixture
def device_calls():
    from fusion_shim.worker.backend import TorchBackend
    from fusion_shim.worker.devicecalls import DeviceCalls
    from fusion_shim.worker.kernels import KERNELS

    originals = (np.matmul, np.linalg.solve, np.fft.fft, np.dot)
    calls = DeviceCalls(TorchBackend("cpu", bench_cache=False), KERNELS).install()
    try:
        yield calls
    finally:
        calls.uninstall()
    assert (np.matmul, np.linalg.solve, np.fft.fft, np.dot) == originals  # exactly what was there


CASES = {
    "matmul f8, an F operand": lambda A, B, b: np.matmul(A, B),
    "matmul f4": lambda A, B, b: np.matmul(A.astype(np.float32), B.astype(np.float32)),
    "matmul i8": lambda A, B, b: np.matmul(A.astype(np.int64), B.astype(np.int64)),
    "solve, a vector": lambda A, B, b: np.linalg.solve(A, b),
    "solve f4": lambda A, B, b: np.linalg.solve(A.astype(np.float32), B.astype(np.float32)),
    "fft, along an F array's first axis": lambda A, B, b: np.fft.fft(B, axis=0),
    "fft of a real f4 vector": lambda A, B, b: np.fft.fft(b.astype(np.float32)),
    "the @ operator": lambda A, B, b: A @ B,
    ".dot to a scalar": lambda A, B, b: b.dot(b),
    "np.dot into out=": lambda A, B, b: np.dot(A, b, out=np.empty(48)),
    "eigh's named tuple": lambda A, B, b: np.linalg.eigh(A + A.T),
    "matmul of a reversed view": lambda A, B, b: np.matmul(A[::-1], B),
    "solve of reversed views": lambda A, B, b: np.linalg.solve(A[::-1, ::-1], b[::-1]),
    "fft of a byte-swapped vector": lambda A, B, b: np.fft.fft(b.astype(">f8")),
    "scipy.linalg.solve": lambda A, B, b: pytest.importorskip("scipy.linalg").solve(A, B),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_call_the_device_answers_is_numpys_value_in_type_dtype_shape_and_order(device_calls, case):
    A, B, b = _operands()
    got = CASES[case](A, B, b)
    served = sum(device_calls.served.values())
    device_calls.uninstall()
    want = CASES[case](A, B, b)
    assert served == 1 and not device_calls.here, (device_calls.served, device_calls.here)
    assert_meta(got, want, case)
    if case.startswith("eigh"):
        assert_close(got.eigenvalues, want.eigenvalues, 48, case)
        return
    assert type(got) is type(want)
    assert_close(got, want, 48, case)


def test_a_kernels_result_that_wraps_its_input_is_copied_on_a_cpu_device():
    from fusion_shim.worker.backend import TorchBackend
    from fusion_shim.worker.devicecalls import DeviceCalls

    A = np.eye(8)  # a kernel that hands back its first operand: a CPU tensor shares that memory
    calls = DeviceCalls(TorchBackend("cpu", bench_cache=False), {"matmul": lambda t, p: [t[0]]}).install()
    try:
        got = np.matmul(A, A)
    finally:
        calls.uninstall()
    assert calls.served["numpy.matmul"] == 1
    assert not np.may_share_memory(got, A)


def test_what_the_device_cannot_answer_is_numpys_own_call_and_its_error(device_calls):
    A, B, b = _operands()
    small = A[:2, :2] @ A[:2, :2]
    device_calls.served.clear()
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(np.zeros((4, 4)), np.ones(4))
    assert np.allclose(np.matmul(A.astype(object)[:2, :2], A.astype(object)[:2, :2]).astype(float),
                          small)  # an object array: no row admits it
    with np.errstate(under="raise"):
        np.matmul(A, B)
    assert not device_calls.served, device_calls.served
    whys = [why for _, why in device_calls.here]
    assert any(why.startswith("kernel:") for why in whys), whys
    assert any("dtype object" in why for why in whys), whys
    assert any("under" in why for why in whys), whys


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


def test_a_wrapped_function_is_still_numpys_to_the_program(device_calls):
    import pickle

    assert isinstance(np.matmul, np.ufunc) and np.matmul.nin == 2 and np.matmul.__name__ == "matmul"
    assert pickle.loads(pickle.dumps(np.linalg.solve)) is np.linalg.solve
    assert str(__import__("inspect").signature(np.linalg.solve)) == "(a, b)"
    assert np.linalg.solve.__wrapped__ is not np.linalg.solve and np.linalg.solve.__module__ == "numpy.linalg"

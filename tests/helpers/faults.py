"""What the fault tests share: worker subprocesses, the shim installed against a worker URL without
waiting for it, operands with NumPy's answer, and what the ledger recorded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import fusion_shim
from fusion_shim.intercept import bypassed

from tests.helpers import faultlab
from tests.helpers.shims import READY_S


PY = sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the shim's settings, plus ``extra``: for the programs a test starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.update(extra)
    return env


class Workers:
    """Worker subprocesses started by a test; every one is killed at the end."""

    def __init__(self, directory: str):
        self.dir = directory
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str = "w", delay: float = 0.0) -> tuple[subprocess.Popen, str]:
        url = f"ipc://{self.dir}/{name}.sock"
        cmd = [PY, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu"]
        if delay:  # the testing worker: the same server, every call held
            cmd = [PY, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu", "--delay", str(delay)]
        log = open(os.path.join(self.dir, f"{name}-{len(self.procs)}.log"), "ab")
        proc = subprocess.Popen(cmd, env=clean_env(FUSION_SHIM="0"), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        return proc, url

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def install(url: str, **settings):
    """``fusion_shim.install`` with policy remote against ``url``; does not wait for the worker."""
    settings = {"policy": "remote", "worker": url, "quiet": True, "timeout": 10.0, "ready_timeout": READY_S,
                **settings}
    return fusion_shim.install(**settings)


def records(rt, op: str = "numpy.matmul") -> list:
    """The ledger's records of ``op``, oldest first."""
    return [r for r in rt.ledger.records if r.op == op]


def events(rt) -> str:
    """The ledger's events, one a line (the message of a failed wait)."""
    return "\n".join(text for _, text in rt.ledger.events)


def operands(seed: int, n: int = 40, m: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two operands and their product, computed before any shim is installed."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, m)), rng.standard_normal((m, n))
    with bypassed():  # NumPy's own product, whatever shim is installed
        return a, b, a @ b


def rng_matrix(seed: int, n: int = 48) -> np.ndarray:
    """A well-conditioned square matrix (diagonally dominant)."""
    r = np.random.default_rng(seed)
    return r.standard_normal((n, n)) + n * np.eye(n)


def last(rt, op: str = "numpy.matmul"):
    """The ledger's latest record of ``op``."""
    return [r for r in rt.ledger.records if r.op == op][-1]


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` exits (or is a zombie) within ``seconds``; killed if it does not,
    so that it is not left behind for the next test."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if faultlab._state(pid) in ("Z", "X"):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return False

"""Functions the stage tests mark by reference (an importable module: the worker imports it too)."""
import ctypes
import os
import time

import numpy as np


def chain(A, X, steps):
    for _ in range(steps):
        X = np.tanh(A @ X)
        X /= np.linalg.norm(X)
    return X


def summary(a, scale=1.0):
    return {"sum": float(a.sum()) * scale, "parts": [a[:2].copy(), (a.shape, str(a.dtype))], "n": int(a.size)}


def fill(C, value):
    C[:] = value
    return None


def scaled_sum(A, x):
    return float((A @ x).sum())


def fails(a):
    raise ValueError(f"no good: {a.shape}")


def outer(A, X):
    return inner_step(A, X) + 1.0


def inner_step(A, X):
    return np.tanh(A @ X)


GUARD_SEEN: list = []  # (busy, stages) of the runtime's guard, seen inside ``guarded_inner``


def guarded_outer(A, X):
    return guarded_inner(A, X) + 1.0


def guarded_inner(A, X):
    import fusion_shim

    rt = fusion_shim.active()
    if rt is not None:
        GUARD_SEEN.append((getattr(rt.guard, "busy", False), getattr(rt.guard, "stages", 0)))
    return np.tanh(A @ X)


def crash():
    ctypes.string_at(0)


def hang():
    time.sleep(3600)


class Model:
    def __init__(self, w):
        self.w = w

    def apply(self, x):
        return self.w @ x


def crash_elsewhere(pid):
    if os.getpid() != pid:
        ctypes.string_at(0)
    return "here"


def hang_elsewhere(pid):
    if os.getpid() != pid:
        time.sleep(3600)
    return "here"


def differs_elsewhere(pid, a):
    return a + (1.0 if os.getpid() != pid else 0.0)


def where(pid):
    return "here" if os.getpid() == pid else "worker"


def slow_here(pid, a):
    if os.getpid() == pid:
        time.sleep(1.0)  # more than a stage round trip to a worker takes on a loaded machine
    return a * 2


def slow_elsewhere(pid, a):
    time.sleep(0.05 if os.getpid() == pid else 0.3)
    return a * 2


class Box:
    """A class the program defines: a stage's answer may hold it."""

    def __init__(self, n):
        self.n = n


def _deeper(a):
    raise ValueError(f"deep trouble: {a.shape}")


def fails_deep(a):
    return _deeper(a)


def numpy_mix(A, B, b):
    """np.matmul, np.linalg.solve, np.fft.fft and `@` (a stage whose calls the worker's device answers)."""
    return [np.matmul(A, B), np.linalg.solve(A, b), np.fft.fft(b), np.fft.fft(B, axis=0), A @ B,
            np.matmul(A.astype(np.float32), B.astype(np.float32)), np.linalg.solve(A, B)]


def device_state():
    """The shim's modules this stage process has imported, and what its device answered."""
    import sys

    from fusion_shim.worker import stagechild

    calls = stagechild.DEVICE["calls"]
    return sorted(m for m in sys.modules if m.startswith("fusion_shim")), dict(calls.served) if calls else {}

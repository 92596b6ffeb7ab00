"""Kernels in torch, one per catalog kernel id, CUDA when present and the CPU otherwise.

A kernel takes the operands, already on the device and cast to the compute dtype the client asked
for (``cdtype``), and the call's static parameters; it returns result tensors in NumPy's order.
Semantics are NumPy's, not torch's: where the two differ the kernel bridges the gap (noted inline).
TF32 is off: the worker never returns lower precision than NumPy would.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import numpy as np
import torch

Kernel = Callable[[list, dict], list]

DTYPES = {
    np.dtype(k): getattr(torch, v)
    for k, v in {"?": "bool", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64", "u1": "uint8",
                 "f2": "float16", "f4": "float32", "f8": "float64", "c8": "complex64", "c16": "complex128"}.items()
}


def _matmul(t: list, p: dict) -> list:
    return [torch.matmul(t[0], t[1])]


def _dot(t: list, p: dict) -> list:
    a, b = t
    # numpy.dot sums over a's last axis and b's second-to-last (its only axis when 1-d)
    return [torch.tensordot(a, b, dims=([a.ndim - 1], [max(b.ndim - 2, 0)]))]


def _tensordot(t: list, p: dict) -> list:
    xa, xb = p["axes"]
    return [torch.tensordot(t[0], t[1], dims=(list(xa), list(xb)))]


def _einsum(t: list, p: dict) -> list:
    return [torch.einsum(p["subscripts"], *t)]


def _solve(t: list, p: dict) -> list:
    a, b = t
    if b.ndim == 1:  # NumPy 2: a 1-d b is one vector, broadcast over a's batch
        return [torch.linalg.solve(a, b.unsqueeze(-1)).squeeze(-1)]
    # give both the same rank so torch never reads b as a batch of vectors (its rule, not NumPy's)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [torch.linalg.solve(a.expand(batch + a.shape[-2:]), b.expand(batch + b.shape[-2:]))]


def _inv(t: list, p: dict) -> list:
    return [torch.linalg.inv(t[0])]


def _cholesky(t: list, p: dict) -> list:
    return [torch.linalg.cholesky(t[0], upper=bool(p["upper"]))]


def _eigh(t: list, p: dict) -> list:
    w, v = torch.linalg.eigh(t[0], UPLO=p["UPLO"])
    return [w, v]


def _svd(t: list, p: dict) -> list:
    if not p["compute_uv"]:
        return [torch.linalg.svdvals(t[0])]
    u, s, vh = torch.linalg.svd(t[0], full_matrices=bool(p["full_matrices"]))
    return [u, s, vh]


def _qr(t: list, p: dict) -> list:
    q, r = torch.linalg.qr(t[0], mode=p["mode"])
    return [r] if p["mode"] == "r" else [q, r]


def _fft1(fn: Callable) -> Kernel:
    def kernel(t: list, p: dict) -> list:
        return [fn(t[0], n=p["n"], dim=p["axis"], norm=p["norm"])]
    return kernel


def _fftn(fn: Callable) -> Kernel:
    def kernel(t: list, p: dict) -> list:
        return [fn(t[0], s=p["s"], dim=p["axes"], norm=p["norm"])]
    return kernel


KERNELS: dict[str, Kernel] = {
    "matmul": _matmul,
    "dot": _dot,
    "tensordot": _tensordot,
    "einsum": _einsum,
    "linalg.solve": _solve,
    "linalg.inv": _inv,
    "linalg.cholesky": _cholesky,
    "linalg.eigh": _eigh,
    "linalg.svd": _svd,
    "linalg.qr": _qr,
    "fft.fft": _fft1(torch.fft.fft),
    "fft.ifft": _fft1(torch.fft.ifft),
    "fft.rfft": _fft1(torch.fft.rfft),
    "fft.irfft": _fft1(torch.fft.irfft),
    "fft.fft2": _fftn(torch.fft.fftn),
    "fft.ifft2": _fftn(torch.fft.ifftn),
}


class TorchBackend:
    """Moves arrays to the device and back and runs kernels there; times each phase."""

    def __init__(self, device: str = "auto"):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # TF32 off: float32 matmuls and convolutions keep full float32 precision
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        # inputs arrive as read-only views on ZeroMQ frames; kernels never write to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """An input on the device, in its own dtype (the resident store keeps it so)."""
        return torch.from_numpy(_aligned(a)).to(self.device)

    def run(self, kernel: Kernel, arrays: list[np.ndarray], params: dict, layouts: list) -> tuple[list, dict]:
        """Host arrays in, host arrays out, with the time of each phase (the health check; test
        backends offer only this)."""
        t0 = time.perf_counter()
        tensors = [self.to_device(a) for a in arrays]
        self.sync()
        t1 = time.perf_counter()
        results = self.compute(kernel, tensors, params, layouts)
        self.sync()
        t2 = time.perf_counter()
        out = self.to_host(results)
        return out, {"h2d": t1 - t0, "kernel": t2 - t1, "d2h": time.perf_counter() - t2}

    def compute(self, kernel: Kernel, tensors: list, params: dict, layouts: list) -> list:
        """Device results in the layouts the client asked for; inputs cast to the compute dtype."""
        cdtype = DTYPES[np.dtype(params["cdtype"])]
        results = kernel([t.to(cdtype) for t in tensors], params)
        if len(results) != len(layouts):
            raise ValueError(f"kernel made {len(results)} results, the call asked for {len(layouts)} layouts")
        return [_with_layout(r.resolve_conj().resolve_neg(), lay) for r, lay in zip(results, layouts)]

    @staticmethod
    def to_host(results: list) -> list[np.ndarray]:
        return [r.cpu().numpy() for r in results]

    def warm(self) -> dict[str, float]:
        """A first kernel per dtype, then the planner's three probes (fusion_shim.plan.calibrate_local)
        timed on this device; the rates, in GFLOP/s per family, go into the ``ready`` reply."""
        dev = self.device
        for dt in (torch.float32, torch.float64, torch.complex64, torch.complex128):
            m = torch.ones(8, 8, dtype=dt, device=dev)
            torch.matmul(m, m)
            torch.fft.fft(m)
        a = torch.randn(384, 384, dtype=torch.float64, device=dev)
        x = torch.randn(1 << 16, dtype=torch.complex128, device=dev)
        probes = {
            "products": (lambda: torch.matmul(a, a), 2 * 384**3),
            "linalg": (lambda: torch.linalg.solve(a, a), 2 / 3 * 384**3 + 2 * 384**3),
            "fft": (lambda: torch.fft.fft(x), 5 * (1 << 16) * 16),
        }
        rates = {}
        for family, (fn, flops) in probes.items():
            fn()
            self.sync()
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                fn()
                self.sync()
                best = min(best, time.perf_counter() - t)
            rates[family] = flops / best / 1e9
        return rates


def _aligned(a: np.ndarray) -> np.ndarray:
    """A received array is a view on its ZeroMQ frame, whose buffer need not be aligned to the element
    size; torch's CPU kernels assume it is (a complex128 matrix-vector product on an 8-byte-aligned
    buffer segfaults the worker): copy those, the only ones, before wrapping them."""
    return a if a.ctypes.data % a.dtype.itemsize == 0 else a.copy()


def _with_layout(t: torch.Tensor, layout: Any) -> torch.Tensor:
    """The result in the layout the client asked for. C and F travel as such; the wire knows no other
    order, so a result asked for in an axis order travels transposed to that order, C-contiguous,
    and the client transposes it back (a view: no copy on either side)."""
    if t.ndim < 2 or layout == "C":
        return t.contiguous()
    perm = list(range(t.ndim))[::-1] if layout == "F" else [int(i) for i in layout]
    if sorted(perm) != list(range(t.ndim)):
        raise ValueError(f"layout {layout!r} is not a permutation of {t.ndim} axes")
    if layout != "F":
        return t.permute(perm).contiguous()
    inverse = [perm.index(i) for i in range(t.ndim)]
    return t.permute(perm).contiguous().permute(inverse)

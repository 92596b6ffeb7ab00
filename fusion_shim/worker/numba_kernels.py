"""Kernels written with numba.cuda for the rows of :mod:`fusion_shim.catalog.numba`.

Where they run, said plainly in the worker's ``ready`` reply (``numba``) and on its stderr:

- ``cuda``: a GPU and numba-cuda; the kernels read and write torch's CUDA tensors in place
  (``__cuda_array_interface__``), on the same device and default stream as the torch kernels;
- ``simulator``: ``NUMBA_ENABLE_CUDASIM=1``: numba's CUDA *simulator* runs the same kernel source on
  the CPU, one Python thread per CUDA thread. It exists to test the kernels on machines without a
  GPU and is far too slow for anything else;
- anything else (no numba, no GPU and no simulator): the kernels are not offered, and the client
  runs these rows locally, saying why.

The operands arrive cast as NumPy casts them (the rows name a dtype per operand, ``idtypes``:
bincount's indices stay integers). The kernels check what would make them write out of bounds
(a bin past ``n``, an empty ``xp``): a malformed call is answered with an error, never run.
"""
from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Callable

import numpy as np
import torch

THREADS = 128


def numba_mode(device_type: str = "cuda") -> str:
    """"cuda" | "simulator" | why the kernels are not offered, for a worker on ``device_type``.
    Decided without importing numba (a second at worker start); it is imported at the first call
    of one of these kernels."""
    if importlib.util.find_spec("numba") is None:
        return "unavailable: numba is not installed (the worker extra has it)"
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "simulator"
    if device_type == "cuda" and torch.cuda.is_available():
        return "cuda"
    return "unavailable: no CUDA device (NUMBA_ENABLE_CUDASIM=1 runs them under numba's simulator, for tests)"


def _jit() -> tuple[Any, dict[str, Any]]:
    from numba import cuda

    from . import _numba_src  # module level: numba's simulator swaps the module-global ``cuda`` it sees

    names = ("bincount", "bincount_weighted", "correlate", "interp")
    return cuda, {name: getattr(_numba_src, name) for name in names}


class NumbaKernels:
    """The launchers: torch tensors in, torch tensors out, on the backend's device."""

    def __init__(self, mode: str):
        self.mode = mode
        self._k: dict[str, Any] | None = None
        self.cuda: Any = None

    @property
    def k(self) -> dict[str, Any]:
        if self._k is None:
            self.cuda, self._k = _jit()
        return self._k

    def _arg(self, t: torch.Tensor) -> Any:
        self.k  # numba imported before its first use
        t = t.contiguous()
        if self.mode == "cuda":
            return self.cuda.as_cuda_array(t)
        # the simulator works on host arrays and copies every plain argument back after the launch:
        # an input may be a read-only view (a client's shared-memory segment), so mark it input-only
        return self.cuda.In(t.cpu().numpy())

    def _launch(self, name: str, n: int, *args: Any) -> None:
        if n:
            self.k[name][math.ceil(n / THREADS), THREADS](*args)

    def _zeros(self, n: int, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
        # under the simulator the output lives on the host (the kernel writes it there); see _back
        return torch.zeros(n, dtype=dtype, device=like.device if self.mode == "cuda" else "cpu")

    @staticmethod
    def _back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return t.to(like.device)

    def bincount(self, t: list, p: dict) -> list:
        x = t[0].to(torch.int64)
        if len(t) == 1:
            out = self._zeros(p["n"], torch.int64, x)
            self._launch("bincount", x.numel(), self._arg(x), self._arg_out(out))
        else:
            out = self._zeros(p["n"], torch.float64, x)
            self._launch("bincount_weighted", x.numel(), self._arg(x), self._arg(t[1].to(torch.float64)),
                         self._arg_out(out))
        return [self._back(out, t[0])]

    def correlate(self, t: list, p: dict) -> list:
        from .kernels import DTYPES

        dt = DTYPES[np.dtype(p["cdtype"])]
        x, y = t[0].to(dt), t[1].to(dt)
        if p.get("conj_x"):
            x = x.conj().resolve_conj()
        if p.get("conj_y"):
            y = y.conj().resolve_conj()
        if p.get("reverse_y"):
            y = torch.flip(y, (0,))
        out = self._zeros(p["length"], dt, x)
        self._launch("correlate", p["length"], self._arg(x), self._arg(y), self._arg_out(out), p["n_left"])
        out = self._back(out, t[0])
        return [torch.flip(out, (0,)) if p.get("reverse_out") else out]

    def interp(self, t: list, p: dict) -> list:
        x = t[0].to(torch.float64).reshape(-1)
        xp, fp = t[1].to(torch.float64), t[2]
        if xp.ndim != 1 or xp.numel() == 0 or fp.shape != xp.shape:
            raise ValueError("interp needs xp and fp of the same non-zero length")
        parts = [fp.to(torch.float64)] if not fp.is_complex() else list(torch.view_as_real(fp.to(torch.complex128)).unbind(-1))
        results = []
        for k, comp in enumerate(parts):
            comp = comp.contiguous()
            left = p["left"] if len(parts) == 1 else (p["left"][k] if p["left"] is not None else None)
            right = p["right"] if len(parts) == 1 else (p["right"][k] if p["right"] is not None else None)
            left = float(comp[0]) if left is None else float(left)
            right = float(comp[-1]) if right is None else float(right)
            out = self._zeros(x.numel(), torch.float64, x)
            self._launch("interp", x.numel(), self._arg(x), self._arg(xp), self._arg(comp), self._arg_out(out),
                         left, right)
            results.append(self._back(out, t[0]))
        res = results[0] if len(results) == 1 else torch.complex(results[0], results[1])
        return [res.reshape(tuple(t[0].shape))]

    def _arg_out(self, out: torch.Tensor) -> Any:
        # an output the kernel writes: the tensor's own memory (device array, or a host view under
        # the simulator; _zeros put it on the host then)
        return self.cuda.as_cuda_array(out) if self.mode == "cuda" else out.numpy()


KERNEL_IDS = ("numba.bincount", "numba.correlate", "numba.interp")


def numba_kernels(device_type: str = "cuda") -> tuple[dict[str, Callable], str]:
    """The kernel table to merge into the worker's, and the mode (see the module docstring)."""
    mode = numba_mode(device_type)
    if mode not in ("cuda", "simulator"):
        return {}, mode
    kernels = NumbaKernels(mode)
    return dict(zip(KERNEL_IDS, (kernels.bincount, kernels.correlate, kernels.interp))), mode

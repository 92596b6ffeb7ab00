"""The torch backend: arrays to the device and back, kernels run there in the layouts and dtypes
the client asked for, and the pinned buffers that stage inputs from a client's shared memory."""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import torch

from . import bench
from .kernels import DTYPES, Kernel
from .kernels.common import _dt

_BY_STR = {dt.str: t for dt, t in DTYPES.items()}  # a call's cdtype as it travels: no np.dtype() per call
ONE_THREAD_MAX = 256 << 10  # D71: input bytes up to which a CPU kernel runs on the calling thread alone
_from_numpy = torch.from_numpy

class TorchBackend:
    """Moves arrays to the device and back and runs kernels there; times each phase."""

    def __init__(self, device: str = "auto", bench_cache: bool = True):
        self.bench_cache = bench_cache  # reuse this host's last self-benchmark (D58)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # TF32 off: float32 matmuls and convolutions keep full float32 precision
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        # inputs arrive as read-only views on ZeroMQ frames; kernels never write to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self._pinned: list[torch.Tensor] = []  # page-locked staging buffers, one per input slot
        self._staged = 0  # slots handed out since the last sync: a call's inputs each get their own
        self._threads = torch.get_num_threads() if self.device.type == "cpu" else 0
        self._host = self.device.type == "cpu"  # D73: a CPU tensor is used as it came

    def sync(self) -> None:
        if not self._host and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._staged = 0  # every staged copy has landed: the buffers are free again

    def to_device(self, a: np.ndarray, staged: bool = False) -> torch.Tensor:
        """An input on the device, in its own dtype (the resident store keeps it so). ``staged``
        (an input in a client's shared-memory segment): on a GPU it is copied into a
        page-locked buffer and sent from there asynchronously (the caller synchronizes before the
        next call reuses the buffer); on the CPU it is used in place."""
        if self._host:
            return torch.from_numpy(_aligned(a))
        if not (staged and self.device.type == "cuda" and a.size and a.dtype in DTYPES):
            return torch.from_numpy(_aligned(a)).to(self.device)
        buf = self._pin(self._staged, a.nbytes)[:a.nbytes]
        self._staged += 1
        fortran = a.ndim > 1 and not a.flags.c_contiguous
        buf.numpy()[:] = a.reshape(-1, order="F" if fortran else "C").view(np.uint8)
        host = buf.view(DTYPES[a.dtype])
        host = host.view(a.shape[::-1]).permute(*range(a.ndim - 1, -1, -1)) if fortran else host.view(a.shape)
        return host.to(self.device, non_blocking=True)

    def _pin(self, slot: int, nbytes: int) -> torch.Tensor:
        while len(self._pinned) <= slot:
            self._pinned.append(torch.empty(0, dtype=torch.uint8))
        if self._pinned[slot].numel() < nbytes:
            self._pinned[slot] = torch.empty(max(nbytes, 3 * self._pinned[slot].numel() // 2),
                                             dtype=torch.uint8, pin_memory=True)
        return self._pinned[slot]

    def run(self, kernel: Kernel, arrays: list[np.ndarray], params: dict, layouts: list,
            staged: frozenset = frozenset()) -> tuple[list, dict]:
        """Host arrays in, host arrays out, with the time of each phase (the health check and a
        planned call, D76; test backends offer only this). ``staged``: the indices of inputs read
        from a client's segment (D79), sent as :meth:`to_device` sends those."""
        t0 = time.perf_counter()
        if staged:
            tensors = [self.to_device(a, i in staged) for i, a in enumerate(arrays)]
        elif self._host:  # D351: to_device's CPU case, without a call per input
            tensors = [_from_numpy(_aligned(a)) for a in arrays]
        else:
            tensors = [self.to_device(a) for a in arrays]
        host = self._host  # D351: on the CPU, nothing to wait for and no staged copy (to_device): no sync call
        if not host:
            self.sync()
        t1 = time.perf_counter()
        results = self.compute(kernel, tensors, params, layouts)
        if not host:
            self.sync()
        t2 = time.perf_counter()
        out = self.to_host(results)
        return out, {"h2d": t1 - t0, "kernel": t2 - t1, "d2h": time.perf_counter() - t2}

    def compute(self, kernel: Kernel, tensors: list, params: dict, layouts: list) -> list:
        """Device results in the layouts the client asked for. Inputs are cast to the compute dtype
        (or each to its ``idtypes`` entry); results to ``rdtypes`` where NumPy returns another type.
        D71: on the CPU, a small call's kernel runs on this thread alone (no pool thread woken)."""
        if self._threads > 1 and sum([t.nbytes for t in tensors if t is not None]) <= ONE_THREAD_MAX:
            torch.set_num_threads(1)
            try:
                return self._compute(kernel, tensors, params, layouts)
            finally:
                torch.set_num_threads(self._threads)
        return self._compute(kernel, tensors, params, layouts)

    def _compute(self, kernel: Kernel, tensors: list, params: dict, layouts: list) -> list:
        cdtype = _BY_STR.get(params["cdtype"]) or DTYPES[np.dtype(params["cdtype"])]
        idtypes = params.get("idtypes")  # per operand, where they differ
        rdtypes = params.get("rdtypes")
        if idtypes and len(idtypes) != len(tensors):
            raise ValueError(f"{len(idtypes)} idtypes for {len(tensors)} operands")
        wanted = [cdtype if d is None else _dt(d) for d in idtypes] if idtypes else [cdtype] * len(tensors)
        results = kernel([t if t.dtype == w else t.to(w) for t, w in zip(tensors, wanted)], params)
        if len(results) != len(layouts) or (rdtypes is not None and len(rdtypes) != len(results)):
            raise ValueError(f"kernel made {len(results)} results, the call asked for {len(layouts)} layouts")
        if rdtypes is not None:  # NumPy's result types (single precision from a double computation)
            results = [r.to(_dt(d)) for r, d in zip(results, rdtypes)]
        return [_with_layout(r.resolve_conj().resolve_neg(), lay) for r, lay in zip(results, layouts)]

    def to_host(self, results: list) -> list[np.ndarray]:
        """Results as host arrays (a result slot in a client's segment is then written through its
        fd, D67)."""
        if self._host:  # a CPU tensor's cpu() is itself
            return [r.numpy() for r in results]
        return [r.cpu().numpy() for r in results]

    def warm(self, shared: bool = False) -> dict[str, Any]:
        """A first kernel per dtype, then the self-benchmark (:func:`.bench.self_benchmark`).
        ``shared``: the worker shares its CPUs with the program that started it (embedded)."""
        dev = self.device
        for dt in (torch.float32, torch.float64, torch.complex64, torch.complex128):
            m = torch.ones(8, 8, dtype=dt, device=dev)
            torch.matmul(m, m)
            torch.fft.fft(m)
            # D52: each decomposition once, so that no explored call pays a library's first-call set-up
            spd = m + 8 * torch.eye(8, dtype=dt, device=dev)
            for fn in (torch.linalg.eigh, torch.linalg.svd, torch.linalg.qr, torch.linalg.cholesky,
                       torch.linalg.inv, torch.linalg.eigvals, torch.linalg.slogdet,
                       lambda a: torch.linalg.solve(a, a), lambda a: torch.linalg.lstsq(a, a)):
                try:
                    fn(spd)
                except RuntimeError:  # not on this device or dtype: its calls fail and say so themselves
                    pass
        return bench.self_benchmark(self, shared, cache=self.bench_cache)


def _aligned(a: np.ndarray) -> np.ndarray:
    """A received array is a view on its ZeroMQ frame, whose buffer need not be aligned to the element
    size; torch's CPU kernels assume it is (D54): copy those, the only ones, before wrapping them."""
    dt = a.dtype  # NumPy's own flag first (its alignment divides the element size; a complex's is half)
    if a.flags.aligned and (dt.alignment == dt.itemsize or a.ctypes.data % dt.itemsize == 0):
        return a
    return a.copy()


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

"""Kernels in torch, one per catalog kernel id, CUDA when present and the CPU otherwise.

A kernel takes the operands, already on the device and cast to the compute dtype the client asked
for (``cdtype``, or ``idtypes`` per operand), and the call's static parameters; it returns result
tensors in NumPy's order, which the backend casts to ``rdtypes`` when the call names them (numpy.linalg
computes in double and returns single precision for single inputs: so does the worker).
Semantics are NumPy's (or SciPy's), not torch's: where the two differ the kernel bridges the gap.
TF32 is off: the worker never returns lower precision than NumPy would.

A kernel raises :class:`NotReproducible` where the library's answer hinges on a decision this device
could take the other way: a pivot that is (nearly) zero (NumPy raises LinAlgError, or not), a
singular value next to a cut-off (a rank, a pseudo-inverse), eigenvalues whose realness is not
clear-cut, a condition estimate near SciPy's warning line, non-finite input. The client then computes
the call with the library itself, and the ledger says why.
"""
from __future__ import annotations

from . import fft, linalg, products, scipy_linalg
from .common import DTYPES, Kernel, NotReproducible

KERNELS: dict[str, Kernel] = {
    **products.KERNELS, **linalg.KERNELS, **fft.KERNELS, **scipy_linalg.KERNELS,
    # no catalog row: the transport benchmark's round trip (benchmarks/bench_shm.py), its input back
    "echo": lambda t, p: [t[0]],
}
__all__ = ["DTYPES", "KERNELS", "Kernel", "NotReproducible"]

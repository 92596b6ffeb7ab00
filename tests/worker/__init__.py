"""The worker: its numba kernels, its precision, its security."""

"""Which ops a CPU torch worker computes faster than NumPy on this host, and from what input size:
each op's worker kernel (through the catalog's rule and the backend, as a real call runs it) plus a
same-host round trip (`--rtt-ms`, D50's 1.9 ms) against NumPy's own function. Each side's best of
`--repeat` runs, per round; the median over `--rounds` interleaved rounds; sizes doubling. Prints one
row per op: the smallest measured input size from which the worker won at every larger size, and its
speed-up there; the rows of `fusion_shim/plan/cpuwins.py` are copied from it (D101).

    PYTHONPATH=. python benchmarks/cpu_wins.py [--repeat 5] [--rounds 3] [--ops numpy.fft.fft ...]

It prints the load average before and after: on a shared machine say so with the figures."""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time

import numpy as np
import torch

from fusion_shim.catalog import BY_NAME, prepare
from fusion_shim.worker.backend import TorchBackend
from fusion_shim.worker.bench import library_function
from fusion_shim.worker.kernels import KERNELS

RNG = np.random.default_rng(0)


def _c(shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


def _spd(n):
    g = RNG.standard_normal((n, n))
    return g @ g.T / n + np.eye(n)


# op -> (sizes, inputs of one size); every input float64 or complex128
CASES = {
    "numpy.matmul": ((64, 128, 256, 512, 1024), lambda n: (RNG.standard_normal((n, n)),) * 2),
    "numpy.linalg.solve": ((64, 128, 256, 512, 1024), lambda n: (_spd(n), RNG.standard_normal((n, n)))),
    "numpy.linalg.inv": ((64, 128, 256, 512, 1024), lambda n: (_spd(n),)),
    "numpy.linalg.cholesky": ((64, 128, 256, 512, 1024), lambda n: (_spd(n),)),
    "numpy.linalg.qr": ((64, 128, 256, 512, 1024), lambda n: (RNG.standard_normal((n, n)),)),
    "numpy.linalg.eigh": ((64, 128, 256, 512), lambda n: (_spd(n),)),
    "numpy.linalg.svd": ((64, 128, 256, 512), lambda n: (RNG.standard_normal((n, n)),)),
    "numpy.linalg.det": ((64, 128, 256, 512, 1024), lambda n: (_spd(n),)),
    "numpy.fft.fft": ((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20), lambda n: (_c(n),)),
    "numpy.fft.ifft": ((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20), lambda n: (_c(n),)),
    "numpy.fft.rfft": ((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 21), lambda n: (RNG.standard_normal(n),)),
    "numpy.fft.irfft": ((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20), lambda n: (_c(n // 2 + 1),)),
    "numpy.fft.fft2": ((64, 128, 256, 512, 1024), lambda n: (_c((n, n)),)),
    "numpy.fft.ifft2": ((64, 128, 256, 512, 1024), lambda n: (_c((n, n)),)),
    "numpy.fft.fftn": ((16, 32, 64, 128), lambda n: (_c((n, n, n)),)),
    "numpy.fft.rfft2": ((64, 128, 256, 512, 1024, 2048), lambda n: (RNG.standard_normal((n, n)),)),
    "numpy.fft.irfft2": ((64, 128, 256, 512, 1024, 2048), lambda n: (_c((n, n // 2 + 1)),)),
}


def best(fn, repeat):
    fn()
    t_best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best


def measure(backend, op, sizes, make, repeat):
    spec = BY_NAME[op]
    kernel = KERNELS[spec.kernel_id]
    fn = library_function(spec)
    rows = []
    for n in sizes:
        args = make(n)
        prep = prepare(spec, inspect.signature(fn), args, {})
        tensors = [backend.to_device(a) for a in prep.arrays]
        t_np = best(lambda: fn(*args), repeat)
        t_torch = best(lambda: backend.compute(kernel, tensors, prep.params, prep.layouts), repeat)
        rows.append((sum(a.nbytes for a in args), t_np, t_torch))
    return rows


def median_rows(rounds):
    """Per size, the median over rounds of each side's best time."""
    return [(r[0][0], statistics.median(x[1] for x in r), statistics.median(x[2] for x in r))
            for r in zip(*rounds)]


def win_from(rows, rtt):
    """The smallest input size from which the worker (kernel plus ``rtt``) won at every larger
    measured size (None: never)."""
    start = None
    for nbytes, t_np, t_torch in rows:
        if t_torch + rtt < t_np:
            start = start or nbytes
        else:
            start = None
    return start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=1.9)
    ap.add_argument("--ops", nargs="*", default=list(CASES))
    ns = ap.parse_args()
    rtt = ns.rtt_ms / 1e3
    print("load average before:", open("/proc/loadavg").read().split()[:3], "torch threads", torch.get_num_threads(),
          "cpus", len(os.sched_getaffinity(0)), "rtt", ns.rtt_ms, "ms")
    backend = TorchBackend("cpu", bench_cache=False)
    rounds = {op: [] for op in ns.ops}
    for _ in range(ns.rounds):  # interleaved: a burst of other load hits every op a little
        for op in ns.ops:
            rounds[op].append(measure(backend, op, *CASES[op], ns.repeat))
    for op in ns.ops:
        rows = median_rows(rounds[op])
        detail = "  ".join(f"{b / 1e6:.3g}MB {tn * 1e3:.3g}/{tt * 1e3:.3g}ms" for b, tn, tt in rows)
        start = win_from(rows, rtt)
        ratio = next((tn / (tt + rtt) for b, tn, tt in rows if b == start), None)
        verdict = f"wins from {start} B ({ratio:.2f}x there)" if start else "never wins"
        print(f"{op:24s} {verdict:34s} numpy/torch: {detail}", flush=True)
    print("load average after:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()

"""Child program for bench_residency.py: an iterative workload that reuses one large matrix.

    python benchmarks/_iterative.py power|gd STEPS

power: power iteration with a 4096x2048 float64 matrix (64 MiB), STEPS matrix-vector products.
gd:    gradient descent over a fixed 8192x1024 float64 design matrix (64 MiB), STEPS steps of
       X.T @ (X @ w - y) (the matrix and its transpose are the same bytes).
Prints one JSON line with a checksum.
"""
import json
import sys

import numpy as np

kind, steps = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
if kind == "power":
    a = rng.standard_normal((4096, 2048))
    v = np.ones(2048)
    for _ in range(steps):
        w = np.matmul(a.T, np.matmul(a, v))
        v = w / np.linalg.norm(w)
    result = float(np.linalg.norm(np.matmul(a, v)))
else:
    x = rng.standard_normal((8192, 1024))
    y = rng.standard_normal(8192)
    w = np.zeros(1024)
    for _ in range(steps):
        w = w - 1e-5 * np.matmul(x.T, np.matmul(x, w) - y)
    result = float(np.linalg.norm(w))
print(json.dumps({"kind": kind, "steps": steps, "result": result}))

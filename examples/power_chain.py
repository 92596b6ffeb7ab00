"""A chain of normalised nonlinear power steps, X <- tanh(A X) / ||tanh(A X)||, from several starts.

Every step depends on the one before, so per-call offload would send each intermediate both ways;
run with ``--stage __main__:chain`` the whole chain runs on the worker instead, and only A (once),
each start and each result cross (docs/stages.md).

Usage: python examples/power_chain.py [n]   (default 1024: A is n x n, X is n x n/8, 100 steps)
"""

import sys

import numpy as np


def chain(A, X, steps):
    for _ in range(steps):
        X = np.tanh(A @ X)
        X /= np.linalg.norm(X)
    return X


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    rng = np.random.default_rng(7)
    A = rng.standard_normal((n, n)) / np.sqrt(n)
    for start in range(3):
        X = rng.standard_normal((n, max(n // 8, 1)))
        Y = chain(A, X, 100)
        print(f"start {start}: |Y| = {np.linalg.norm(Y):.6f}, mean = {Y.mean():+.6e}, "
              f"first column norm = {np.linalg.norm(Y[:, 0]):.6f}")


if __name__ == "__main__":
    main()

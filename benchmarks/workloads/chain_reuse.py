"""A chain that reuses one large matrix: block power iteration, A @ X with a fresh X each step.
Without residency (issue 6) every step ships A again."""
import numpy as np

DESCRIPTION = "16 steps of X = A @ X, A f8 1024^2 reused, X 1024 x 384"


def setup():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1024, 1024))
    return {"a": (a + a.T) / 64, "x": rng.standard_normal((1024, 384))}


def run(data):
    a, x = data["a"], data["x"]
    for _ in range(16):
        x = np.matmul(a, x)
        x /= np.linalg.norm(x, axis=0)  # intercepted, but too little work to move: its floor rises past it
    return float(x[0].sum())

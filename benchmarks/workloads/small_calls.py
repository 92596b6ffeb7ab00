"""Many small calls in a loop, with element-wise work between them: each call far below any size that
could pay for a round trip."""
import numpy as np

DESCRIPTION = "1,000 small calls (500 matmul 64^2, 250 solve 48^2, 250 fft 2048) between element-wise steps"


def setup():
    rng = np.random.default_rng(2)
    return {"a": rng.standard_normal((64, 64)) / 64, "s": rng.standard_normal((48, 48)) + 48 * np.eye(48),
            "r": rng.standard_normal((48, 4)), "x": rng.standard_normal(2048), "v": rng.standard_normal(20000)}


def run(data):
    a, s, r, x, v = data["a"], data["s"], data["r"], data["x"], data["v"]
    acc = np.eye(64)
    total = 0.0
    for i in range(250):
        acc = np.matmul(acc, a)
        acc = np.matmul(a, acc) + np.eye(64) * 1e-3
        sol = np.linalg.solve(s, r)
        spec = np.fft.fft(x + i)
        v = np.tanh(v * 0.99 + 0.01) * np.cos(v)  # the program's own work between calls
        total += float(sol[0, 0]) + float(abs(spec[1])) + float(v[0])
    return total + float(acc.sum())

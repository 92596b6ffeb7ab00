"""A realistic analysis script: standardise a data matrix, covariance, eigendecomposition, project,
a least-squares fit, spectra of some signals, and a loop of small model updates."""
import numpy as np

DESCRIPTION = "X f8 20000x200: covariance, eigh, projection, lstsq by normal equations, rfft 64x4096, 300 small updates"


def setup():
    rng = np.random.default_rng(6)
    return {"x": rng.standard_normal((20000, 200)) * np.linspace(1, 3, 200), "y": rng.standard_normal(20000),
            "sig": rng.standard_normal((64, 4096)), "w": rng.standard_normal((48, 48)) / 48}


def run(data):
    x = (data["x"] - data["x"].mean(axis=0)) / data["x"].std(axis=0)
    cov = np.dot(x.T, x) / x.shape[0]
    w, v = np.linalg.eigh(cov)
    proj = np.matmul(x, v[:, -20:])
    beta = np.linalg.solve(np.dot(x.T, x) + np.eye(200), np.dot(x.T, data["y"]))
    spectra = np.abs(np.fft.rfft(data["sig"], axis=1)) ** 2
    state = np.ones(48)
    for _ in range(300):
        state = np.tanh(np.dot(data["w"], state))
    return float(proj[0, 0] + beta[0] + spectra.mean() + state.sum())

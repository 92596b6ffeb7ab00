"""Dense decompositions and solves: the most work per input byte."""
import numpy as np

DESCRIPTION = "eigh 768, svd 512, solve 1024 (64 rhs), qr 768, cholesky 1024, inv 768 (all f8)"


def setup():
    rng = np.random.default_rng(5)
    m = rng.standard_normal((1024, 1024))
    spd = np.dot(m, m.T) / 1024 + np.eye(1024)
    return {"sym": spd[:768, :768].copy(), "g": rng.standard_normal((512, 512)), "spd": spd,
            "rhs": rng.standard_normal((1024, 64)), "q": rng.standard_normal((768, 768))}


def run(data):
    w, v = np.linalg.eigh(data["sym"])
    s = np.linalg.svd(data["g"], compute_uv=False)
    x = np.linalg.solve(data["spd"], data["rhs"])
    q, r = np.linalg.qr(data["q"])
    c = np.linalg.cholesky(data["spd"])
    i = np.linalg.inv(data["sym"])
    return float(w[-1] + s[0] + x[0, 0] + r[0, 0] + c[-1, -1] + i[0, 0])

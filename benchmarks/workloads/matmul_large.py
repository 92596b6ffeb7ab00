"""Large matrix products, float64 and float32: the most compute per byte moved."""
import numpy as np

DESCRIPTION = "4 large matmuls: 2 x f8 1536^2, 2 x f4 2048^2"


def setup():
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((1536, 1536)), "b": rng.standard_normal((1536, 1536)),
            "c": rng.standard_normal((2048, 2048)).astype(np.float32),
            "d": rng.standard_normal((2048, 2048)).astype(np.float32)}


def run(data):
    ab = np.matmul(data["a"], data["b"])
    aba = np.matmul(ab, data["a"]) / 1536.0
    cd = np.matmul(data["c"], data["d"])
    cdc = np.dot(cd, data["c"])
    return float(aba[0, 0] + cdc[0, 0])

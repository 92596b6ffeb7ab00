"""Where a call runs: ``decide`` is pure (no I/O) and returns a Decision that carries its reason.

Policies: ``local`` never offloads; ``remote`` offloads every supported call (for tests and
measurement); ``auto`` (the default) compares predicted local time with predicted transfer plus
worker time, from a quick calibration of both sides and of the link, corrected online by measured
times. This is the first cost model (issue 2); the full planner is issue 5.

The planner imports neither zmq nor torch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

# Below this many input bytes a call never leaves the process under ``auto``: even a matmul of
# that size (90x90 float64) takes ~15 us locally against a ~150 us round trip (shared/LIMITS.md).
# The interceptor compares against it before doing anything else: one sum and one comparison.
FLOOR_BYTES = 64 * 1024
MARGIN = 1.25  # remote must be predicted this much faster before it is chosen
FAMILIES = ("products", "linalg", "fft")
# Priors until measured (2-core development machine, shared/LIMITS.md): GFLOP/s per family.
PRIOR_GFLOPS = {"products": 50.0, "linalg": 10.0, "fft": 3.0}


@dataclass(frozen=True)
class Decision:
    where: str                     # "local" or "worker"
    reason: str
    local_s: float | None = None   # predicted seconds, where a prediction was made
    remote_s: float | None = None


@dataclass
class Profile:
    """What the planner knows: measured rates of both sides, the link, and online corrections."""
    local_gflops: dict[str, float] = field(default_factory=lambda: dict(PRIOR_GFLOPS))
    worker_gflops: dict[str, float] = field(default_factory=lambda: dict(PRIOR_GFLOPS))
    rtt_s: float = 200e-6
    bandwidth: float = 2e9         # bytes/s, each way
    correction: dict[tuple[str, str], float] = field(default_factory=dict)  # (family, place) -> log ratio
    calibrated: bool = False

    def predict_local(self, family: str, flops: float) -> float:
        return flops / (self.local_gflops[family] * 1e9) * math.exp(self.correction.get((family, "local"), 0.0))

    def predict_remote(self, family: str, flops: float, bytes_in: int, bytes_out: int) -> float:
        compute = flops / (self.worker_gflops[family] * 1e9) * math.exp(self.correction.get((family, "worker"), 0.0))
        return self.rtt_s + (bytes_in + bytes_out) / self.bandwidth + compute

    def learn(self, family: str, place: str, predicted: float | None, actual: float) -> None:
        """Online correction: an exponential average of log(actual / predicted) per family and place."""
        if not predicted or predicted <= 0 or actual <= 0:
            return
        key = (family, place)
        old = self.correction.get(key, 0.0)
        # the prediction already includes the old correction; move toward the residual
        self.correction[key] = old + 0.3 * math.log(actual / predicted)

    def learn_link(self, nbytes: int, seconds: float) -> None:
        if nbytes >= 1 << 20 and seconds > 0:
            self.bandwidth = 0.7 * self.bandwidth + 0.3 * (nbytes / seconds)


def decide(policy: str, family: str, flops: float, bytes_in: int, bytes_out: int,
           worker_state: str, profile: Profile, min_flops: float) -> Decision:
    if policy == "local":
        return Decision("local", "policy local")
    if policy == "remote":
        if worker_state != "ready":
            return Decision("local", f"worker {worker_state}")
        # priced anyway, so that the report can estimate what offloading saved or cost
        return Decision("worker", "policy remote", profile.predict_local(family, flops),
                        profile.predict_remote(family, flops, bytes_in, bytes_out))
    if flops < min_flops:
        return Decision("local", f"below the floor: {flops:.3g} flops < {min_flops:.3g}")
    if worker_state != "ready":
        return Decision("local", f"worker {worker_state}")
    local_s = profile.predict_local(family, flops)
    remote_s = profile.predict_remote(family, flops, bytes_in, bytes_out)
    if remote_s * MARGIN < local_s:
        return Decision("worker", f"predicted {remote_s * 1e3:.3g} ms on the worker < {local_s * 1e3:.3g} ms here",
                        local_s, remote_s)
    return Decision("local", f"predicted {local_s * 1e3:.3g} ms here <= {remote_s * 1e3:.3g} ms on the worker",
                    local_s, remote_s)


def calibrate_local() -> dict[str, float]:
    """Local GFLOP/s per family from three short probes (~10 ms in all), the same probes the worker
    runs on its device while warming."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((384, 384))
    x = (rng.standard_normal(1 << 16) + 1j * rng.standard_normal(1 << 16))
    probes = {
        "products": (lambda: np.matmul(a, a), 2 * 384**3),
        "linalg": (lambda: np.linalg.solve(a, a), 2 / 3 * 384**3 + 2 * 384**3),
        "fft": (lambda: np.fft.fft(x), 5 * (1 << 16) * 16),
    }
    rates = {}
    for family, (fn, flops) in probes.items():
        fn()
        best = math.inf
        for _ in range(3):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        rates[family] = flops / best / 1e9
    return rates

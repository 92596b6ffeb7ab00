"""The floors ``auto`` would publish after 1,800 forced-remote small calls to a CPU worker.

    FUSION_SHIM_DEVICE=cpu python benchmarks/floors_after_calls.py

Runs 64x64 and smaller ``np.matmul``s and ``np.dot``s of 1 and 1,024 elements under ``policy
remote`` (residency off) on the embedded worker, then asks the planner's models for the floors
(``plan.policy.floors_by_dtype``, the function behind the C fast path's floors): a cheaper remote
call shows as lower floors. One run: the figures move by tens of percent from run to run, so
compare trees alternately in one session.
"""
import os

import numpy as np

import fusion_shim
from fusion_shim.plan.policy import floors_by_dtype

OPS = ("numpy.matmul", "numpy.dot", "numpy.linalg.inv", "numpy.linalg.solve")


def main() -> None:
    os.environ.setdefault("FUSION_SHIM_DEVICE", "cpu")
    fusion_shim.install(policy="remote", quiet=True, residency=False)
    rng = np.random.default_rng(0)
    squares = [(rng.random((n, n)), rng.random((n, n))) for n in (8, 16, 32, 64)]
    vectors = [(rng.random(k), rng.random(k)) for k in (1, 1024)]
    for i in range(1800):
        if i % 3 == 2:
            np.dot(*vectors[i % 2])
        else:
            np.matmul(*squares[i % 4])
    planner = fusion_shim.active().planner
    by = floors_by_dtype(planner.profile, [0], ops=planner.ops)
    print(f"link model's round trip {planner.profile.workers[0].link.rtt * 1e6:.0f} us")
    print(f"smallest floor (the C fast path's) {min(min(d.values()) for d in by.values() if d):,} B")
    for op in OPS:
        print(f"{op} {min(by[op].values()):,} B")
    fusion_shim.uninstall()


if __name__ == "__main__":
    main()

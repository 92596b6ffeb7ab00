"""The programs the pool's tests run through the shim and with plain Python.

``spread``: products from two threads (so that both workers of a pool have calls), exact in float64
(small integers), printed. ``until_stopped DIR``: the same, round after round, each round's number
printed and its index written to ``DIR/progress``, until ``DIR/stop`` exists (``--rounds N``: exactly
N rounds, for the plain run to compare with)."""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

N = 256


def one(seed: int) -> float:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 9, (N, N)).astype(np.float64)
    b = rng.integers(0, 9, (N, N)).astype(np.float64)
    return float((a @ b).sum())


def round_of(r: int, pool: ThreadPoolExecutor) -> list[float]:
    return list(pool.map(one, range(4 * r, 4 * r + 4)))


def main(argv: list[str]) -> None:
    with ThreadPoolExecutor(2) as pool:
        if argv[0] == "spread":
            for r in range(4):
                print(r, round_of(r, pool))
            return
        directory, rounds = argv[1], None
        if "--rounds" in argv:
            rounds = int(argv[argv.index("--rounds") + 1])
        deadline = time.monotonic() + 900  # a safety net: the test stops it long before
        r = 0
        while (r < rounds) if rounds is not None else not os.path.exists(os.path.join(directory, "stop")):
            print(r, round_of(r, pool), flush=True)
            with open(os.path.join(directory, "progress.tmp"), "w") as f:
                f.write(str(r))
            os.replace(os.path.join(directory, "progress.tmp"), os.path.join(directory, "progress"))
            r += 1
            if time.monotonic() > deadline:
                break


if __name__ == "__main__":
    main(sys.argv[1:])

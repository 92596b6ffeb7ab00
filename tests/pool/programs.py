"""The programs the pool's tests run through the shim and with plain Python.

``spread``: products from two threads (so that both workers of a pool have calls), exact in float64
(small integers), printed. ``until_stopped DIR``: the same, round after round, each round's number
printed and its index written to ``DIR/progress``, until ``DIR/stop`` exists (``--rounds N``: exactly
N rounds, for the plain run to compare with). ``few``: a handful of small products, too little to
open a pool under ``auto``. ``until_opened``: 400x400 products (above the pool's evidence floor) for
3 s, enough to open it under ``auto``; then waits until the shim's report says where the pool's
workers stand, and computes on. Each prints whether Ray was loaded in this process last.

The pool's helpers keep normal priority here (``lower_priority`` replaced): a test machine busy with
other work would otherwise starve them for minutes."""
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


def until_opened() -> None:
    from fusion_shim.client import embedded

    embedded.lower_priority = lambda pid: None
    a = np.random.default_rng(0).standard_normal((400, 400))
    t = time.monotonic()
    while time.monotonic() - t < 3.0:
        a = a @ a
        a /= np.abs(a).max()
    import fusion_shim

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the pool is opened and its workers answer off this thread
        pool = fusion_shim.report("json")["pool"]
        if pool["workers"] and all(w["state"] not in ("starting", "down") for w in pool["workers"]):
            break
        if any("not used" in e["what"] for e in fusion_shim.report("json")["events"]):
            break
        time.sleep(0.5)
    for _ in range(20):
        a = a @ a
        a /= np.abs(a).max()
    print("opened", "ray" in sys.modules)


def main(argv: list[str]) -> None:
    if argv[0] == "few":
        a = np.ones((300, 300))
        print(float((a @ a).sum()), "ray" in sys.modules)
        return
    if argv[0] == "until_opened":
        until_opened()
        return
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

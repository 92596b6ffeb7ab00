"""Run by :mod:`.locate` as ``python -m fusion_shim.pool.join ADDRESS NAME PUBLIC [INDEX]``, never imported
by the shim: joins the cluster as a Ray driver, gives the client's public key to each worker of pool NAME
(or to worker INDEX only) and prints one JSON line: ``{"workers": [...], "why": ..., "import_s": ...,
"connect_s": ..., "join_s": ...}``, each worker as its actor's ``join`` describes it (keys as text).

D300: a process of its own, so that the program never imports Ray nor pays a driver's exit: it
leaves with ``os._exit`` once its line is out (the actors are detached; the cluster sees a driver gone).
Ray's messages to this driver go nowhere (its parent reads only stdout's last line).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def join(address: str, name: str, public: bytes, index: int | None) -> dict[str, Any]:
    t = time.perf_counter()
    import ray  # noqa: F401

    from .locate import JOIN_TIMEOUT_S
    from .manage import connect, names

    out: dict[str, Any] = {"workers": [], "why": None, "import_s": time.perf_counter() - t}
    t = time.perf_counter()
    try:
        ray = connect(address, lambda text: None)
        found = names(ray, name)
    except Exception as exc:  # the cluster refused us: the program runs there
        out["why"] = f"{type(exc).__name__}: {exc}"[:300]
        return out
    out["connect_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if index is not None:
        found = [n for n in found if n == f"{name}.{index}"]
    for n in found:
        try:
            d = ray.get(ray.get_actor(n).join.remote(public), timeout=JOIN_TIMEOUT_S)
        except Exception as exc:
            out["workers"].append({"name": n, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        d["server_key"] = d["server_key"].decode("ascii") if isinstance(d["server_key"], bytes) else d["server_key"]
        out["workers"].append(d)
    out["join_s"] = time.perf_counter() - t
    return out


def main(argv: list[str]) -> None:
    address, name, public = argv[0], argv[1], argv[2].encode("ascii")
    index = int(argv[3]) if len(argv) > 3 else None
    try:
        out = join(address, name, public, index)
    except Exception as exc:
        out = {"workers": [], "why": f"{type(exc).__name__}: {exc}"[:300]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # D300: no driver shutdown; the parent has what it asked for


if __name__ == "__main__":
    main(sys.argv[1:])

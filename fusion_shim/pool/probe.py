"""Run as a script by :mod:`.cluster` (``python -I probe.py ADDRESS``), never imported by the shim: asks the
cluster at ADDRESS, as Ray will dial it, whether it is there and whether it refuses a caller without
Ray's token. Prints one JSON line: ``{"address": ..., "state": ..., "why": ...}``, state one of
``unreachable``, ``token`` (the cluster demands a token), ``open`` (it serves anyone), ``error``.

Its parent runs it with ``RAY_AUTH_MODE=disabled`` and no token in its environment, so that what the
cluster answers is what it answers a stranger. A process of its own: Ray's auth mode is per process,
and a GCS client that cannot connect retries for a minute (the parent bounds it).
"""
import json
import socket
import sys

REACH_TIMEOUT_S = 3.0


def probe(address: str) -> dict:
    from ray._private import services

    try:
        # D212: Ray dials this form (loopback names become this host's address), not what was typed
        dialed = services.canonicalize_bootstrap_address(address)
    except Exception as exc:
        return {"address": address, "state": "error", "why": f"{type(exc).__name__}: {exc}"[:300]}
    if dialed is None:
        return {"address": address, "state": "unreachable", "why": "this host belongs to no Ray cluster"}
    host, _, port = dialed.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        return {"address": dialed, "state": "unreachable", "why": f"nothing accepts a connection there ({why})"}
    if not services.find_node_ids():  # a driver joins through a Ray node of this host, or waits a minute for one
        return {"address": dialed, "state": "error",
                "why": f"no Ray node runs on this host (join it first: ray start --address {dialed})"}
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=dialed)
    except AuthenticationError:
        return {"address": dialed, "state": "token", "why": ""}
    except Exception as exc:
        return {"address": dialed, "state": "error", "why": f"{type(exc).__name__}: {exc}"[:300]}
    return {"address": dialed, "state": "open", "why": ""}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])), flush=True)

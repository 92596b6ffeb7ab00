"""The worker pool on Ray: Ray places, starts, finds and restarts the workers; every call still
travels over each worker's own CURVE-authenticated ZeroMQ socket (D150).

A pool is N detached actors named ``NAME.I`` in the Ray namespace ``fusion_shim``, spread by a
placement group ``NAME``. Each actor (:mod:`.actor`, the worker side) runs the ordinary worker bound
to its node's address, with a key pair made at its start and an allow-list that starts empty;
:mod:`.manage` brings a pool up and down and reads its status (``fusion-shim pool``, :mod:`.command`);
:mod:`.locate` is what a client runs: it finds the actors, gives each its public key through Ray and
learns their endpoints and keys the same way (D152). Only these modules import ray, and only once a
pool is configured.
"""
from __future__ import annotations

NAMESPACE = "fusion_shim"
DEFAULT_NAME = "default"
SCHEME = "ray://"


def parse(url: str) -> tuple[str, str]:
    """``ray://ADDRESS[/NAME]`` -> (Ray address, pool name); ``auto`` is the cluster this host is in."""
    if not url.startswith(SCHEME):
        raise ValueError(f"{url!r} is not a pool address; valid: ray://ADDRESS[/NAME], ray://auto")
    address, _, name = url[len(SCHEME):].partition("/")
    if not address:
        raise ValueError(f"{url!r} names no Ray address; valid: ray://HOST:PORT[/NAME], ray://auto")
    if name and not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"{url!r}: pool name {name!r} is invalid; valid: letters, digits, - and _")
    return address, name or DEFAULT_NAME


def actor_name(pool: str, index: int) -> str:
    return f"{pool}.{index}"

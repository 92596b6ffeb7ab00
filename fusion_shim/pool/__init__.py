"""The worker pool on Ray: Ray places, starts, finds and restarts the workers; every call still
travels over each worker's own CURVE-authenticated ZeroMQ socket (D150).

A pool is N detached actors named ``NAME.I`` in the Ray namespace ``fusion_shim``, spread by a
placement group ``NAME``. Each actor (:mod:`.actor`, the worker side) runs the ordinary worker bound
to its node's address, with a key pair made at its start and an allow-list that starts empty;
:mod:`.manage` brings a pool up and down and reads its status (``fusion-shim pool``, :mod:`.command`);
:mod:`.locate` is what a client runs: it finds the actors, gives each its public key through Ray and
learns their endpoints and keys the same way (D152), through :mod:`.join`, a helper process that is
the Ray driver (D300). Only these modules import ray, and a program using a pool never does.
"""
from __future__ import annotations

# the address is read where settings are checked, below this package: no ray to parse it
from ..config import POOL_DEFAULT_NAME as DEFAULT_NAME  # noqa: F401
from ..config import POOL_SCHEME as SCHEME  # noqa: F401
from ..config import parse_pool as parse  # noqa: F401

NAMESPACE = "fusion_shim"


def actor_name(pool: str, index: int) -> str:
    return f"{pool}.{index}"

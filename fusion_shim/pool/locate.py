"""What a client runs to use a pool: find its workers through Ray, give each this run's public key,
learn each one's endpoint and key; later, find a worker again after Ray restarted it.

The client's key pair is made for the run and never written anywhere. Ray's channel carries the
keys both ways: a cluster's token authenticates that exchange (D152). A cluster that cannot be
reached is found out with a plain TCP connection first (D151): joining an unreachable cluster
blocks ``ray.init`` for a minute and then ends the process, which would end the user's program.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

from . import NAMESPACE, parse

REACH_TIMEOUT_S = 3.0   # D151: the TCP check of the cluster's address
JOIN_TIMEOUT_S = 120.0  # a worker Ray is restarting answers once its actor is up again (torch imported)
CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` writes this host's cluster address


@dataclass(frozen=True)
class Endpoint:
    """One pool worker as a client reaches it."""
    name: str
    url: str
    curve: tuple[bytes, bytes, bytes]  # (server public, client public, client secret)
    info: dict = field(default_factory=dict)  # node, device, pid, Ray's GPU ids, emulated or not


class Pool:
    """A pool named by ``ray://ADDRESS[/NAME]``, as one client sees it."""

    def __init__(self, url: str, event: Callable[[str], None]):
        self.url = url
        self.address, self.name = parse(url)
        self._event = event
        self._ray: Any = None
        self._handles: list[Any] = []
        self._owner = os.getpid()
        import zmq

        self._public, self._secret = zmq.curve_keypair()

    def open(self) -> tuple[list[Endpoint], str | None]:
        """(the pool's workers, None), or ([], why the run stays local)."""
        why = unreachable(self.address)
        if why is not None:
            return [], why
        try:
            from .manage import connect, names

            self._ray = connect(self.address)
            found = names(self._ray, self.name)
            self._handles = [self._ray.get_actor(n) for n in found]
        except Exception as exc:  # ray missing, or the cluster refused us: the program runs here
            return [], f"{type(exc).__name__}: {exc}"[:300]
        if not self._handles:
            return [], f"the cluster has no pool named {self.name!r} (fusion-shim pool up --ray ADDRESS --name NAME)"
        got = [self.locate(i) for i in range(len(self._handles))]
        endpoints = [e for e in got if e is not None]
        if not endpoints:
            return [], "no worker of the pool answered through Ray"
        return endpoints, None

    def locate(self, index: int) -> Endpoint | None:
        """Worker ``index`` where it is now, this run's key given to it again (a restarted actor
        starts with an empty allow-list); None when Ray cannot reach it (its calls run here)."""
        if os.getpid() != self._owner or index >= len(self._handles):
            return None  # a forked child has no Ray connection of its own
        try:
            d = self._ray.get(self._handles[index].join.remote(self._public), timeout=JOIN_TIMEOUT_S)
        except Exception as exc:
            self._event(f"pool worker {self.name}.{index}: not found through Ray: {type(exc).__name__}: {exc}"[:300])
            return None
        info = {k: d.get(k) for k in ("node", "device", "pid", "ray_gpus", "gpu_emulated", "state")}
        return Endpoint(d["name"], d["url"], (d["server_key"], self._public, self._secret), info)


def unreachable(address: str) -> str | None:
    """D151: why ``address`` cannot be a Ray cluster's (nothing accepts a TCP connection there), or None."""
    if address == "auto":
        try:
            with open(CURRENT_CLUSTER) as f:
                address = f.read().strip()
        except OSError:
            return f"ray://auto: this host belongs to no Ray cluster ({CURRENT_CLUSTER} is missing)"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"Ray address {address!r} is not HOST:PORT"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        return f"the Ray cluster at {address} cannot be reached ({exc.strerror or exc})"
    return None

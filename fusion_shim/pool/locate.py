"""What a client runs to use a pool: find its workers through Ray, give each this run's public key,
learn each one's endpoint and key; later, find a worker again after Ray restarted it.

The client's key pair is made for the run and never written anywhere. Ray's channel carries the
keys both ways: a cluster's token authenticates that exchange (D152), so a cluster that asks for
none is refused (D210). A cluster that cannot be reached as Ray dials it is found out before Ray is
joined (:mod:`.cluster`, D151, D212): joining an unreachable cluster blocks ``ray.init`` for a minute
and then ends the process, which would end the user's program.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from . import parse
from .cluster import check

JOIN_TIMEOUT_S = 120.0  # a worker Ray is restarting answers once its actor is up again (torch imported)


@dataclass(frozen=True)
class Endpoint:
    """One pool worker as a client reaches it."""
    name: str
    url: str
    curve: tuple[bytes, bytes, bytes]  # (server public, client public, client secret)
    info: dict = field(default_factory=dict)  # node, device, pid, Ray's GPU ids, emulated or not


class Pool:
    """A pool named by ``ray://ADDRESS[/NAME]``, as one client sees it."""

    def __init__(self, url: str, event: Callable[[str], None], insecure: bool = False):
        self.url = url
        self.insecure = insecure  # a cluster without token authentication used anyway (D210)
        self.address, self.name = parse(url)
        self._event = event
        self._ray: Any = None
        self._handles: list[Any] = []
        self._owner = os.getpid()
        import zmq

        self._public, self._secret = zmq.curve_keypair()

    def open(self) -> tuple[list[Endpoint], str | None]:
        """(the pool's workers, None), or ([], why the run stays local)."""
        why, warning = check(self.address, self.insecure)
        if why is not None:
            return [], why
        if warning is not None:
            self._event(f"pool {self.url} used anyway (--insecure): {warning}")
        try:
            from .manage import connect, names

            self._ray = connect(self.address, self._event)
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

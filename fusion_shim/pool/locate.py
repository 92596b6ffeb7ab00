"""What a client runs to use a pool: find its workers through Ray, give each this run's public key,
learn each one's endpoint and key; later, find a worker again after Ray restarted it.

D300: the Ray driver that does this is a helper process (:mod:`.join`), not the program: the
program never imports Ray nor waits for a driver's exit. The client's key pair is made for the run
and never written anywhere (its public half is the helper's argument). Ray's channel carries the
keys both ways: a cluster's token authenticates that exchange (D152), so a cluster that asks for
none is refused (D210). A cluster that cannot be reached as Ray dials it is found out before Ray is
joined (:mod:`.cluster`, D151, D212): joining an unreachable cluster blocks ``ray.init`` for a minute
and then ends the process, which would end the user's program.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import parse
from .cluster import PROBE_TIMEOUT_S, check

JOIN_TIMEOUT_S = 120.0  # a worker Ray is restarting answers once its actor is up again (torch imported)
HELPER_TIMEOUT_S = JOIN_TIMEOUT_S + 60.0  # Ray's import and connect on a loaded host, then the joins


@dataclass(frozen=True)
class Endpoint:
    """One pool worker as a client reaches it."""
    name: str
    url: str
    curve: tuple[bytes, bytes, bytes]  # (server public, client public, client secret)
    info: dict = field(default_factory=dict)  # node, device, pid, Ray's GPU ids, emulated or not


class Pool:
    """A pool named by ``ray://ADDRESS[/NAME]``, as one client sees it."""

    def __init__(self, url: str, event: Callable[[str], None], insecure: bool = False,
                 idle: Callable[[int], None] | None = None):
        self.url = url
        self.insecure = insecure  # a cluster without token authentication used anyway (D210)
        self.address, self.name = parse(url)
        self._event = event
        self._idle = idle  # lowers a helper's priority, given its pid (under auto nobody waits for it)
        self._count = 0  # workers found by open()
        self._owner = os.getpid()
        self.ray: dict[str, float] = {}  # D300: seconds Ray cost, summed over the helper processes
        self._lock = threading.Lock()
        self._helper: subprocess.Popen | None = None  # the helper running now
        self._closed = False
        import zmq

        self._public, self._secret = zmq.curve_keypair()

    def open(self) -> tuple[list[Endpoint], str | None]:
        """(the pool's workers, None), or ([], why the run stays local)."""
        t = time.perf_counter()
        # at idle priority nobody waits for the probe: it gets the helper's time, not a command's (D212)
        timeout = HELPER_TIMEOUT_S if self._idle is not None else PROBE_TIMEOUT_S
        why, warning = check(self.address, self.insecure, on_spawn=self._spawned, timeout=timeout)
        self._cost("probe_s", time.perf_counter() - t)  # its own process, which imports Ray too
        if why is not None:
            return [], why
        if warning is not None:
            self._event(f"pool {self.url} used anyway (--insecure): {warning}")
        found, why = self._join(None)
        if why is not None:
            return [], why
        if not found:
            return [], f"the cluster has no pool named {self.name!r} (fusion-shim pool up --ray ADDRESS --name NAME)"
        self._count = len(found)
        for d in found:
            if "error" in d:
                self._event(f"pool worker {d['name']}: not found through Ray: {d['error']}"[:300])
        endpoints = [self._endpoint(d) for d in found if "error" not in d]
        if not endpoints:
            return [], "no worker of the pool answered through Ray"
        return endpoints, None

    def locate(self, index: int) -> Endpoint | None:
        """Worker ``index`` where it is now, this run's key given to it again (a restarted actor
        starts with an empty allow-list); None when Ray cannot reach it (its calls run here)."""
        if os.getpid() != self._owner or index >= self._count:
            return None  # a forked child holds no key given to the pool
        found, why = self._join(index)
        d = found[0] if found else {"error": why or "not in the pool"}
        if "error" in d:
            self._event(f"pool worker {self.name}.{index}: not found through Ray: {d['error']}"[:300])
            return None
        return self._endpoint(d)

    def _endpoint(self, d: dict) -> Endpoint:
        info = {k: d.get(k) for k in ("node", "device", "pid", "ray_gpus", "gpu_emulated", "state")}
        server = d["server_key"].encode("ascii")
        return Endpoint(d["name"], d["url"], (server, self._public, self._secret), info)

    def _join(self, index: int | None) -> tuple[list[dict], str | None]:
        """D300: :mod:`.join` in a process of its own (Ray never loaded here, no driver to shut down):
        its workers' descriptions, or why none; what Ray cost there is added to ``self.ray``."""
        cmd = [sys.executable, "-m", "fusion_shim.pool.join", self.address, self.name, self._public.decode("ascii")]
        if index is not None:
            cmd.append(str(index))
        # no shim in the helper: FUSION_SHIM=1, inherited from a run, would install it there too
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
        t = time.perf_counter()
        with self._lock:
            if self._closed:
                return [], "the run ended"
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    stdin=subprocess.DEVNULL)
        self._spawned(proc)
        try:
            stdout, stderr = proc.communicate(timeout=HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return [], f"no answer through Ray within {HELPER_TIMEOUT_S:.0f} s"
        finally:
            self._cost("total_s", time.perf_counter() - t)
            with self._lock:
                self._helper = None
        try:
            got = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            return [], f"the pool's helper process failed: {tail}"[:300]
        for key in ("import_s", "connect_s", "join_s"):
            self._cost(key, got.get(key) or 0.0)
        return list(got.get("workers") or ()), got.get("why")

    def _spawned(self, proc: subprocess.Popen) -> None:
        """A helper (the probe, a driver) started: the one close() ends; at idle priority under auto."""
        with self._lock:
            self._helper = proc
            if self._closed:
                proc.kill()
        if self._idle is not None:
            self._idle(proc.pid)

    def close(self) -> None:
        """The run ends: a helper still asking Ray is killed (its joins are harmless to the pool)."""
        with self._lock:
            self._closed = True
            if self._helper is not None:
                self._helper.kill()

    def _cost(self, key: str, seconds: float) -> None:
        self.ray[key] = self.ray.get(key, 0.0) + seconds
        if key == "total_s":
            self.ray["helpers"] = self.ray.get("helpers", 0) + 1

"""A pool's worker: one Ray actor running the ordinary worker (:mod:`fusion_shim.worker.server`) in a
thread, bound to its node's address on a port of the system's choosing, with CURVE. The worker side:
it imports nothing of the client side.

Its key pair is made at each start (a restarted actor has a new one and an empty allow-list): the
clients learn it, and give theirs, through :meth:`PoolWorker.join`, over Ray's authenticated
channel. A worker serves only the keys it was given (``auth.AllowList``).

Started with ``allow_code`` (``pool up --allow-code``) it runs stages for the clients it serves, in
the plain worker's stage processes (:mod:`fusion_shim.worker.stages`), whose sandbox also keeps out
Ray's token files (D344). It records itself on its host and watches its raylet: once that is gone it
stops serving and exits (:mod:`.host`, D265, D266).

Its resident store's budget, unless ``pool up --memory-budget`` sets it, is the single worker's
default split evenly among the pool's workers on its host (``sharing``, counted by :mod:`.manage`),
so that together they take no more of the host's RAM than one worker alone would (D313).
"""
from __future__ import annotations

import os
import threading
from typing import Any


class PoolWorker:
    """The body of a pool actor (``ray.remote`` is applied by :mod:`.manage`)."""

    def __init__(self, name: str, device: str = "auto", memory_budget: int | None = None,
                 allow_code: bool = False, pool: str | None = None, sharing: int = 1):
        import ray
        import zmq

        from ..auth import AllowList
        from ..worker import isolation
        from ..worker.server import Worker, serve
        from . import host
        from .cluster import token_files

        self.name = name
        context = ray.get_runtime_context()
        self.ip = ray.util.get_node_ip_address()
        self.node = f"{context.get_node_id()[:8]}@{self.ip}"  # D268: nodes on one address told apart
        self.allow_code = allow_code
        self.sharing = sharing
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self._public, secret = zmq.curve_keypair()
        self._allowed = AllowList()
        self._stop = threading.Event()
        self._endpoint: str | None = None
        bound = threading.Event()
        device = resolve(device)
        if memory_budget is None:
            memory_budget = host_share(device, sharing)
        if allow_code:  # D344: Ray's token, like a --keys directory, out of every stage's reach
            for path in token_files(os.environ):
                isolation.protect(path)
        # D269: the plain worker's stages, for every principal: each one is a key given through join
        self._worker = Worker(device, memory_budget, allow_code="any" if allow_code else None)

        def on_bound(endpoint: str) -> None:
            self._endpoint = endpoint

        self._thread = threading.Thread(
            target=serve, args=(f"tcp://{self.ip}:*", self._worker),
            kwargs={"keys": (self._public, secret, self._allowed), "stop": self._stop, "ready": bound,
                    "on_bound": on_bound}, name="fusion-shim-worker", daemon=True)
        self._thread.start()
        while not bound.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"pool worker {name}: the worker exited before binding")
        self._record = host.record(context.gcs_address, pool or name.rpartition(".")[0], name, self.node)
        host.watch(self.close, self._forget)

    def _forget(self) -> None:
        try:
            os.unlink(self._record)
        except OSError:
            pass

    def join(self, client_public: bytes) -> dict[str, Any]:
        """Allow ``client_public`` (a 40-character z85 key); returns where and how to reach this worker."""
        self._allowed.allow(client_public)
        return self.describe()

    def describe(self) -> dict[str, Any]:
        info = self._worker.info
        device = str(info.get("device") or "starting")
        emulated = bool(self.gpu_ids) and not device.startswith("cuda")
        return {"name": self.name, "url": self._endpoint, "server_key": self._public, "node": self.node,
                "ip": self.ip, "allow_code": self.allow_code, "pid": os.getpid(), "device": device,
                "ray_gpus": self.gpu_ids,
                # a GPU Ray accounted for, while torch sees no CUDA device: a logical GPU (tests, CI)
                "gpu_emulated": emulated, "state": "ready" if info else "starting",
                "memory_budget": self._worker.store.budget, "sharing": self.sharing,
                "clients": len(self._allowed)}

    def stats(self) -> dict[str, Any]:
        """What the pool's status shows: this worker, its calls and bytes (all clients), its resident data."""
        traffic = list(self._worker.traffic.values())
        store = self._worker.store
        return {**self.describe(), "calls": sum(t["calls"] for t in traffic),
                "bytes_in": sum(t["bytes_in"] for t in traffic), "bytes_out": sum(t["bytes_out"] for t in traffic),
                "resident_bytes": store.nbytes, "resident_entries": len(store)}

    def close(self) -> bool:
        """Stop serving and close the socket (``pool down`` does this before it kills the actor)."""
        self._stop.set()
        self._thread.join(10)
        return not self._thread.is_alive()


def resolve(device: str) -> str:
    """``auto`` as the worker's backend resolves it: ``cuda`` where torch sees a GPU, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def host_share(device: str, sharing: int) -> int:
    """D313: the resident budget of one of ``sharing`` pool workers on this host: on the CPU the single
    worker's default (a quarter of RAM, at most 8 GiB) split evenly; on a GPU its own GPU's default."""
    import torch

    from ..worker.store import default_budget

    full = default_budget(torch.device(device))
    return full if device.startswith("cuda") else full // max(sharing, 1)

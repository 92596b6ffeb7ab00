"""``pool up``, ``pool status``, ``pool down``: a pool's actors made, read and removed through Ray.

``up`` is idempotent by name (D153): the actors are named and made with ``get_if_exists``, the
placement group is named too, so a second ``up`` finds the first pool and makes nothing.
"""
from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from typing import Any, Callable

from . import NAMESPACE, actor_name
from .actor import PoolWorker
from .host import reap

MAX_RESTARTS = -1    # Ray restarts a pool worker whenever it dies, until `pool down`
MAX_TASK_RETRIES = 3  # join, describe and stats are idempotent: retried across a restart
WAIT_S = 120.0        # D267: pool up waits this long for room on the cluster unless --wait says otherwise
SAY_WAITING_AFTER_S = 2.0  # a placement group not placed by then is waited for aloud
MAX_RAY_MESSAGES = 20  # Ray's messages recorded per process; Ray's session logs keep them all


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def connect(address: str, log: Callable[[str], None]) -> Any:
    """Join the cluster at ``address`` (``auto``: this host's) as a driver in the pool's namespace;
    what Ray would print in this process goes to ``log`` instead (D213).
    D152: with a token at hand and no mode chosen, the token is presented, as a new local cluster
    does (a driver joining an existing one does not look for it; the cluster then refuses it)."""
    import ray

    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available as use_token)
    except ImportError:  # a Ray without token authentication
        use_token = None
    if use_token is not None and not ray.is_initialized():
        setup = logging.getLogger(use_token.__module__)
        level, setup.level = setup.level, logging.ERROR  # its warning is about a cluster it starts, not ours
        try:
            use_token(warn_if_disabled=False)
        finally:
            setup.setLevel(level)
    if not ray.is_initialized():
        route_output(log)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
    return ray


def route_output(log: Callable[[str], None]) -> None:
    """D213: Ray's messages to its driver (a node's death and its state dump, from Ray's error listener,
    which ``log_to_driver=False`` leaves running) and its Python logger's records go to ``log``, one
    line each, never to this process's stdout or stderr."""
    import ray._private.worker as ray_worker

    seen = [0]

    def line(text: str) -> None:
        seen[0] += 1
        if seen[0] <= MAX_RAY_MESSAGES:
            log(text)
        elif seen[0] == MAX_RAY_MESSAGES + 1:
            log(f"Ray: more than {MAX_RAY_MESSAGES} messages; the rest are in Ray's session logs only")

    def to_log(data: dict, ignore_prefix: bool = False) -> None:
        text = [ln.strip() for chunk in data.get("lines") or () for ln in str(chunk).splitlines() if ln.strip()]
        if text:
            more = f" (+{len(text) - 1} lines)" if len(text) > 1 else ""
            line(f"Ray ({data.get('pid', '?')}): {text[0][:200]}{more}")

    class ToLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line(f"Ray ({record.levelname.lower()}): {record.getMessage().splitlines()[0][:200]}")

    ray_worker.print_to_stdstream = to_log  # looked up at each message by Ray's listener threads
    logger = logging.getLogger("ray")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(ToLog())
    logger.propagate = False


def names(ray: Any, pool: str) -> list[str]:
    """The pool's actor names, in index order."""
    prefix = pool + "."
    found = [n["name"] if isinstance(n, dict) else n for n in ray.util.list_named_actors()]
    return sorted((n for n in found if n.startswith(prefix) and n[len(prefix):].isdigit()),
                  key=lambda n: int(n[len(prefix):]))


def wants_gpu(ray: Any, device: str) -> bool:
    """A GPU per worker for ``cuda``; for ``auto`` when the cluster has GPUs (logical ones included)."""
    if device.startswith("cuda"):
        return True
    return device == "auto" and ray.cluster_resources().get("GPU", 0) >= 1


class NoRoom(RuntimeError):
    """The cluster did not find room for the pool's workers within ``--wait`` (D267)."""


def shortfall(ray: Any, workers: int, bundle: dict[str, float]) -> str:
    """What the pool waits for, in one line: ``3 GPUs, cluster has 2 (0 free)``."""
    total, free = ray.cluster_resources(), ray.available_resources()
    unit = "GPU" if "GPU" in bundle else "CPU"
    return (f"{workers} {unit}s (one per worker), cluster has {total.get(unit, 0):g} "
            f"({free.get(unit, 0):g} free)")


def up(address: str, workers: int, device: str = "auto", memory_budget: int | None = None,
       name: str = "default", timeout: float = 300.0, log: Callable[[str], None] | None = None,
       wait: float = WAIT_S, allow_code: bool = False, say: Callable[[str], None] | None = None
       ) -> tuple[list[dict[str, Any]], bool]:
    """Bring the pool up (or find it up); returns (each worker's description, whether it was made now).
    ``wait``: seconds the cluster has to find room (``say`` is told what it waits for); D267: the
    placement group goes again on any failure, a timeout and an interrupt included."""
    ray = connect(address, log or _stderr)
    from ray.util import remove_placement_group
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    existing = names(ray, name)
    if existing:
        return [ray.get(ray.get_actor(n).describe.remote(), timeout=timeout) for n in existing], False
    gpu = wants_gpu(ray, device)
    bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
    pg = placement_group([bundle] * workers, strategy="SPREAD", name=name, lifetime="detached")
    handles: list[Any] = []
    try:
        _wait_for_room(ray, pg, workers, bundle, wait, say or _stderr)
        shared = sharing(hosts(ray, pg, workers))
        cls = ray.remote(PoolWorker)
        actor_log = logging.getLogger("ray.actor")
        actor_log.addFilter(_not_restarted_warning)
        try:
            for i in range(workers):
                handles.append(cls.options(
                    name=actor_name(name, i), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                    max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES, num_cpus=1,
                    num_gpus=1 if gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                ).remote(actor_name(name, i), device, memory_budget, allow_code, name, shared[i]))
        finally:
            actor_log.removeFilter(_not_restarted_warning)
        return [ray.get(h.describe.remote(), timeout=timeout) for h in handles], True
    except BaseException:
        for h in handles:  # detached: nothing else would ever end them
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass
        remove_placement_group(pg)
        raise


def _not_restarted_warning(record: logging.LogRecord) -> bool:
    """D327: Ray's warning, once a worker, that removing the placement group ends it for good: only
    `pool down` removes it, to that end; a worker that dies is restarted (MAX_RESTARTS)."""
    return "restartable detached actor with a placement group" not in record.getMessage()


def hosts(ray: Any, pg: Any, workers: int) -> list[str]:
    """The address of the host each of the placed group's bundles is on (D314: nodes sharing an
    address share its RAM); a node Ray no longer lists stands for a host of its own."""
    from ray.util import placement_group_table

    placed = placement_group_table(pg)["bundles_to_node_id"]
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [address.get(placed.get(i), f"node {placed.get(i)}") for i in range(workers)]


def sharing(where: list[str]) -> list[int]:
    """For each worker, how many of the pool's workers are on its host (itself included)."""
    count = Counter(where)
    return [count[h] for h in where]


def _wait_for_room(ray: Any, pg: Any, workers: int, bundle: dict[str, float], wait: float,
                   say: Callable[[str], None]) -> None:
    """Until the placement group is placed, saying once (after a moment) what it waits for; raises
    :class:`NoRoom` naming the shortfall after ``wait`` seconds."""
    ready = pg.ready()
    deadline = time.monotonic() + wait
    first = min(SAY_WAITING_AFTER_S, wait)
    done, _ = ray.wait([ready], timeout=first)
    if done:
        return
    say(f"waiting for {shortfall(ray, workers, bundle)}; up to {wait:g} s (--wait)")
    done, _ = ray.wait([ready], timeout=max(deadline - time.monotonic(), 0.0))
    if not done:
        raise NoRoom(f"no room within {wait:g} s: needs {shortfall(ray, workers, bundle)}")


def status(address: str, name: str = "default", timeout: float = 30.0,
           log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Each worker's stats; a worker Ray cannot reach now is listed with its state."""
    ray = connect(address, log or _stderr)
    rows = []
    for n in names(ray, name):
        try:
            rows.append(ray.get(ray.get_actor(n).stats.remote(), timeout=timeout))
        except Exception as exc:  # restarting, or its node lost: shown, not raised
            rows.append({"name": n, "state": f"unreachable ({type(exc).__name__})"})
    return rows


def down(address: str, name: str = "default", timeout: float = 30.0, log: Callable[[str], None] | None = None,
         env: dict | None = None) -> list[str]:
    """Close and kill the pool's actors (no restart), remove its placement group, then stop what the
    pool left running on this host (D266: orphans of a lost raylet); returns what stopped, one line each."""
    ray = connect(address, log or _stderr)
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import get_placement_group

    stopped, pids = [], set()
    for n in names(ray, name):
        handle = ray.get_actor(n)
        try:
            d = ray.get(handle.describe.remote(), timeout=timeout)
            pids.add(d["pid"])
            stopped.append(f"{n} on {d['node']} (pid {d['pid']})")
            ray.get(handle.close.remote(), timeout=timeout)  # its socket closed before its process goes
        except Exception:
            stopped.append(f"{n} (not answering)")  # dead or restarting: the kill below ends it all the same
        ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout
    while names(ray, name) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        pg = get_placement_group(name)
        if placement_group_table(pg).get("state") != "REMOVED":
            remove_placement_group(pg)
    except ValueError:
        pass
    for e in reap(ray.get_runtime_context().gcs_address, name, env):
        if e["pid"] not in pids:
            stopped.append(f"{e['name']} on {e.get('where', '?')} (pid {e['pid']}, orphaned)")
    return stopped


TABLE = ("worker", "node", "pid", "device", "state", "calls", "resident", "budget")


def table(rows: list[dict[str, Any]]) -> str:
    """``pool status`` (and ``pool up``) as text: one line per worker; its node and pid as ``pool down``
    names it."""
    cells = [TABLE] + [(r["name"], str(r.get("node", "-")), str(r.get("pid", "-")), _device(r),
                        str(r.get("state", "-")), str(r.get("calls", "-")), size_text(r.get("resident_bytes")),
                        _budget(r)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(TABLE))).rstrip() for c in cells)


def size_text(n: Any) -> str:
    """``n`` bytes as ``--memory-budget`` reads them (512K, 64M, 2.0G); ``-`` where unknown."""
    from ..worker import command

    return command.size_text(int(n)) if isinstance(n, int) else "-"


def _device(row: dict[str, Any]) -> str:
    device = str(row.get("device", "-"))
    if row.get("gpu_emulated"):
        return f"{device} (Ray GPU {','.join(row['ray_gpus'])}: EMULATED, no CUDA device)"
    return device


def _budget(row: dict[str, Any]) -> str:
    budget = size_text(row.get("memory_budget"))
    shared = row.get("sharing")
    return f"{budget} ({shared} on its host)" if isinstance(shared, int) and shared > 1 else budget



"""A pool's processes on one host: the watchdog each pool worker runs, and the records ``pool down``
reaps. Imports no Ray: both the worker side (:mod:`.actor`) and ``pool down`` (:mod:`.manage`) use it.

- D265: a pool worker's process is a child of its node's raylet. When the raylet dies the process is
  reparented; Ray's core worker may end it, but one was seen serving its socket while Ray started a
  second copy elsewhere: the watchdog sees its parent change and ends the process all the same.
- D266: each pool worker records itself at start (pid, start time, pid namespace, user, cluster,
  pool) in a directory only this user can open; ``pool down`` stops every recorded process of its
  cluster's pool on this host that is still the one recorded (same pid, start time and user).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Callable

from ..procinfo import pidns, proc_start

WATCH_S = 1.0           # D265: how often a worker looks at its parent
EXIT_ORPHANED = 75      # the exit status of a worker whose raylet is gone
TERM_GRACE_S = 10.0     # D266: SIGTERM, then SIGKILL after this long


def state_dir(env: dict | None = None) -> str:
    """``$XDG_STATE_HOME/fusion_shim/pool`` (``~/.local/state/...`` by default)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "fusion_shim", "pool")


def _private(directory: str) -> str:
    """``directory``, made 0700 if missing; refused unless this user owns it and no one else may open it."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{directory} must belong to this user with mode 0700 (it holds pids to kill)")
    return directory


def record(cluster: str, pool: str, name: str, where: str, env: dict | None = None, pid: int | None = None) -> str:
    """Record this process (or ``pid``) as worker ``name`` of ``pool`` on ``cluster``; returns the record's path."""
    pid = os.getpid() if pid is None else pid
    path = os.path.join(_private(state_dir(env)), f"{pid}.json")
    entry = {"cluster": cluster, "pool": pool, "name": name, "where": where, "pid": pid,
             "start": proc_start(pid), "ns": pidns(), "uid": os.geteuid()}
    tmp = f"{path}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)  # a pid reused by this worker replaces a dead one's record
    return path


def records(cluster: str, pool: str, env: dict | None = None) -> list[tuple[str, dict]]:
    """(path, entry) of each record of ``pool`` on ``cluster`` kept on this host."""
    directory = state_dir(env)
    try:
        found = sorted(n for n in os.listdir(_private(directory)) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    out = []
    for n in found:
        path = os.path.join(directory, n)
        try:
            with open(path) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("cluster") == cluster and entry.get("pool") == pool:
            out.append((path, entry))
    return out


def is_ours(entry: dict) -> bool:
    """The recorded process still runs as recorded: same pid namespace, pid, start time and user."""
    pid, start = entry.get("pid"), entry.get("start")
    if not isinstance(pid, int) or start is None or entry.get("ns") != pidns() or entry.get("uid") != os.geteuid():
        return False
    if proc_start(pid) != start:
        return False
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def reap(cluster: str, pool: str, env: dict | None = None, grace_s: float = TERM_GRACE_S) -> list[dict]:
    """Stop every recorded process of ``pool`` still running here (SIGTERM, then SIGKILL) and remove
    the records; returns the entries of those that were running."""
    stopped = []
    for path, entry in records(cluster, pool, env):
        if is_ours(entry):
            _stop(entry, grace_s)
            stopped.append(entry)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return stopped


def _stop(entry: dict, grace_s: float) -> None:
    pid = entry["pid"]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        if not is_ours(entry):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and is_ours(entry):
            time.sleep(0.05)


def watch(stop_serving: Callable[[], None], forget: Callable[[], None], every_s: float = WATCH_S) -> threading.Thread:
    """D265: a thread that ends this process once its parent (the raylet) is gone: the worker stops
    serving first (its socket closed, its stage processes ended), its record goes, then the process."""
    parent = os.getppid()

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        try:
            stop_serving()
            forget()
        finally:
            os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=run, name="fusion-shim-pool-watchdog", daemon=True)
    thread.start()
    return thread

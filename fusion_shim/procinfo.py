"""Process identity from ``/proc``, for names that must outlive their process: its pid namespace,
its start time, and whether the owner of a name is certainly gone. Imports only ``os``, so that a
program's run directory can be named at NumPy's import without the transport (and ZeroMQ)."""
from __future__ import annotations

import os


def pidns() -> int:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``); 0 where unknown."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return 0
    return int("".join(c for c in link if c.isdigit()) or 0)  # D123: no pattern compiled at NumPy's import


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def owner_dead(ns: int, pid: int, start: int) -> bool:
    """True only when certain: same pid namespace as this process, and no process with that pid
    and start time. A name from another namespace is never judged dead."""
    if ns != pidns():
        return False
    now = proc_start(pid)
    return now is None or now != start


_ANY_HOST = ("127.0.0.1", "localhost", "0.0.0.0", "*", "[::1]", "[::]")


def worker_binding(url: str) -> bool:
    """Whether a process on this host was started to serve ``url`` (a ``worker --bind URL`` command
    line; for tcp the same port on a loopback or wildcard host): a worker still starting there."""
    want = _bind_key(url)
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "--bind" in args[:-1] and any("worker" in a for a in args) and any("fusion" in a for a in args):
            if _bind_key(args[args.index("--bind") + 1]) == want:
                return True
    return False


def _bind_key(url: str) -> str:
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://"):].rpartition(":")
        return f"tcp:{port}" if host in _ANY_HOST else url
    return url

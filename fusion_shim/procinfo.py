"""Process identity from ``/proc``, for names that must outlive their process: its pid namespace,
its start time, and whether the owner of a name is certainly gone. Imports only ``os`` and ``re``,
so that a program's run directory can be made at NumPy's import without the transport (and ZeroMQ)."""
from __future__ import annotations

import os
import re


def pidns() -> int:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``); 0 where unknown."""
    try:
        return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or 0)
    except OSError:
        return 0


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

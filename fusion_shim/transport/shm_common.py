"""What both halves of the same-host lane (:mod:`.shm`) share: segment names and their owners, the
liveness checks the sweeps rely on, mapping a segment (the client's own) and opening, reading and
writing one through its fd (the worker, a client's, where the C extension's copy is not built: D180)."""
from __future__ import annotations

import errno
import mmap
import os
import re
import stat
from typing import Any

import numpy as np

from ..procinfo import owner_dead, pidns, proc_start  # noqa: F401  (the lane's modules import them from here)

SHM_DIR = "/dev/shm"
PREFIX = "fshm-"
NAME_RE = re.compile(r"^fshm-(\d+)-(\d+)-(\d+)-([iop])(\d+)$")
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault a whole mapping in at once, not page by page


class ShmError(Exception):
    """A segment could not be created, found or mapped; the caller uses the socket lane."""


# --- identity ---------------------------------------------------------------------------------------

def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def owner_tag(pid: int | None = None) -> str:
    """``<pid namespace>-<pid>-<start>`` of this process (or ``pid``): the owner part of its names."""
    pid = os.getpid() if pid is None else pid
    return f"{pidns()}-{pid}-{proc_start(pid) or 0}"


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) and bool(boot_id())


def parse(name: Any) -> tuple[int, int, int, str] | None:
    """(pid namespace, pid, start, role) of a well-formed name; None otherwise."""
    m = NAME_RE.match(name) if isinstance(name, str) else None
    return (int(m[1]), int(m[2]), int(m[3]), m[4]) if m else None


def sweep_stale(only_owner: str | None = None) -> list[str]:
    """Unlink the segments whose owner is dead (or, with ``only_owner``, that owner's, which the
    caller knows is dead). Returns the names removed."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        parsed = parse(name)
        if parsed is None:
            continue
        ns, pid, start, _ = parsed
        if only_owner is not None:
            if f"{ns}-{pid}-{start}" != only_owner:
                continue
        elif not owner_dead(ns, pid, start):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def map_segment(name: str, size: int | None, writable: bool, create: bool) -> tuple[mmap.mmap, int]:
    """Map segment ``name`` (creating it with ``size`` bytes when ``create``), its pages faulted in.
    A client maps only its own segments; the worker opens a client's with :func:`open_segment`."""
    path = os.path.join(SHM_DIR, name)
    flags = os.O_RDWR if writable or create else os.O_RDONLY
    if create:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise ShmError(f"cannot open segment {name}: {exc.strerror}") from None
    try:
        if create:
            os.ftruncate(fd, size)
        else:
            size = os.fstat(fd).st_size
        if size <= 0:
            raise ShmError(f"segment {name} is empty")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable or create else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED | POPULATE, prot)
    except (OSError, ValueError) as exc:
        if create:
            os.unlink(path)
        raise ShmError(f"cannot map segment {name}: {exc}") from None
    finally:
        os.close(fd)  # the mapping keeps the memory; the name is the only other handle
    return mm, size


def open_segment(name: str, writable: bool, uid: int | None, limit: int | None) -> tuple[int, int]:
    """Open a client's segment ``name``: (its fd, its size). It must be a regular file of ``uid``
    and no larger than ``limit`` (D66). Read and written with the C extension's copy through a
    mapping (D180), else with :func:`read_into` and :func:`write_from`."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK  # a FIFO by that name must not block
    try:
        fd = os.open(os.path.join(SHM_DIR, name), flags | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ShmError(f"cannot open segment {name}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ShmError(f"segment {name} is not a regular file")
        if uid is not None and st.st_uid != uid:
            raise ShmError(f"segment {name} belongs to uid {st.st_uid}, not to the peer's {uid}")
        if limit is not None and st.st_size > limit:
            raise ShmError(f"segment {name} is {st.st_size} bytes, more than this worker's message budget ({limit})")
        if st.st_size <= 0:
            raise ShmError(f"segment {name} is empty")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_into(fd: int, buf: Any, offset: int) -> int:
    """Read ``len(buf)`` bytes of ``fd`` at ``offset`` into ``buf``; the count read, fewer where the
    file ends first. D67: a read past the end of a truncated file returns 0; a mapping would SIGBUS."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def write_from(fd: int, buf: Any, offset: int) -> None:
    """Write all of ``buf`` into ``fd`` at ``offset`` (raises OSError, ENOSPC included, when it cannot)."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.pwritev(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(errno.ENOSPC, "no byte written")
        done += n


def strides_of(dtype: np.dtype, shape: tuple, order: str) -> tuple:
    strides, step = [0] * len(shape), dtype.itemsize
    axes = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    for ax in axes:
        strides[ax] = step
        step *= max(shape[ax], 1)
    return tuple(strides)


def check_loc(loc: Any) -> tuple[str, int, tuple]:
    from ..protocol.wire import WireError  # the wire's own error: a bad locator is a malformed message

    if not isinstance(loc, dict):
        raise WireError("'shm' must be a map")
    name, offset = loc.get("name"), loc.get("offset")
    parsed = parse(name)
    if parsed is None:
        raise WireError(f"shm segment name {name!r} is not a fusion_shim segment")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise WireError("shm offset must be an int >= 0")
    return name, offset, parsed

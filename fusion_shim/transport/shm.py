"""The same-host lane: array buffers through shared memory, headers through the socket.

Through a ZeroMQ socket a 64 MiB buffer crosses at 1.3-4 GB/s (shared/LIMITS.md); through a shared
segment it costs one copy on each side. The wire names a buffer instead of carrying it (the
``shm`` array-meta key, see :mod:`fusion_shim.protocol.wire`), and everything else stays as it was: requests
and replies, ids, deadlines, validation, the socket lane as the fallback.

Ownership: **the client owns every segment**, inputs and results alike. It knows when a result
dies (the program drops the array) and when a call was abandoned; the worker knows neither. So:

- *inputs*: the client copies each buffer into an ``i`` segment from its pool (a buffer passed
  twice once; past a call's ``INPUT_MAX_BYTES`` they go as zero-copy frames instead, D202); the worker copies
  it into a buffer of its own, out of its mapping with a copy that a SIGBUS stops (D180), or
  through its fd without the C extension (D67): a client that truncates one cannot fault the
  worker; the client takes the segment back when the reply arrives;
- *results*: the call offers one ``o`` segment per result (``out_shm``), sized from what NumPy
  would return; the worker copies the result into it the same way; the client hands the
  program a NumPy array *on that segment* (no copy on receive). The array's base is a :class:`_Lease`:
  when the last view of the result dies the segment returns to the pool;
- a call that times out or fails on the link *retires* its segments (never reused: a late worker
  may still read or write them) and tells the worker to unmap them (``shm_drop``).

Lifetimes and crashes. Segments are files in ``/dev/shm`` named
``fshm-<pid namespace>-<pid>-<process start time>-<role><seq>``. Once the worker has mapped a
segment (it says so in ``shm_mapped``), the client unlinks the name: from then on the memory lives
exactly as long as the client's mapping and the worker's fd, and a SIGKILL of either side leaks nothing. Names that a crash
catches in between are swept: the worker unlinks those of a client whose process is gone (it
checks while idle, and at exit), and every client sweeps, when it starts, the names of owners that
are dead. Owners are matched by pid *and* start time (a reused pid is not the same owner), and only
within the sweeper's own pid namespace (a name from another namespace is never judged).

Fork: result arrays sit in MAP_SHARED memory, where ordinary NumPy memory is copy-on-write; a
forked child therefore gets private copies of them at the same addresses (``_privatize_after_fork``)
and uses the socket lane from then on (its parent's segments are not its own).

Negotiation (in ``hello``/``ready``): only over ``ipc://`` or ``inproc://``, with the same boot id
on both sides, and a probe segment the worker must read back (same host is not enough: two
containers may share a socket file but not ``/dev/shm``). Anything else: the socket lane.

Composition with residency and declared results: an input the worker holds
still travels as a reference (never placed); a result slot is offered per *declared* result, sized
from it, and the worker writes a result there only when its byte size matches the slot exactly.

The client's part is :class:`ClientLane` (negotiation, the pool, cleanup, one per worker link) and
:meth:`ShmPool.stage` (one request's segments, which :meth:`~fusion_shim.transport.Channel.request`
uses when given the pool), in :mod:`.shm_client`; the worker's is :class:`ShmMapper`, in
:mod:`.shm_worker`; names, owners and mappings both use are in :mod:`.shm_common`. This module gathers them for the client. None imports
torch or the planner; the worker adds its pinned-memory staging.
"""
from __future__ import annotations

from .shm_client import (GRANULE, MAX_IDLE_BYTES, MIN_BYTES, ClientLane, Segment, ShmPool, Staged, _Lease,
                         _privatize_after_fork, make_probe)
from .shm_common import (NAME_RE, PREFIX, SHM_DIR, ShmError, available, boot_id, owner_dead, owner_tag, parse,
                         proc_start, sweep_stale)
from .shm_worker import ShmMapper

__all__ = ["GRANULE", "MAX_IDLE_BYTES", "MIN_BYTES", "NAME_RE", "PREFIX", "SHM_DIR", "ClientLane", "Segment",
           "ShmError", "ShmMapper", "ShmPool", "Staged", "available", "boot_id", "make_probe",
           "owner_dead", "owner_tag", "parse", "proc_start", "sweep_stale"]

"""Measure a worker's link: round trip from a few pings at connect, bandwidth each way from
one bulk transfer each way.

The pings run on a link's handshake thread after the worker said ``ready``. The bulk transfers move
a few MiB through the program's process (D23), so the runtime asks for them only at the first call
that a worker would get or explore were the link free (plan.Planner.link_could_matter), on a thread
of their own; a call predicted long enough to cover them has them made while it waits. The transfers are ordinary ``call`` messages that any worker
answers (a matmul of thin operands: 8 bytes of work per byte moved): up, (1, N) @ (N, 1), N values
each way up and one back; down, (M, 1) @ (1, M), 2M values up and M*M back. Link time is the round
trip minus the worker's own reported time, as for every call the planner learns from; the best of
the transfers each way is kept.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .. import transport
from ..protocol import messages, wire

SMALL = 256 << 10          # bytes each way in the first transfer
LARGE = 1 << 20            # D33: ... and in the second, when the first took under FAST_S
FAST_S = 0.03
LARGE_TRIES = 2            # D33: the second transfer, repeated: the best of them is kept
PINGS = 5


def _call(chan: transport.Channel, rid: int, a: np.ndarray, b: np.ndarray, deadline_s: float) -> tuple[float, float]:
    """(seconds from send to reply, the worker's own seconds) for one matmul."""
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", (a.shape[0], b.shape[1]))])
    req = messages.Request(header, [wire.to_wire(a), wire.to_wire(b)])
    t = time.perf_counter()
    header = chan.request(req, time.monotonic() + deadline_s).header
    seconds = time.perf_counter() - t
    if header.get("t") != "result":
        raise transport.BadReply(f"link probe answered with {header.get('t')!r}: {header.get('msg')}")
    return seconds, messages.read_timing(header).phases.get("kernel", 0.0)


def _byte_time(seconds: float, rtt: float) -> float:
    """D33: a transfer's time less the round trip, but never under half its whole time: on loopback a
    MiB moves in less than the round trip's own jitter."""
    return max(seconds - rtt, seconds / 2, 1e-6)


def measure(chan: transport.Channel, next_id: Callable[[], int],
            deadline_s: float = 30.0) -> tuple[float, float | None, float | None, str | None]:
    """(round trip s, bytes/s up, bytes/s down, why the bandwidth is unknown): both at once."""
    rtt = ping(chan, next_id, deadline_s)
    return (rtt, *bandwidth(chan, next_id, rtt, deadline_s)[:3])


def ping(chan: transport.Channel, next_id: Callable[[], int], deadline_s: float = 30.0) -> float:
    """The best of a few hello round trips; raises TransportError like any request."""
    rtt = float("inf")
    for _ in range(PINGS):
        rid = next_id()
        t = time.perf_counter()
        chan.request(messages.hello(rid), time.monotonic() + deadline_s)
        rtt = min(rtt, time.perf_counter() - t)
    return rtt


def bandwidth(chan: transport.Channel, next_id: Callable[[], int], rtt: float,
              deadline_s: float = 30.0) -> tuple[float | None, float | None, str | None, int]:
    """(bytes/s up, bytes/s down, why unknown, bytes moved both ways). A transfer that fails (a
    worker too slow to answer within ``deadline_s``) leaves them None and says why: the worker is
    still usable."""
    up = down = None
    moved = 0
    try:
        for nbytes in (SMALL, *(LARGE,) * LARGE_TRIES):
            n = nbytes // 8
            a, b = np.ones((1, n)), np.ones((n, 1))
            s, w = _call(chan, next_id(), a, b, deadline_s)
            m = int(n ** 0.5)
            c, d = np.ones((m, 1)), np.ones((1, m))
            s2, w2 = _call(chan, next_id(), c, d, deadline_s)
            # the best of the transfers: a busy CPU or a stray packet only ever slows one down
            up = max(up or 0.0, a.nbytes * 2 / _byte_time(s - w, rtt))
            down = max(down or 0.0, m * m * 8 / _byte_time(s2 - w2, rtt))
            moved += a.nbytes * 2 + (c.nbytes + d.nbytes) + m * m * 8
            if s > FAST_S or s2 > FAST_S:
                break
    except transport.TransportError as exc:
        if up is None:
            return None, None, f"{type(exc).__name__}: {exc}", moved
    return up, down, None, moved

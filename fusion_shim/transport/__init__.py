"""Transports, chosen by URL scheme: ``inproc://`` (worker in a thread of this process, for tests),
``ipc://`` (a unix socket, the embedded worker) and ``tcp://`` (a worker on another host). All three
are ZeroMQ: the client holds a DEALER socket per thread, the worker one ROUTER.

The one operation a caller needs is :meth:`Channel.request`: send a message and wait, up to a
deadline, for the reply that carries the same request id. Failures are grouped by what the caller
can do about them: every :class:`TransportError` means "compute locally and record why".
"""
from __future__ import annotations

import ipaddress
import os
import threading
import time
from typing import Any, Callable, Sequence

import zmq

from .. import wire

SCHEMES = ("inproc", "ipc", "tcp")
POLL_SLICE_S = 0.05  # how often a waiting client checks that an embedded worker is still alive


class TransportError(Exception):
    """The worker could not answer; the call is computed locally."""


class Timeout(TransportError):
    pass


class WorkerDied(TransportError):
    pass


class BadReply(TransportError):
    pass


def check_url(url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown transport in {url!r}; valid schemes: {', '.join(s + '://' for s in SCHEMES)}")
    return scheme


def is_loopback(url: str) -> bool:
    """True for inproc/ipc and for tcp on a loopback address; binding elsewhere needs authentication."""
    scheme = check_url(url)
    if scheme != "tcp":
        return True
    host = url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # an interface name or "*": a network address


_ctx_lock = threading.Lock()
_ctx: tuple[int, zmq.Context] | None = None


def context() -> zmq.Context:
    """This process's ZeroMQ context; a forked child gets a fresh one (a context never crosses a fork)."""
    global _ctx
    pid = os.getpid()
    with _ctx_lock:
        if _ctx is None or _ctx[0] != pid:
            _ctx = (pid, zmq.Context())
        return _ctx[1]


def frame_bytes(frame: Any) -> int:
    return frame.nbytes if hasattr(frame, "nbytes") else len(frame)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], prefix: Sequence[bytes] = ()) -> int:
    """Send a multipart message; returns the bytes of ``frames`` (the prefix is routing, not payload)."""
    parts = [*prefix, *frames]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        sock.send(part, zmq.SNDMORE if i < last else 0, copy=frame_bytes(part) < wire.ZERO_COPY_MIN)
    return sum(frame_bytes(f) for f in frames)


class Channel:
    """A client's connection to one worker, used by one thread at a time."""

    def __init__(self, url: str):
        check_url(url)
        self.url = url
        self.pid = os.getpid()
        self.sock = context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        # what the last request() put on and took off this socket, counted at the socket (issue 7)
        self.last_send_s = 0.0
        self.last_bytes_sent = 0
        self.last_bytes_received = 0

    def request(
        self,
        rid: int,
        frames: Sequence[Any],
        deadline: float,
        alive: Callable[[], bool] | None = None,
    ) -> tuple[dict, list]:
        """Send ``frames`` and return the decoded reply with id ``rid``; raise TransportError."""
        t = time.perf_counter()
        try:
            self.last_bytes_sent = send_frames(self.sock, frames)
        except zmq.ZMQError as exc:
            raise TransportError(f"send failed: {exc}") from None
        self.last_send_s = time.perf_counter() - t
        self.last_bytes_received = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply within the deadline from {self.url}")
            if not self.sock.poll(int(min(left, POLL_SLICE_S) * 1000) + 1):
                if alive is not None and not alive():
                    raise WorkerDied(f"worker at {self.url} exited")
                continue
            reply = self.sock.recv_multipart(copy=False)
            self.last_bytes_received += sum(frame_bytes(f) for f in reply)
            try:
                header, arrays = wire.decode(reply)
            except wire.WireError as exc:
                raise BadReply(str(exc)) from None
            if header["id"] != rid:
                continue  # a late reply to a request abandoned earlier: drop it
            return header, arrays

    def close(self) -> None:
        self.sock.close(linger=0)

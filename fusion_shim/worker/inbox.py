"""The worker's socket and the requests waiting on it, bounded per principal (D69).

While a call runs, libzmq keeps reading every connection into its queues, a few messages each
(D65); a principal with many connections could fill the worker's memory with them. So once a
call has run ``DRAIN_AFTER_S``, a second thread takes the socket and reads what arrives into a
queue in which each principal may hold one request of any size (one message is at most the
worker's ``--max-bytes``) and more only while all it has waiting stays within ``QUEUED_BYTES``: a
request past that is answered at once with a ``busy`` error (its client computes it locally) and
freed. One compute stream gains nothing from a longer queue. The loop's thread
takes the socket back when the call ends; a call shorter than ``DRAIN_AFTER_S`` never meets the
second thread, which only looks at a clock.
"""
from __future__ import annotations

import collections
import ctypes
import threading
import time
from typing import Any, Callable

import zmq

from ..protocol import messages, wire
from ..transport import frame_bytes, send_frames
from ..transport.principal import Principal, principal_of

DRAIN_AFTER_S = 0.02  # a call shorter than this runs with the socket left to libzmq's queues
POLL_S = 0.002        # how long a call that outlasts DRAIN_AFTER_S may wait for its socket back
QUEUED_BYTES = 64 << 20  # what a principal may have waiting beyond its first request
DRAIN_MIN = 64 << 10     # D197: a request this large or larger is followed by a drain of the socket


class Inbox:
    """The socket, owned by the loop's thread but while a long call runs."""

    def __init__(self, sock: zmq.Socket, curve: bool, budget: int = QUEUED_BYTES):
        self.sock = sock
        self._arrivals = zmq.Poller()  # one for the socket: Socket.poll makes one per call
        self._arrivals.register(sock, zmq.POLLIN)
        self._timeout_ms = sock.getsockopt(zmq.RCVTIMEO)  # the loop's receive waits this long
        self.budget = budget
        self.curve = curve
        self.waiting: collections.deque = collections.deque()  # (frames, principal, bytes)
        self.held: dict[str, int] = {}  # principal -> bytes waiting
        self._lock = threading.Lock()   # whoever holds it may use the socket
        self._lock.acquire()
        self._call = 0                  # the running call's number, 0 between calls
        self._started = 0.0
        self._stop = False
        self._shed = False
        self._thread = threading.Thread(target=self._drain_loop, name="fusion-shim-inbox", daemon=True)
        self._thread.start()

    def next(self, timeout_ms: int) -> tuple[list, Principal] | None:
        """The next request (its frames with the routing identity first, and its principal), waiting
        ones first; None when none came within ``timeout_ms``."""
        if self.waiting:
            frames, principal, n = self.waiting.popleft()
            self.held[principal.name] -= n
            return frames, principal
        while (frames := self._recv(timeout_ms)) is not None:
            if len(frames) >= 2:  # else no routing identity: nothing to answer to
                return frames, principal_of(frames[1], self.curve)
            timeout_ms = 0
        return None

    def _recv(self, timeout_ms: int) -> list | None:
        """One message's frames, or None when none came within ``timeout_ms``. D74: a blocking
        receive under the socket's timeout, each frame's own flag for the next: no poll first."""
        if timeout_ms != self._timeout_ms:
            self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
            self._timeout_ms = timeout_ms
        try:
            frame = self.sock.recv(copy=False)
        except zmq.Again:
            return None
        frames = [frame]
        while frame.more:  # the rest of a message has come with its first frame
            frame = self.sock.recv(copy=False)
            frames.append(frame)
        return frames

    def running(self, call: Callable[[], Any]) -> Any:
        """``call()``, with the socket left to the draining thread should it run long."""
        self._started = time.monotonic()
        self._call += 1
        self._lock.release()
        try:
            return call()
        finally:
            self._call = 0
            self._lock.acquire()

    def drain(self) -> None:
        """D197: take every request libzmq holds into the queue, shedding past each principal's
        budget: after a large request, so that many connections' queues cannot hold more than it."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._admit(frames)
        if self._shed:
            self._shed = False
            trim_heap()

    def send(self, identity: bytes, frames: list) -> int:
        return send_frames(self.sock, frames, prefix=[identity])

    def close(self) -> None:
        self._stop = True
        self._lock.release()
        self._thread.join(5)

    def _drain_loop(self) -> None:
        while not self._stop:
            time.sleep(DRAIN_AFTER_S)
            call, started = self._call, self._started
            if not call or time.monotonic() - started < DRAIN_AFTER_S or not self._lock.acquire(blocking=False):
                continue
            try:
                while self._call == call and not self._stop:
                    if self._arrivals.poll(int(POLL_S * 1000)):
                        self._admit(self.sock.recv_multipart(copy=False))
                    elif self._shed:
                        self._shed = False
                        trim_heap()
            finally:
                self._lock.release()

    def _admit(self, frames: list) -> None:
        if len(frames) < 2:
            return
        principal = principal_of(frames[1], self.curve)
        n = sum(frame_bytes(f) for f in frames[1:])
        held = self.held.get(principal.name, 0)
        if not held or held + n <= self.budget:
            self.waiting.append((frames, principal, n))
            self.held[principal.name] = held + n
            return
        try:
            rid = wire.decode_header(frames[1])["id"]
        except wire.WireError:
            return  # a malformed request past the bound: dropped, it gets no answer
        reply = messages.error(rid, "busy", "WorkerBusy", f"{held} bytes of this client's requests wait on the "
                               f"worker already (at most {self.budget}): computed by the client")
        self._shed = True
        try:
            self.send(frames[0].bytes, reply.frames())
        except zmq.ZMQError:
            pass  # the client is gone


def trim_heap() -> None:
    """Hand the freed pages of shed requests back to the system (D69: the allocator keeps them
    otherwise, and the worker's resident memory stays as if they still waited)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc

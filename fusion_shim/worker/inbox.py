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

D270: the bound covers all a principal has on the worker, over all its connections: requests
waiting, the one being handled, and replies handed to libzmq that its peer has not read yet
(tracked until libzmq lets go of them). A request that would take it past ``budget`` is answered
``busy`` (a small reply, never dropped) unless the principal has nothing else here.
"""
from __future__ import annotations

import collections
import ctypes
import threading
import time
from typing import Any, Callable

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from ..protocol import messages, wire
from ..transport import frame_bytes, send_frames, send_tracked
from ..transport.principal import Principal, principal_of

DRAIN_AFTER_S = 0.02  # a call shorter than this runs with the socket left to libzmq's queues
POLL_S = 0.002        # how long a call that outlasts DRAIN_AFTER_S may wait for its socket back
QUEUED_BYTES = 64 << 20  # what a principal may have waiting beyond its first request
DRAIN_MIN = 64 << 10     # D197: a request this large or larger is followed by a drain of the socket
UNSENT_WAIT_S = 0.02     # D271: how long a request past the bound waits for its principal's replies to leave


def principal_budget(max_bytes: int) -> int:
    """D270: what one principal may have on the worker beyond one request: part of ``--max-bytes``."""
    return min(QUEUED_BYTES, max_bytes)


class Inbox:
    """The socket, owned by the loop's thread but while a long call runs."""

    def __init__(self, sock: zmq.Socket, curve: bool, budget: int = QUEUED_BYTES,
                 on_busy: Callable[[Principal], None] | None = None):
        self.sock = sock
        self._arrivals = zmq.Poller()  # one for the socket: Socket.poll makes one per call
        self._arrivals.register(sock, zmq.POLLIN)
        self._waiting = [(sock, zmq.POLLIN)]  # D354: drain's look, zmq_poll's own argument
        self._timeout_ms = sock.getsockopt(zmq.RCVTIMEO)  # the loop's receive waits this long
        self.budget = budget
        self.curve = curve
        self.waiting: collections.deque = collections.deque()  # (frames, principal, bytes)
        self.held: dict[str, int] = {}  # principal -> bytes waiting
        self.flight: tuple[str, int] | None = None  # the request being handled: its principal, bytes
        self.unsent: dict[str, list] = {}  # principal -> (tracker, bytes) of replies libzmq still holds
        self.on_busy = on_busy  # told of each request answered busy
        self._lock = threading.Lock()   # whoever holds it may use the socket
        self._lock.acquire()
        self._call = 0                  # the running call's number, 0 between calls
        self._started = 0.0
        self._stop = False
        self._shed = False
        self._thread = threading.Thread(target=self._drain_loop, name="fusion-shim-inbox", daemon=True)
        self._thread.start()

    def next(self, timeout_ms: int) -> tuple[list, Principal, int] | None:
        """The next request (its frames with the routing identity first, its principal, and its bytes
        after the identity: D351, counted once), waiting ones first; None when none came within ``timeout_ms``."""
        self.flight = None
        if self.waiting:
            frames, principal, n = self.waiting.popleft()
            left = self.held[principal.name] - n
            if left:
                self.held[principal.name] = left
            else:
                del self.held[principal.name]
            self.flight = (principal.name, n)
            return frames, principal, n
        while (frames := self._recv(timeout_ms)) is not None:
            if len(frames) < 2:  # no routing identity: nothing to answer to
                timeout_ms = 0
                continue
            principal = principal_of(frames[1], self.curve)
            name, n = principal.name, sum(map(len, frames[1:]))  # D77: _recv's frames are zmq.Frames: len is bytes
            # D270, D346: a principal with nothing waiting or unsent here (no request in hand now) is under any
            # budget; D351: nobody's (held drops a principal at 0, unsent one whose replies all left), one look
            if ((self.held or self.unsent) and (self.held.get(name) or self.unsent.get(name))
                    and (load := self._over(name, n)) is not None and not _small_answer(frames[1])):
                self._busy(frames, principal, load)
                timeout_ms = 0
                continue
            self.flight = (name, n)
            return frames, principal, n
        if self._shed:  # idle after shedding: the shed requests' pages go back (D69)
            self._shed = False
            trim_heap()
        return None

    def load(self, name: str) -> int:
        """D270: the bytes principal ``name`` has here: waiting, being handled, replies unread."""
        n = self.held.get(name, 0)
        if self.flight is not None and self.flight[0] == name:
            n += self.flight[1]
        sent = self.unsent.get(name)
        if sent:
            sent[:] = [(t, b) for t, b in sent if not t.done]
            n += sum(b for _, b in sent)
            if not sent:
                del self.unsent[name]
        return n

    def _over(self, name: str, n: int) -> int | None:
        """The principal's load where a request of ``n`` bytes would take it past the budget, else None.
        One request of any size is taken from a principal that has nothing else here."""
        load = self.load(name)
        if not load or load + n <= self.budget:
            return None
        sent = self.unsent.get(name)
        if sent:  # D271: a reply its peer has just read may not be let go of yet
            deadline = time.monotonic() + UNSENT_WAIT_S
            try:
                for tracker, _ in list(sent):
                    tracker.wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                pass  # still unread: it counts
            load = self.load(name)
            if not load or load + n <= self.budget:
                return None
        return load

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

    def running(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, with the socket left to the draining thread should it run long (D351: no
        closure made per request)."""
        self._started = time.monotonic()
        self._call += 1
        self._lock.release()
        try:
            return call(*args)
        finally:
            self._call = 0
            self._lock.acquire()

    def drain(self) -> None:
        """D197: take every request libzmq holds into the queue, shedding past each principal's
        budget: after a large request, so that many connections' queues cannot hold more than it."""
        while _zmq_poll(self._waiting, 0):  # D354: a look, not a receive raising Again (1 us, not 4)
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._admit(frames)
        if self._shed:
            self._shed = False
            trim_heap()

    def send(self, identity: bytes, frames: list, principal: Principal | None = None) -> int:
        """Send a reply; one for ``principal`` counts against its budget until libzmq lets go of it (D270)."""
        if principal is None:
            return send_frames(self.sock, frames, prefix=[identity])
        if self.flight and self.flight[0] == principal.name:  # a (name, bytes) pair, or None
            self.flight = None  # its request's bytes are freed: its reply's count now
        total, tracked = send_tracked(self.sock, frames, [identity])
        if tracked:
            self.unsent.setdefault(principal.name, []).extend(tracked)
        return total

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
        load = self._over(principal.name, n)
        if load is None or _small_answer(frames[1]):
            self.waiting.append((frames, principal, n))
            self.held[principal.name] = self.held.get(principal.name, 0) + n
            return
        self._busy(frames, principal, load)

    def _busy(self, frames: list, principal: Principal, load: int) -> None:
        """Answer a request past its principal's budget with a small ``busy`` error, and free it."""
        self._shed = True
        if self.on_busy is not None:
            self.on_busy(principal)
        try:
            rid = wire.decode_header(frames[1])["id"]
        except wire.WireError:
            return  # a malformed request past the bound: dropped, it gets no answer
        reply = messages.error(rid, "busy", "WorkerBusy", f"{load} bytes of this client's requests and replies are "
                               f"on the worker already (at most {self.budget}): computed by the client")
        try:
            self.send(frames[0].bytes, reply.frames())
        except zmq.ZMQError:
            pass  # the client is gone


def _small_answer(header: Any) -> bool:
    """D270: a ``hello`` or ``stats`` request, whose small reply is taken past the bound: a client's
    probe answered ``busy`` would take the worker for down."""
    try:
        return wire.decode_header(header)["t"] in ("hello", "stats")
    except (wire.WireError, KeyError, TypeError):
        return False


def trim_heap() -> None:
    """Hand the freed pages of shed requests back to the system (D69: the allocator keeps them
    otherwise, and the worker's resident memory stays as if they still waited)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc

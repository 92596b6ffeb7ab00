"""Transports, chosen by URL scheme: ``inproc://`` (worker in a thread of this process, for tests),
``ipc://`` (a unix socket, the embedded worker) and ``tcp://`` (a worker on another host). All three
are ZeroMQ: the client holds a DEALER socket per thread, the worker one ROUTER.

On the same host, buffers can bypass the socket through shared memory: :mod:`.shm`; the
socket still carries every header, and stays the fallback.

The one operation a caller needs is :meth:`Channel.request`: send a request (a
:class:`~fusion_shim.protocol.messages.Request`, its buffers through the channel's shared-memory
lane when it has one) and wait, up to a deadline, for the reply that carries the same request id.
What a request watches besides its socket (``alive``) and its lane are the channel's, given where
it is made; what differs per request (a reply skeleton, the socket only) is the request's. Failures are
grouped by what the caller can do about them: every :class:`TransportError` means "compute locally
and record why".

A waiting client learns that its worker is gone without waiting out the deadline. A
killed worker closes its connections at once; a stopped or unreachable one is found by heartbeats:
next to its data socket each channel holds a *pulse* socket to the same worker that carries no
messages, only ZMTP heartbeats (``HEARTBEAT_IVL_MS``), dropped after ``HEARTBEAT_TIMEOUT_MS``
without an answer. (Heartbeats on the data socket itself would drop any reply that takes longer
than the time-out to transfer: libzmq queues the worker's PONG behind the message being sent.) A
socket monitor turns a dropped connection into :class:`WorkerLost` while a request waits: a reply
can never arrive over a connection that is gone, since the worker's ROUTER addresses replies to the
connection the request came on. A worker that refuses the client's CURVE key, or a handshake that
fails, is :class:`Refused`. A client that holds no keys a tcp worker would accept opens no
connection at all (:class:`Unauthenticated`): plaintext only where both ends ask for it.
"""
from __future__ import annotations

import ipaddress
import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np
import zmq

from ..config import SCHEMES  # where settings are checked, before this module (and zmq) loads
from ..protocol import wire
from ..protocol.messages import Request
from .principal import peer_uid

if TYPE_CHECKING:
    from ..protocol.skeleton import Skeleton
    from .shm_client import ShmPool

POLL_SLICE_S = 0.05  # how often a waiting client checks that its worker is still there
HEARTBEAT_IVL_MS = 250
HEARTBEAT_TIMEOUT_MS = 1000  # a stopped worker is noticed about this long after its last answer
RECONNECT_IVL_MS = 20        # a restarted worker is found this soon (libzmq's default is 100 ms),
RECONNECT_IVL_MAX_MS = 1000  # backing off to once a second while it stays away
_WATCHED = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)


class TransportError(Exception):
    """The worker could not answer; the call is computed locally."""


class Timeout(TransportError):
    pass


class WorkerDied(TransportError):
    pass


class BadReply(TransportError):
    pass


class WorkerLost(TransportError):
    """The connection to the worker dropped while a request waited (killed, stopped, unreachable)."""


def _exits_soon(alive: Callable[[], bool], within_s: float = 0.05) -> bool:
    """Whether a watched worker process is seen gone within ``within_s``: a killed process closes
    its sockets before its exit can be reaped, so a dropped connection can be seen first (the
    report then said "lost" for a worker that had died)."""
    end = time.monotonic() + within_s
    while alive():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


class Refused(TransportError):
    """The security handshake failed: the worker refused this client's key, or the keys do not match."""

    @property
    def why(self) -> str:
        return "wrong key: " + str(self)


class Unauthenticated(TransportError):
    """No keys to authenticate this tcp worker with, and plaintext not asked for: nothing is sent.
    ``why``: in a few words; ``fix``: the command or setting that cures it."""

    def __init__(self, text: str, why: str, fix: str):
        super().__init__(f"{text}: {fix}")
        self.why, self.fix = why, fix


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


_monitor_ids = itertools.count()


def _monitor_addr() -> str:
    return f"inproc://fusion-shim-monitor-{os.getpid()}-{next(_monitor_ids)}"


def _reset_after_fork() -> None:
    global _ctx_lock
    _ctx_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_after_fork)


def frame_bytes(frame: Any) -> int:
    """A frame's length in bytes: a ``zmq.Frame``, bytes, or a buffer (an ndarray, a memoryview)."""
    nbytes = getattr(frame.__class__, "nbytes", None)  # on the class: a Frame's own lookup is slow
    return len(frame) if nbytes is None else frame.nbytes


_SNDMORE, _POLLIN, _EVENTS = int(zmq.SNDMORE), int(zmq.POLLIN), int(zmq.EVENTS)  # D42: ints, not enums
_socket_send = zmq.backend.Socket.send  # D42: what zmq.Socket.send calls, past its routing/group checks
_socket_recv = zmq.backend.Socket.recv
_zmq_poll = zmq.backend.zmq_poll  # D42: getsockopt converts its option to an enum in Python first
_ZERO_COPY_MIN = wire.ZERO_COPY_MIN
_ndarray = np.ndarray


def send_frames(sock: zmq.Socket, frames: Sequence[Any], prefix: Sequence[bytes] = ()) -> int:
    """Send a multipart message of one frame or more; returns the bytes of ``frames`` (the prefix is
    routing, not payload)."""
    if not frames:
        raise ValueError("a message has one frame or more")
    send = _socket_send if type(sock) is zmq.Socket else _send_wrapped
    last = len(frames) - 1
    for part in prefix:
        send(sock, part, _SNDMORE, True)  # a routing id: a few bytes, copied
    total = 0
    for i, part in enumerate(frames):
        cls = part.__class__
        n = len(part) if cls is bytes else part.nbytes if cls is _ndarray else frame_bytes(part)
        total += n
        send(sock, part, _SNDMORE if i < last else 0, n < _ZERO_COPY_MIN)
    return total


def send_tracked(sock: zmq.Socket, frames: Sequence[Any], prefix: Sequence[bytes] = ()) -> tuple[int, list]:
    """:func:`send_frames`, and a ``(tracker, bytes)`` pair for each frame sent without a copy: its
    tracker is done once libzmq has let go of the frame (written it out, or dropped its connection)."""
    if not frames:
        raise ValueError("a message has one frame or more")
    send = _socket_send if type(sock) is zmq.Socket else _send_wrapped  # D343: a small reply's path is send_frames'
    last = len(frames) - 1
    for part in prefix:
        send(sock, part, _SNDMORE, True)
    total, tracked = 0, []
    for i, part in enumerate(frames):
        cls = part.__class__
        n = len(part) if cls is bytes else part.nbytes if cls is _ndarray else frame_bytes(part)
        total += n
        if n < _ZERO_COPY_MIN:  # copied: libzmq holds nothing of ours, nothing to track
            send(sock, part, _SNDMORE if i < last else 0, True)
        elif (tracker := sock.send(part, _SNDMORE if i < last else 0, copy=False, track=True)) is not None:
            tracked.append((tracker, n))  # None: a zmq.Frame made untracked, let go of when sent
    return total, tracked


def _send_wrapped(sock: Any, part: Any, flags: int, copy: bool) -> None:
    """A socket other than ``zmq.Socket`` itself (a subclass, a test's stand-in), through its ``send``."""
    sock.send(part, flags, copy=copy)


def _recv_frames(sock: zmq.Socket) -> list:
    """``sock.recv_multipart(copy=False)``, each frame's ``more`` read as it came (D42)."""
    if type(sock) is not zmq.Socket:
        return sock.recv_multipart(copy=False)
    frame = _socket_recv(sock, 0, False)
    frames = [frame]
    while frame.more:
        frame = _socket_recv(sock, 0, False)
        frames.append(frame)
    return frames


class Answer(NamedTuple):
    """A request's reply, and what its buffers took."""
    header: dict
    arrays: list
    encoded: float          # perf_counter when the request was encoded (inputs copied into segments)
    shm_sent: int           # input bytes that went through shared memory
    shm_received: int       # result bytes that came back that way
    lane_note: str | None   # why a lane that was given carried nothing, if it could not
    timing: Any = None      # the reply's messages.Timing where a skeleton read it (header: the skeleton's)
    learn_from: Any = None  # the reply's frames where the skeleton is learning, for it to learn once accepted


COMING_MAX_S = 30.0  # D34: a worker starting at the address binds after importing torch, 3.0-3.3 s here


def _unknown_host(url: str) -> bool:
    """Whether a tcp URL names a host that does not resolve (asked once a channel gives up)."""
    if not url.startswith("tcp://"):
        return False
    host = url[len("tcp://"):].rpartition(":")[0].strip("[]")
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        pass
    import socket

    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        return True
    except OSError:
        return False
    return False


class NoListener(TransportError):
    """Nothing ever accepted this channel's connection: no worker at that address. ``why``: in a few words."""

    def __init__(self, text: str, why: str):
        super().__init__(text)
        self.why = why


class Channel:
    """A client's connection to one worker, used by one thread at a time.

    ``curve``: ``(server_public, client_public, client_secret)`` (z85 bytes) to speak CURVE, or None.
    ``peer_uid``: on ``ipc://``, a uid besides this user's and root's that may answer.
    ``give_up_s``: a request fails with :class:`NoListener` once no connection was made this long,
    unless ``coming()`` says a worker is starting there (then up to ``COMING_MAX_S``).
    ``alive``: False once the worker's process is known gone (every request's wait ends then).
    ``lane``: the shared-memory pool negotiated now, or None (asked at each request: a new worker
    at the same address negotiates a new one).
    A forked child never uses its parent's channel: callers compare ``pid``."""

    def __init__(self, url: str, curve: tuple[bytes, bytes, bytes] | None = None, peer_uid: int | None = None,
                 give_up_s: float | None = None, coming: Callable[[], bool] | None = None, *,
                 alive: Callable[[], bool] | None = None, lane: "Callable[[], ShmPool | None] | None" = None):
        check_url(url)
        self.alive, self.lane = alive, lane
        self.sock = self.pulse = None
        self.monitors: list[zmq.Socket] = []
        self._data_events: list = []
        # a request fails once nothing accepted a connection this long (inproc has no monitor to say)
        self.give_up_s = None if url.startswith("inproc://") else give_up_s
        self.coming = coming
        self._coming_seen = (0.0, False)  # (when coming() was last asked, its answer)
        self.opened = time.monotonic()
        self.retries = 0      # connections refused so far, before any handshake
        self.connected = False  # a transport connection was made at least once
        try:
            self._open(url, curve, peer_uid)
        except zmq.ZMQError as exc:  # e.g. out of file descriptors: a fault like any other
            self.close()
            raise TransportError(f"cannot open a channel to {url}: {exc}") from None

    def _open(self, url: str, curve: tuple[bytes, bytes, bytes] | None, peer_uid: int | None) -> None:
        self.url = url
        self.pid = os.getpid()
        self.handshakes = 0  # successful handshakes of the data socket (reconnects add to it)
        self.up = False      # the data socket's connection, as its monitor last said
        self.refused: str | None = None  # why the last handshake failed, until one succeeds
        self.closed_early = False        # closed before any handshake succeeded
        self.disconnects = 0             # of the data socket, after a handshake
        self.pulse_up = self.pulse_seen = False
        self.curve = curve is not None
        # D64: on ipc:// only a process of this user (or root) may answer; checked before the first
        # request of each connection and on every reply; ``peer_uid``: one more the user trusts
        self.peer_uids = {os.geteuid(), 0, *([] if peer_uid is None else [peer_uid])} if url.startswith("ipc://") else None
        self._verified = 0  # the handshakes whose listener was checked
        ctx = context()
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        if not url.startswith("inproc://"):  # inproc: same process, nothing to lose, nothing to watch
            self.pulse = ctx.socket(zmq.DEALER)
            self.pulse.setsockopt(zmq.LINGER, 0)
            self.pulse.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            self.pulse.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            self.pulse.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            self.pulse.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            # named by pid and a counter: pyzmq's default name reuses the socket's file descriptor,
            # which a channel opened right after another was closed can get again
            self.monitors = [
                self.sock.get_monitor_socket(_WATCHED, addr=_monitor_addr()),
                self.pulse.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED,
                                              addr=_monitor_addr()),
            ]
            for mon in self.monitors:
                mon.setsockopt(zmq.LINGER, 0)
            self._data_events = [(self.monitors[0], _POLLIN)]  # D42: polled before each request
        for sock in (self.sock, self.pulse):
            if sock is None:
                continue
            if curve is not None:
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve
            sock.connect(url)
        self.pulse_up = False
        self._rcvtimeo = -1  # the data socket's RCVTIMEO as last set (D42: the wait for a reply is its receive)
        # what the last request() put on and took off this socket, counted at the socket
        self.last_send_s = 0.0
        self.last_bytes_sent = 0
        self.last_bytes_received = 0

    def _events(self, data_only: bool = False) -> None:
        """Read the monitors (never blocks) into the connection state. For the pulse only the state
        after its last event counts (it carries no requests); the data socket's disconnects are
        counted, since a request in flight is lost with its connection even if another follows."""
        for i, mon in enumerate(self.monitors[:1] if data_only else self.monitors):
            while mon.getsockopt(_EVENTS) & _POLLIN:
                event = int.from_bytes(mon.recv_multipart()[0][:2], "little")
                if i == 1:  # the pulse
                    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        self.pulse_up = self.pulse_seen = True
                    elif event == zmq.EVENT_DISCONNECTED:
                        self.pulse_up = False
                elif event == zmq.EVENT_CONNECT_RETRIED:
                    self.retries += 1
                elif event == zmq.EVENT_CONNECTED:
                    self.connected = True
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.handshakes += 1
                    self.up, self.refused, self.closed_early = True, None, False
                elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    self.up, self.refused = False, f"the worker at {self.url} refused this client's key"
                elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    self.up, self.refused = False, (f"security handshake with {self.url} failed (wrong server key, "
                                                    "or one side speaks CURVE and the other does not)")
                elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                    self.closed_early = self.closed_early or not self.handshakes
                    self.disconnects += self.up
                    self.up = False

    def _problem(self, mark: int) -> TransportError | None:
        """Why a reply cannot come, by what the monitors said since the request left (``mark``: the
        disconnects counted then); None if it still may."""
        if self.disconnects > mark:
            return WorkerLost(f"connection to {self.url} lost while waiting (worker killed, stopped or "
                              "unreachable)")
        if self.up:
            if self.pulse_seen and not self.pulse_up:
                return WorkerLost(f"no heartbeat from {self.url} for {HEARTBEAT_TIMEOUT_MS} ms, or its connection "
                                  "closed (worker stopped, killed or unreachable)")
            return None
        if self.refused:
            return Refused(self.refused)
        if self.handshakes:
            return WorkerLost(f"connection to {self.url} lost (worker killed, stopped or unreachable)")
        waited = time.monotonic() - self.opened
        if self.give_up_s is not None and not self.connected and waited >= self.give_up_s and not self._worker_coming(waited):
            if self.retries and _unknown_host(self.url):  # libzmq retries a name it cannot resolve, too
                return NoListener(f"no worker at {self.url}: its host name does not resolve", "unknown host")
            if self.retries:
                return NoListener(f"nothing listens at {self.url}: connection refused {self.retries} times in "
                                  f"{waited:.1f}s (no worker there, or a wrong address)", "connection refused")
            return NoListener(f"no connection to {self.url} within {waited:.1f}s (unknown host, host unreachable "
                              "or filtered)", "no connection: unknown host, unreachable or filtered")
        if self.closed_early:  # a worker dying mid-handshake looks the same as one refusing our keys
            hint = " (with CURVE: or a wrong server key)" if self.curve else ""
            return WorkerLost(f"{self.url} closed the connection before the handshake completed{hint}")
        return None

    def _worker_coming(self, waited: float) -> bool:
        """D35: whether a worker is starting at the address (asked at most twice a second)."""
        if self.coming is None or waited >= COMING_MAX_S:
            return False
        asked, answer = self._coming_seen
        now = time.monotonic()
        if now - asked >= 0.5:
            answer = bool(self.coming())
            self._coming_seen = (now, answer)
        return answer

    def request(self, req: Request, deadline: float) -> "Answer":
        """Send ``req`` and return its decoded reply (the one with its id); raise TransportError.
        Through the channel's lane, unless ``req.by_socket``: inputs that are not references go into
        its segments and each declared result is offered a slot; a request without a usable reply
        retires them. Where ``/dev/shm`` refuses, the socket carries all. ``req.skeleton``: the
        reply is read from it where it repeats the one it learnt (D48); while it is learning, a
        reply decoded in full comes back with its frames, for the caller to offer it once the
        result is accepted."""
        pool = None if req.by_socket or self.lane is None else self.lane()
        if pool is None:
            staged, frames, note = None, req.frames(), None
        else:
            staged, frames, note = pool.stage(req)
        t = time.perf_counter()
        try:
            header, arrays, timing, learn_from = self._roundtrip(req.id, frames, deadline, self.alive, staged,
                                                                 req.skeleton)
        except BaseException:
            if staged is not None:
                staged.abandon()
            raise
        if staged is None:
            return Answer(header, arrays, t, 0, 0, note, timing, learn_from)
        staged.finish(header)
        return Answer(header, arrays, t, staged.sent, staged.received, note)

    def _check_listener(self) -> None:
        """The ipc socket file of a new connection belongs to a process of this user (or root)."""
        path = self.url[len("ipc://"):]
        try:
            self._check_peer(os.stat(path).st_uid)
        except OSError:
            pass  # gone again: its reply, if any, is checked
        self._verified = self.handshakes

    def _check_peer(self, uid: int | None) -> None:
        if uid is not None and uid not in self.peer_uids:
            raise Refused(f"the process at {self.url} runs as uid {uid}, not as this user (uid {os.geteuid()}): "
                          "refused, nothing is sent to it (FUSION_SHIM_WORKER_UID names a uid to trust)")

    def _roundtrip(self, rid: int, frames: Sequence[Any], deadline: float, alive: Callable[[], bool] | None,
                   segments: Any, skeleton: "Skeleton | None" = None) -> tuple[dict, list, Any, Any]:
        """``segments`` resolves results in shared memory (:mod:`.shm`): only for this request's own
        reply, so a late reply to another is dropped before its arrays are looked at."""
        try:
            # what the data socket's monitor says before the request leaves is not about it
            # (D42: one poll when it has nothing); a connection known to be down cannot carry it
            if self._data_events and _zmq_poll(self._data_events, 0):
                self._events(data_only=True)
            mark = self.disconnects
            if self.handshakes and not self.up:
                raise WorkerLost(f"connection to {self.url} is down (lost since the last call, not yet back)")
            if self.peer_uids is not None and self.handshakes != self._verified:
                self._check_listener()
            t = time.perf_counter()
            self.last_bytes_sent = send_frames(self.sock, frames)
            self.last_send_s = time.perf_counter() - t
            self.last_bytes_received = 0
            return self._wait(rid, deadline, alive, mark, segments, skeleton)
        except zmq.ZMQError as exc:
            raise TransportError(f"socket error: {exc}") from None

    def _wait(self, rid: int, deadline: float, alive: Callable[[], bool] | None, mark: int,
              segments: Any = None, skeleton: "Skeleton | None" = None) -> tuple[dict, list, Any, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply within the deadline from {self.url}")
            try:
                reply = self._recv(int(min(left, POLL_SLICE_S) * 1000) + 1)
            except zmq.Again:
                if alive is not None and not alive():
                    raise WorkerDied(f"worker at {self.url} exited")
                self._events()
                problem = self._problem(mark)
                if problem is not None:
                    if alive is not None and isinstance(problem, WorkerLost) and _exits_soon(alive):
                        raise WorkerDied(f"worker at {self.url} exited")
                    raise problem
                continue
            self.last_bytes_received += sum(map(len, reply))
            if self.peer_uids is not None:
                self._check_peer(peer_uid(reply[0]))
            if skeleton is not None:
                read = skeleton.read(reply, rid)
                if read is not None:
                    return (*read, None)
            try:
                early = wire.decode_header(reply[0]) if segments is not None else None
                if early is not None and early["id"] != rid:
                    continue  # a late reply to a request abandoned earlier: drop it unread
                header, arrays = wire.decode(reply, segments=segments, header=early)
            except wire.WireError as exc:
                raise BadReply(str(exc)) from None
            if header["id"] != rid:
                continue  # a late reply to a request abandoned earlier: drop it
            return header, arrays, None, reply if skeleton is not None and skeleton.learning else None

    def _recv(self, timeout_ms: int) -> list:
        """The next message on the data socket, waited for up to ``timeout_ms`` in the receive
        itself (D42: a poll and then a receive cost two calls into libzmq)."""
        if timeout_ms != self._rcvtimeo:
            self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
            self._rcvtimeo = timeout_ms
        return _recv_frames(self.sock)

    def close(self) -> None:
        for sock in (self.sock, self.pulse):
            if sock is None or sock.closed:
                continue
            if self.monitors:
                try:
                    sock.disable_monitor()
                except zmq.ZMQError:
                    pass
            sock.close(linger=0)
        for mon in self.monitors:
            mon.close(linger=0)

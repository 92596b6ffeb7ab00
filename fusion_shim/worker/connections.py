"""The worker's connections, counted per principal and in all, from a ZeroMQ socket monitor (D193).

libzmq accepts every connection that reaches a bound socket and keeps one fd open for it; at the
process's fd limit an ``ipc://`` listener aborts the process (``accept`` failing with ``EMFILE`` is
an assertion there). So at start the soft fd limit is raised to its hard limit, and a monitor thread
watches each accepted and closed connection: a connection past the total limit (which leaves
``headroom`` fds for the worker's own files, segments and pipes) or past its principal's limit is
shut down at once, and libzmq closes it as if its peer had left. The worker keeps serving the others.

A connection's principal: on ``ipc://`` the peer's uid, read from its fd (SO_PEERCRED) when it is
accepted; on a CURVE socket the key, learned from its first message (:meth:`Connections.learn`),
told apart from a closed connection's queued messages by the token the ZAP handler gave it (D319). A
principal whose last connection closed is reported by :meth:`Connections.ended` once ``grace_s``
passed without it reconnecting (D195): the worker then frees what it held.
"""
from __future__ import annotations

import errno
import os
import resource
import select
import socket
import struct
import threading
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..auth import CONNECTION_PROPERTY

MAX_CONNECTIONS = 1024           # in all, at most; less where the fd limit leaves less
MAX_PER_PRINCIPAL = 128          # one principal's connections: a client opens a few
GRACE_S = 30.0                   # D195: a principal that reconnects within this keeps its data
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def raise_fd_limit() -> int:
    """Raise the soft limit of open files to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass  # some systems cap the soft limit below the hard one: keep what there is
    return soft


def connection_limit(fd_limit: int, wanted: int = MAX_CONNECTIONS) -> int:
    """D193: the connections a worker may hold at ``fd_limit``: a quarter of the fds (at least 64)
    stays for its own use, since accepts run ahead of the monitor that closes connections past it."""
    headroom = max(64, fd_limit // 4)
    return max(1, min(wanted, fd_limit - headroom))


class _Conn:
    """One accepted connection: the tokens issued before its accept (``floor``), its own, its principal."""
    __slots__ = ("floor", "token", "name")

    def __init__(self, floor: int):
        self.floor, self.token, self.name = floor, None, None


class Connections:
    """Counts ``sock``'s connections per principal; shuts those past the limits; says who left.

    D319: on a CURVE socket the ZAP handler stamps each accepted handshake with :meth:`token`, one
    number higher each time, and every message of that connection carries it (``CONNECTION_PROPERTY``).
    :meth:`token` first reads every pending monitor event, so a connection's token exceeds the
    ``floor`` its accept recorded (the tokens issued by then), while a connection that held the same
    fd before it got its token before that accept: a message whose token is not above its fd's floor
    comes from a connection that has closed, and credits and shuts nothing. Every use of the monitor
    socket is under ``_lock``; the thread waits on its fd, not on the socket."""

    def __init__(self, sock: zmq.Socket, *, curve: bool, max_total: int | None = None,
                 max_per_principal: int = MAX_PER_PRINCIPAL, grace_s: float = GRACE_S):
        self.max_total = connection_limit(raise_fd_limit()) if max_total is None else max_total
        self.max_per_principal = max_per_principal
        self.grace_s = grace_s
        self.curve = curve
        self.refused = 0
        self._fds: dict[int, _Conn] = {}           # fd -> its connection, principal None until known
        self._per: dict[str, int] = {}             # principal -> its open connections
        # principal -> when its last connection closed; read without the lock as a cheap check (D343, D351)
        self.left: dict[str, float] = {}
        self._issued = 0                           # D319: tokens handed to the ZAP handler so far
        self._to_shut: list[tuple[int, _Conn]] = []
        self._lock = threading.Lock()
        self._monitor: zmq.Socket | None = sock.get_monitor_socket(_EVENTS)
        self._wake = self._monitor.getsockopt(zmq.FD)
        self._sock = sock
        self._stop = False
        self._thread = threading.Thread(target=self._watch, name="fusion-shim-connections", daemon=True)
        self._thread.start()

    def counts(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return len(self._fds), dict(self._per)

    def token(self) -> int:
        """D319: the token of a handshake the ZAP handler accepts, above every accept it may follow."""
        with self._lock:
            self._drain()  # the accept of the connection asking is among the events read here
            self._issued += 1
            return self._issued

    def learn(self, frame: Any, name: str) -> None:
        """The connection ``frame`` came over belongs to ``name`` (a CURVE key seen in a message)."""
        fd, token = _srcfd(frame), _token(frame)
        conn = self._fds.get(fd) if fd is not None else None
        if fd is None or token is None or (conn is not None and conn.token == token):
            return  # known already (the common case, no lock), or unstamped: credits no one
        with self._lock:
            self._drain()
            conn = self._fds.get(fd)
            # D319: a token not above the fd's floor is a closed connection's: the fd is another's now
            if conn is not None and conn.name is None and token > conn.floor:
                conn.token = token
                self._assign(conn, name)
                if self._over_locked(name):
                    self._to_shut.append((fd, conn))
            self._shut_pending()

    def ended(self) -> list[str]:
        """Principals whose last connection closed ``grace_s`` ago or more and who did not come back."""
        if not self.left:  # D343: asked after every request; none left is the common case (no lock)
            return []
        now = time.monotonic()
        with self._lock:
            gone = [p for p, t in self.left.items() if now - t >= self.grace_s]
            for p in gone:
                del self.left[p]
        return gone

    def close(self) -> None:
        self._stop = True
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._thread.join(5)
        with self._lock:
            if self._monitor is not None:
                self._monitor.close(linger=0)
                self._monitor = None

    def _watch(self) -> None:
        waiter = select.poll()
        waiter.register(self._wake, select.POLLIN)
        while not self._stop:
            with self._lock:
                if self._monitor is None or not self._drain():
                    return
                self._shut_pending()
            # the fd signals only once a drain ended empty, hence the drain first; edges only: a timeout
            waiter.poll(200)

    def _drain(self) -> bool:
        """Applies every pending monitor event (lock held); False once the monitor stopped."""
        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return True
            except zmq.ZMQError:
                return False  # the monitor was closed
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            elif event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._closed(fd)
            elif event["event"] == zmq.EVENT_MONITOR_STOPPED:
                return False
        return False

    def _accepted(self, fd: int) -> None:
        # read mid-drain: were the fd another's already, its close is among the events still to read
        name = None if self.curve else _uid_principal(fd)
        conn = self._fds[fd] = _Conn(self._issued)
        if name is not None:
            self._assign(conn, name)
        if len(self._fds) > self.max_total or (name is not None and self._over_locked(name)):
            self._to_shut.append((fd, conn))

    def _assign(self, conn: _Conn, name: str) -> None:
        conn.name = name
        self._per[name] = self._per.get(name, 0) + 1
        self.left.pop(name, None)  # back within its grace: its data stays

    def _closed(self, fd: int) -> None:
        conn = self._fds.pop(fd, None)
        if conn is None or conn.name is None:
            return
        name = conn.name
        self._per[name] -= 1
        if not self._per[name]:
            del self._per[name]
            self.left[name] = time.monotonic()

    def _over_locked(self, name: str) -> bool:
        return self._per.get(name, 0) > self.max_per_principal

    def _shut_pending(self) -> None:
        """Shuts each connection marked for it that still holds its fd (lock held)."""
        while self._to_shut:
            fd, conn = self._to_shut.pop()
            if self._fds.get(fd) is conn:
                self._shut(fd, conn)

    def _shut(self, fd: int, conn: _Conn) -> None:
        """D320: shut through a duplicate of ``fd`` taken before the events are read once more: if the
        connection still holds the fd after them, the duplicate is its socket, whatever libzmq does to
        the fd number next; libzmq then reads end-of-stream and closes the connection itself."""
        try:
            dup = os.dup(fd)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                return  # already gone
            dup = -1  # no fd to spare: the fd itself, checked by the events read just now
        try:
            self._drain()  # a close of the fd before the dup is among these events (D320)
            if self._fds.get(fd) is not conn:
                return
            self.refused += 1
            s = socket.socket(fileno=dup if dup >= 0 else fd)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                s.detach()
        finally:
            if dup >= 0:
                os.close(dup)


def _uid_principal(fd: int) -> str | None:
    """``uid:<n>`` of the peer of a unix-socket fd (as :mod:`fusion_shim.transport.principal` names it)."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if s.family != socket.AF_UNIX:
            return None
        _, uid, _ = _PEERCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return f"uid:{uid}"
    except OSError:
        return None
    finally:
        s.detach()


def _token(frame: Any) -> int | None:
    """D319: the ZAP handler's token of the connection ``frame`` came over; None where it has none."""
    try:
        return int(frame.get(CONNECTION_PROPERTY))
    except (zmq.ZMQError, AttributeError, TypeError, ValueError):
        return None


def _srcfd(frame: Any) -> int | None:
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError, ValueError):
        return None

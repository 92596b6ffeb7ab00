"""The worker's connections, counted per principal and in all, from a ZeroMQ socket monitor (D193).

libzmq accepts every connection that reaches a bound socket and keeps one fd open for it; at the
process's fd limit an ``ipc://`` listener aborts the process (``accept`` failing with ``EMFILE`` is
an assertion there). So at start the soft fd limit is raised to its hard limit, and a monitor thread
watches each accepted and closed connection: a connection past the total limit (which leaves
``headroom`` fds for the worker's own files, segments and pipes) or past its principal's limit is
shut down at once, and libzmq closes it as if its peer had left. The worker keeps serving the others.

A connection's principal: on ``ipc://`` the peer's uid, read from its fd (SO_PEERCRED) when it is
accepted; on a CURVE socket the key, learned from its first message (:meth:`Connections.learn`). A
principal whose last connection closed is reported by :meth:`Connections.ended` once ``grace_s``
passed without it reconnecting (D195): the worker then frees what it held.
"""
from __future__ import annotations

import resource
import socket
import struct
import threading
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

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


class Connections:
    """Counts ``sock``'s connections per principal; shuts those past the limits; says who left."""

    def __init__(self, sock: zmq.Socket, *, curve: bool, max_total: int | None = None,
                 max_per_principal: int = MAX_PER_PRINCIPAL, grace_s: float = GRACE_S):
        self.max_total = connection_limit(raise_fd_limit()) if max_total is None else max_total
        self.max_per_principal = max_per_principal
        self.grace_s = grace_s
        self.curve = curve
        self.refused = 0
        self._fds: dict[int, str | None] = {}      # fd -> its principal's name, None until known
        self._per: dict[str, int] = {}             # principal -> its open connections
        self._left: dict[str, float] = {}          # principal -> when its last connection closed
        self._lock = threading.Lock()
        self._monitor = sock.get_monitor_socket(_EVENTS)
        self._sock = sock
        self._stop = False
        self._thread = threading.Thread(target=self._watch, name="fusion-shim-connections", daemon=True)
        self._thread.start()

    def counts(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return len(self._fds), dict(self._per)

    def learn(self, frame: Any, name: str) -> None:
        """The connection ``frame`` came over belongs to ``name`` (a CURVE key seen in a message)."""
        fd = _srcfd(frame)
        with self._lock:
            if fd is None or self._fds.get(fd, name) is not None:
                return
            self._assign(fd, name)
        if self._over(name):
            self._shut(fd)

    def ended(self) -> list[str]:
        """Principals whose last connection closed ``grace_s`` ago or more and who did not come back."""
        now = time.monotonic()
        with self._lock:
            gone = [p for p, t in self._left.items() if now - t >= self.grace_s]
            for p in gone:
                del self._left[p]
        return gone

    def close(self) -> None:
        self._stop = True
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._thread.join(5)
        self._monitor.close(linger=0)

    def _watch(self) -> None:
        poller = zmq.Poller()
        poller.register(self._monitor, zmq.POLLIN)
        while not self._stop:
            try:
                if not poller.poll(200):
                    continue
                event = recv_monitor_message(self._monitor)
            except zmq.ZMQError:
                return  # the monitor was closed
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            elif event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._closed(fd)
            elif event["event"] == zmq.EVENT_MONITOR_STOPPED:
                return

    def _accepted(self, fd: int) -> None:
        name = None if self.curve else _uid_principal(fd)
        with self._lock:
            self._fds[fd] = None
            if name is not None:
                self._assign(fd, name)
            over = len(self._fds) > self.max_total or (name is not None and self._over_locked(name))
        if over:
            self._shut(fd)

    def _assign(self, fd: int, name: str) -> None:
        self._fds[fd] = name
        self._per[name] = self._per.get(name, 0) + 1
        self._left.pop(name, None)  # back within its grace: its data stays

    def _closed(self, fd: int) -> None:
        with self._lock:
            if fd not in self._fds:
                return
            name = self._fds.pop(fd)
            if name is None:
                return
            self._per[name] -= 1
            if not self._per[name]:
                del self._per[name]
                self._left[name] = time.monotonic()

    def _over(self, name: str) -> bool:
        with self._lock:
            return self._over_locked(name)

    def _over_locked(self, name: str) -> bool:
        return self._per.get(name, 0) > self.max_per_principal

    def _shut(self, fd: int) -> None:
        """libzmq reads end-of-stream and closes the connection itself: the fd stays its own to close."""
        self.refused += 1
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            return  # already gone
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.detach()


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


def _srcfd(frame: Any) -> int | None:
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError, ValueError):
        return None

"""The worker's bound socket: its authentication, its queue limits and its connection counter.

A tcp address, loopback included, needs ``keys`` (CURVE with a ZAP allow-list,
:mod:`fusion_shim.auth`) or ``insecure``, which warns loudly (D68). Each connection may have
``QUEUED_PER_CONNECTION`` requests waiting (D65); unread replies count against their principal
(D271); connections past the limits of :class:`.connections.Connections` are shut (D193).
"""
from __future__ import annotations

import sys
from typing import Any

import zmq

from ..protocol import wire
from ..transport import check_url, context, is_loopback
from .connections import Connections

# D78: not raised, though libzmq then wakes its I/O thread about once more per request
QUEUED_PER_CONNECTION = 4     # D65: requests a connection may have waiting; then ZeroMQ stops reading it

INSECURE_WARNING = """\
fusion_shim worker: WARNING: serving {url} WITHOUT AUTHENTICATION (--insecure).
  Anyone who can reach this address can send buffers to this worker and run its kernels on them.
  Use --keys DIR (fusion-shim keys DIR) to accept only the clients you list; on loopback, leave out
  --insecure to accept only this user's processes (its own keys, ~/.config/fusion_shim/keys)."""


class Listener:
    """The bound ROUTER socket ``sock``, its context, ZAP handler and connection counter ``conns``."""

    def __init__(self, url: str, max_bytes: int, keys: Any = None, insecure: bool = False,
                 connection_limits: dict | None = None):
        if check_url(url) == "tcp" and keys is None:  # D68: loopback too, since any local user reaches it
            if not insecure:
                where = ("serve with --keys DIR, or without it to use this user's own keys" if is_loopback(url)
                         else "make keys with `fusion-shim keys DIR` and serve with --keys DIR")
                raise SystemExit(f"refusing to bind {url}: a tcp address needs authentication; {where} (or bind "
                                 "an ipc:// path in a private directory; --insecure serves without authentication)")
            print(INSECURE_WARNING.format(url=url), file=sys.stderr, flush=True)
        self.keys = keys
        self.auth = self.conns = None
        # a CURVE worker gets its own context: the ZAP handler is per context, and it must not judge
        # the sockets of a client living in the same process (tests)
        self.ctx = zmq.Context() if keys is not None else context()
        self.sock = sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, max(max_bytes, wire.MAX_HEADER))  # D272: a larger frame is cut off
        sock.setsockopt(zmq.RCVHWM, QUEUED_PER_CONNECTION)
        # D271: no small SNDHWM (it dropped replies clients waited for): unread replies count in bytes
        # against their principal's budget instead (D270, inbox.py)
        try:
            self.conns = conns = Connections(sock, curve=keys is not None, **(connection_limits or {}))  # D193
            if keys is not None:
                from ..auth import secure_server, secure_server_with
                from .isolation import protect  # D215: no stage process reads the keys

                # D319: each accepted handshake stamped with a token that tells its connection apart
                self.auth = (secure_server(self.ctx, sock, protect(keys), conns.token) if isinstance(keys, str)
                             else secure_server_with(self.ctx, sock, *keys, token=conns.token))
            sock.bind(url)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.conns is not None:
            self.conns.close()
        self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        if self.keys is not None:
            self.ctx.term()

"""Who is on the other end of a worker's connection (D60): the principal it keeps that client's data under.

- a CURVE connection: its client's public key (``key:<z85>``), which the ZAP handler checked;
- an ``ipc://`` connection: the peer's uid, read by the kernel (``uid:<n>``, SO_PEERCRED);
- anything else (``inproc://``, an unauthenticated tcp bind): one anonymous principal, ``anon``.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import zmq


class Principal(NamedTuple):
    name: str          # what the worker keeps data under
    uid: int | None    # the peer's uid on an ipc:// connection: a segment it names must be its own


ANON = Principal("anon", None)


def principal_of(frame: Any, curve: bool) -> Principal:
    """The principal of the connection ``frame`` (a ``zmq.Frame`` of the request) came over;
    ``curve``: the socket is a CURVE server, whose ZAP handler named each client's key."""
    try:  # D351: _property's read, inline: once per request
        peer = frame.get(b"Peer-Address")
    except (zmq.ZMQError, AttributeError, TypeError):
        peer = None
    key = _property(frame, b"User-Id") if curve else None  # asked only where set: a miss raises (5 us)
    return _named(key or None, peer)


@functools.lru_cache(maxsize=256)  # D77: made once per key and address, not per request
def _named(key: Any, peer: Any) -> Principal:
    uid = _uid_of(peer)
    if key:
        return Principal(f"key:{key}", uid)
    return Principal(f"uid:{uid}", uid) if uid is not None else ANON


def _property(frame: Any, name: str) -> Any:
    try:
        return frame.get(name)
    except (zmq.ZMQError, AttributeError, TypeError):
        return None


@functools.lru_cache(maxsize=64)  # D42: a channel's replies all come from one address
def _uid_of(peer: Any) -> int | None:
    """The uid in an ipc peer address (``<host>:<uid>:<gid>:<pid>``); None for any other."""
    parts = str(peer or "").rsplit(":", 3)
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


def peer_uid(frame: Any) -> int | None:
    """The uid of the process at the other end of an ``ipc://`` connection ``frame`` came over."""
    try:  # D351: _property's read, inline: once per reply
        peer = frame.get(b"Peer-Address")
    except (zmq.ZMQError, AttributeError, TypeError):
        peer = None
    return _uid_of(peer)

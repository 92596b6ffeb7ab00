"""A closed connection's queued messages, read after its fd number went to a new connection, credit
that new connection to no one and shut nothing of it (D319, D320).

libzmq keeps the messages a connection queued after it closed; the kernel gives the freed fd number
to the next connection, and the old messages are then read with that number (``SRCFD``) and the old
client's key. The worker tells them apart by the token its ZAP handler gave each handshake.
"""
from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from fusion_shim.auth import AllowList
from fusion_shim.transport.principal import principal_of
from fusion_shim.worker.listen import Listener

WAIT_MS = 60_000


def _until(what, deadline_s: float = 60.0) -> None:
    stop = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < stop, "waited 60 s"
        time.sleep(0.01)


class _Client:
    def __init__(self, ctx: zmq.Context, url: str, server_key: bytes, pair: tuple[bytes, bytes]):
        self.sock = s = ctx.socket(zmq.DEALER)
        s.curve_serverkey, (s.curve_publickey, s.curve_secretkey) = server_key, pair
        self.monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        s.connect(url)

    def events(self, wait_ms: int) -> list[int]:
        out = []
        while self.monitor.poll(wait_ms):
            out.append(recv_monitor_message(self.monitor)["event"])
            if out[-1] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                break
        return out

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


def _read(listener: Listener) -> tuple[bytes, int, bytes]:
    """One message from the worker's socket, learnt from as the worker's loop does; (body, fd, routing id)."""
    assert listener.sock.poll(WAIT_MS, zmq.POLLIN)
    frames = listener.sock.recv_multipart(copy=False)
    listener.conns.learn(frames[1], principal_of(frames[1], True).name)
    return frames[1].bytes, frames[1].get(zmq.SRCFD), frames[0].bytes


def test_a_closed_connections_queued_messages_credit_nothing_to_the_connection_on_its_fd_nor_shut_it():
    server, a, b = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    allowed = AllowList()
    allowed.allow(a[0])
    allowed.allow(b[0])
    # principal A at its limit of one connection: one more credited to it would be shut
    listener = Listener("tcp://127.0.0.1:0", 1 << 20, keys=(*server, allowed),
                        connection_limits={"max_per_principal": 1})
    url = listener.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    key_a, key_b = f"key:{a[0].decode()}", f"key:{b[0].decode()}"
    ctx = zmq.Context()
    clients = []
    try:
        first = _Client(ctx, url, server[0], a)
        clients.append(first)
        first.sock.send(b"A's open connection")
        _read(listener)
        assert listener.conns.counts() == (1, {key_a: 1})

        gone = _Client(ctx, url, server[0], a)  # A's second connection: sends, then closes unread
        gone.sock.send(b"A 1")
        gone.sock.send(b"A 2")
        assert listener.sock.poll(WAIT_MS, zmq.POLLIN)  # its messages wait in the worker's socket
        gone.close()
        _until(lambda: listener.conns.counts()[0] == 1)

        fresh = _Client(ctx, url, server[0], b)  # B, on the fd A's closed connection had
        clients.append(fresh)
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED in fresh.events(WAIT_MS)
        _until(lambda: listener.conns.counts()[0] == 2)

        stale = [_read(listener), _read(listener)]
        assert [body for body, _, _ in stale] == [b"A 1", b"A 2"]
        assert listener.conns.counts() == (2, {key_a: 1})  # nothing of A credited to B's connection
        assert listener.conns.refused == 0  # and B's connection not shut for A's count

        fresh.sock.send(b"B")
        body, fd, rid = _read(listener)
        assert body == b"B" and fd == stale[0][1]  # the fd was reused: the case under test
        assert listener.conns.counts() == (2, {key_a: 1, key_b: 1})
        listener.sock.send_multipart([rid, b"ok"])  # B's connection is alive and answered
        assert fresh.sock.poll(WAIT_MS, zmq.POLLIN) and fresh.sock.recv() == b"ok"
        assert zmq.EVENT_DISCONNECTED not in fresh.events(0)
    finally:
        for c in clients:
            c.close()
        ctx.term()
        listener.close()

"""A principal's data goes when its run ends (D195): its resident entries are freed once its last
connection has been closed for the grace period, and kept when it reconnects within it."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.fingerprint import fingerprint
from fusion_shim.transport import Channel
from tests.helpers.shims import READY_S

pytest.importorskip("torch")

N = 300


def _keep_call(rid: int, a: np.ndarray, ref: bool = False) -> messages.Request:
    fp = fingerprint(*wire.to_wire(a))
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", a.shape)])
    return messages.Request(header, [wire.to_wire(a)] * 2, [fp, fp], refs=(0, 1) if ref else ())


def _serve(url: str, grace_s: float):
    from fusion_shim.worker.server import Worker, serve_in_thread

    return serve_in_thread(url, worker=Worker("cpu", 64 << 20, bench_cache=True),
                           connection_limits={"grace_s": grace_s})


def _keep(url: str, a: np.ndarray) -> None:
    chan = Channel(url)
    try:
        reply = chan.request(_keep_call(1, a), time.monotonic() + READY_S)
        assert reply.header["t"] == "result" and reply.header["kept"] == [fingerprint(*wire.to_wire(a))]
    finally:
        chan.close()


def test_a_principals_entries_are_freed_once_its_last_connection_closed_for_the_grace(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    thread, stop = _serve(url, grace_s=0.3)
    try:
        _keep(url, np.random.default_rng(1).standard_normal((N, N)))
        store = thread.worker.store
        deadline = time.monotonic() + 60
        # the worker's thread frees entries and their bytes one after the other: wait for both
        while (len(store) or store.nbytes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(store) == 0 and store.nbytes == 0
    finally:
        stop.set()
        thread.join(10)


def test_a_principal_that_reconnects_within_the_grace_keeps_its_entries(sock_dir):
    url = f"ipc://{sock_dir}/w.sock"
    thread, stop = _serve(url, grace_s=600)
    a = np.random.default_rng(2).standard_normal((N, N))
    try:
        _keep(url, a)
        time.sleep(0.5)  # the worker has seen the connection close
        chan = Channel(url)
        try:
            reply = chan.request(_keep_call(2, a, ref=True), time.monotonic() + READY_S)
        finally:
            chan.close()
        assert reply.header["t"] == "result"
        np.testing.assert_allclose(reply.arrays[0], a @ a)
    finally:
        stop.set()
        thread.join(10)


def test_a_key_principals_entries_are_freed_once_its_last_connection_closed(tmp_path, monkeypatch):
    from fusion_shim import auth
    from fusion_shim.worker.command import default_keys
    from fusion_shim.worker.server import Worker, serve_in_thread
    from tests.worker.test_security import REPLY_MS, dealt, free_port

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # this test's own keys
    url = f"tcp://127.0.0.1:{free_port()}"
    thread, stop = serve_in_thread(url, worker=Worker("cpu", 64 << 20, bench_cache=True), keys=default_keys(url),
                                   connection_limits={"grace_s": 0.3})
    a = np.random.default_rng(3).standard_normal((N, N))
    try:
        server, public, secret = auth.user_curve()
        with dealt(url, server, (public, secret)) as (sock, _):
            sock.send_multipart(_keep_call(1, a).frames())
            assert sock.poll(max(REPLY_MS, 600_000)), "no answer"
            assert wire.decode(sock.recv_multipart())[0]["kept"] == [fingerprint(*wire.to_wire(a))]
        store = thread.worker.store
        deadline = time.monotonic() + 60
        while len(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(store) == 0
    finally:
        stop.set()
        thread.join(10)

"""What CURVE costs on loopback tcp (D68): median round trips of a DEALER/ROUTER echo, plain and
with CURVE, for 64 B to 64 MiB, each pair measured twice, alternately, in one run.

    python benchmarks/curve_cost.py
"""
from __future__ import annotations

import socket
import statistics
import threading
import time

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def round_trip(curve: bool, size: int, n: int) -> float:
    ctx = zmq.Context()
    srv, cli = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    auth = None
    if curve:
        spub, ssec = zmq.curve_keypair()
        cpub, csec = zmq.curve_keypair()
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        srv.curve_secretkey, srv.curve_publickey, srv.curve_server = ssec, spub, True
        cli.curve_serverkey, cli.curve_publickey, cli.curve_secretkey = spub, cpub, csec
    url = f"tcp://127.0.0.1:{_port()}"
    srv.bind(url)
    cli.connect(url)
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if srv.poll(100):
                srv.send_multipart(srv.recv_multipart(copy=False), copy=False)

    thread = threading.Thread(target=echo)
    thread.start()
    payload = b"x" * size
    cli.send_multipart([payload])
    cli.recv_multipart()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        cli.send_multipart([payload], copy=size < 65536)
        cli.recv_multipart(copy=False)
        times.append(time.perf_counter() - t)
    stop.set()
    thread.join()
    cli.close(0)
    srv.close(0)
    if auth is not None:
        auth.stop()
    ctx.term()
    return statistics.median(times)


def main() -> None:
    for size, n in [(64, 2000), (32768, 1000), (1 << 20, 100), (64 << 20, 8)]:
        for _ in range(2):
            plain, curve = round_trip(False, size, n), round_trip(True, size, n)
            rate = f"  {2 * size / curve / 1e9:.2f} GB/s vs {2 * size / plain / 1e9:.2f}" if size >= 1 << 20 else ""
            print(f"{size:>10} B  plain {plain * 1e6:9.0f} us  curve {curve * 1e6:9.0f} us  x{curve / plain:5.2f}{rate}")


if __name__ == "__main__":
    main()

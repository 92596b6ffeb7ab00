"""Link emulation for tests and benchmarks (issue 5). EMULATED: every figure measured through it is
an emulated link on one machine, and is labelled so.

A condition puts a fusion_shim worker in a network namespace of its own behind a veth pair:

    client (host namespace) --[ delaying proxy ]--> 10.201.N.1 ==veth, tbf both ways==> 10.201.N.2 worker

- rate: ``tc qdisc ... tbf`` on both ends of the veth (this kernel has tbf and htb, no netem);
- delay: a user-space TCP proxy on the host side that holds every chunk it forwards for half the
  nominal round trip, each way (threads and a monotonic clock; its own forwarding cost adds to it);
- every condition is *measured* after setup, with the runtime's own link probe (pings, one bulk
  transfer each way), and the measured figures are what results quote next to the nominal ones.

Only addresses inside namespaces this harness created (10.201.N.x on its own veth) or loopback are
ever used. Needs root and ``ip``/``tc``; :func:`available` says why not otherwise.

The worker inside the namespace is started by ``python benchmarks/linkemu.py serve URL``: a TEST
HARNESS launcher that calls ``fusion_shim.worker.serve(..., allow_network=True)``, because the worker
refuses a non-loopback address without authentication (issue 8). Never use it outside this harness.

    python benchmarks/linkemu.py measure 1g-1ms     # set up, measure, tear down, print
"""
from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PREFIX = "fs5"          # every namespace and interface this harness creates starts with it
SUBNET = "10.201"
WORKER_PORT = 5555
PROXY_BASE_PORT = 6100


@dataclass(frozen=True)
class Condition:
    name: str
    rate: str | None        # tc rate ("100mbit"), None: not shaped
    rate_bps: float | None  # bits per second, for labels
    rtt_s: float            # nominal round trip added by the proxy (0: no proxy)
    netns: bool = True      # False: plain loopback in the host namespace

    def label(self) -> str:
        if not self.netns:
            return "loopback (no emulation)"
        if not self.rtt_s:
            return f"EMULATED {self.rate}, no added delay (the veth's own round trip, nominal 0.1 ms)"
        return f"EMULATED {self.rate} + {self.rtt_s * 1e3:g} ms round trip"


CONDITIONS = {
    "loopback": Condition("loopback", None, None, 0.0, netns=False),
    "10g-0.1ms": Condition("10g-0.1ms", "10gbit", 10e9, 0.0),      # the veth's own ~0.1-0.2 ms round trip
    "1g-1ms": Condition("1g-1ms", "1gbit", 1e9, 1e-3),
    "100m-10ms": Condition("100m-10ms", "100mbit", 100e6, 10e-3),
}


def available() -> str | None:
    """None when link emulation can run here, else why not."""
    if os.geteuid() != 0:
        return "link emulation needs root (network namespaces, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"link emulation needs the '{tool}' command (iproute2)"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r


def cleanup_stale() -> None:
    """Remove namespaces and interfaces a crashed earlier run of this harness left (ours only)."""
    out = _sh("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX + "-"):
            _sh("ip", "netns", "del", name, check=False)
    out = _sh("ip", "-o", "link", "show", check=False).stdout
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            ifname = parts[1].strip().split("@")[0]
            if ifname.startswith(PREFIX + "h"):
                _sh("ip", "link", "del", ifname, check=False)


# -- the delaying proxy ---------------------------------------------------------------------------------

class DelayProxy:
    """A TCP proxy that delivers every chunk ``one_way_s`` after it arrived, in each direction."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], one_way_s: float):
        self.target, self.one_way_s = target, one_way_s
        self.server = socket.create_server(listen, reuse_port=False)
        self.server.settimeout(0.2)
        self.stopping = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, name="delay-proxy", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.server.accept()
            except (socket.timeout, OSError):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns += [client, upstream]
            self._pump(client, upstream)
            self._pump(upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        q: queue.Queue = queue.Queue()

        def reader() -> None:
            try:
                while True:
                    data = src.recv(1 << 20)
                    q.put((time.monotonic() + self.one_way_s, data))
                    if not data:
                        return
            except OSError:
                q.put((0.0, b""))

        def writer() -> None:
            try:
                while True:
                    due, data = q.get()
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    dst.sendall(data)
            except OSError:
                pass

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=writer, daemon=True).start()

    def close(self) -> None:
        self.stopping.set()
        self.server.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass


# -- a condition ------------------------------------------------------------------------------------------

class Link:
    """Set up a condition with a worker behind it; ``url`` is what clients connect to."""

    def __init__(self, cond: Condition, index: int = 1, python: str = sys.executable, device: str = "cpu",
                 worker_env: dict | None = None, server: list[str] | None = None):
        self.cond, self.index, self.python, self.device = cond, index, python, device
        self.ns = f"{PREFIX}-{cond.name.replace('.', '')}"
        self.host_if, self.ns_if = f"{PREFIX}h{index}", f"{PREFIX}n{index}"
        self.host_ip, self.ns_ip = f"{SUBNET}.{index}.1", f"{SUBNET}.{index}.2"
        self.worker_env = worker_env
        self.server = server  # a command to serve instead of the fusion_shim worker (the CI test's echo)
        self.proc: subprocess.Popen | None = None
        self.proxy: DelayProxy | None = None
        self.url = ""
        self.measured: dict = {}

    def __enter__(self) -> "Link":
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def setup(self) -> None:
        port = WORKER_PORT + self.index
        if not self.cond.netns:
            self.worker_addr = ("127.0.0.1", port)
            self._start_server(None, f"tcp://127.0.0.1:{port}")
            self.url = f"tcp://127.0.0.1:{port}"
            return
        _sh("ip", "netns", "add", self.ns)
        _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _sh("ip", "link", "set", self.ns_if, "netns", self.ns)
        _sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        _sh("ip", "link", "set", self.host_if, "up")
        _sh("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
        _sh("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
        _sh("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
        if self.cond.rate:
            # burst: at least 4 ms at the rate, and more than a 64 kB GSO segment
            burst = max(int(self.cond.rate_bps / 8 / 250), 256 * 1024)
            for prefix in ([], ["ip", "netns", "exec", self.ns]):
                dev = self.host_if if not prefix else self.ns_if
                _sh(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.cond.rate,
                    "burst", str(burst), "latency", "200ms")
        self.worker_addr = (self.ns_ip, port)
        self._start_server(self.ns, f"tcp://{self.ns_ip}:{port}")
        if self.cond.rtt_s > 0:
            pport = PROXY_BASE_PORT + self.index
            self.proxy = DelayProxy((self.host_ip, pport), self.worker_addr, self.cond.rtt_s / 2)
            self.url = f"tcp://{self.host_ip}:{pport}"
        else:
            self.url = f"tcp://{self.ns_ip}:{port}"

    def _start_server(self, ns: str | None, bind: str) -> None:
        cmd = self.server or [self.python, os.path.join(HERE, "linkemu.py"), "serve", bind, self.device]
        if ns:
            cmd = ["ip", "netns", "exec", ns, *cmd]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
        env["FUSION_SHIM"] = "0"
        env["PYTHONPATH"] = ROOT
        env.update(self.worker_env or {})
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0, curve: tuple | None = None) -> None:
        """Until the worker answers hello (it answers once warm); ``curve``: the client's keys for a
        worker served with FS_LINKEMU_KEYS."""
        sys.path.insert(0, ROOT)
        from fusion_shim import transport
        from fusion_shim.protocol import messages

        deadline = time.monotonic() + timeout
        while True:
            chan = transport.Channel(self.url, curve, alive=lambda: self.proc.poll() is None)
            try:
                header = chan.request(messages.hello(1), deadline).header
                break
            except transport.TransportError as exc:
                # the delaying proxy closes a connection it cannot pass on yet (the worker is still
                # binding): ask again until the deadline, while the worker lives
                if self.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                raise RuntimeError(f"worker behind {self.cond.name} never became ready: {exc} {err[-2000:]}") from None
            finally:
                chan.close()
        assert header["t"] == "ready", header

    def measure(self, curve: tuple | None = None) -> dict:
        """The condition as the runtime sees it: its own link probe, best of three."""
        from fusion_shim import transport
        from fusion_shim.client import linkprobe

        best = None
        ids = iter(range(100, 10**6))
        for _ in range(3):
            chan = transport.Channel(self.url, curve)
            try:
                rtt, up, down, why = linkprobe.measure(chan, lambda: next(ids), 60.0)
            finally:
                chan.close()
            if best is None or rtt < best[0]:
                best = (rtt, up or 0.0, down or 0.0)
            else:
                best = (best[0], max(best[1], up or 0.0), max(best[2], down or 0.0))
        self.measured = {"rtt_ms": best[0] * 1e3, "up_MBps": best[1] / 1e6, "down_MBps": best[2] / 1e6}
        return self.measured

    def teardown(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if self.cond.netns:
            _sh("ip", "netns", "del", self.ns, check=False)  # takes its end of the veth pair with it
            _sh("ip", "link", "del", self.host_if, check=False)


def serve_main(url: str, device: str) -> None:
    """TEST HARNESS ONLY: a worker on an address inside a namespace this harness created."""
    from fusion_shim.worker.server import Worker, serve

    keys = os.environ.get("FS_LINKEMU_KEYS")  # CURVE, for what needs an authenticated client (stages)
    allow_code = "any" if os.environ.get("FS_LINKEMU_ALLOW_CODE") == "1" else None
    # labelled: an address inside the harness's own namespace
    serve(url, Worker(device, allow_code=allow_code), keys=keys, insecure=keys is None)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        serve_main(argv[1], argv[2] if len(argv) > 2 else "cpu")
        return 0
    if len(argv) == 2 and argv[0] == "measure":
        why = available()
        if why:
            print(why, file=sys.stderr)
            return 2
        cleanup_stale()
        with Link(CONDITIONS[argv[1]]) as link:
            link.wait_ready()
            print(link.cond.label(), link.url, link.measure())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

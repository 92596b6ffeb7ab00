"""Ray clusters for the pool's tests, on this host (given 127.0.0.1; several nodes get the host's own
address from Ray, one with ONE_NODE_ON_LOOPBACK keeps 127.0.0.1, D345), each stopped by its own
process group: a token made for the test (mode 0600, never ``~/.ray``) and a head started with
``ray start --block``."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# D345: Ray turns 127.0.0.1 into this host's own address, `--node-ip-address` too,
# unless its multi-node support is off: then one node, and every process joining it, stays on loopback
ONE_NODE_ON_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
START_DEADLINE_S = 300.0  # a loaded 2-core machine starts a head in 5-60 s
WAIT_S = 600.0  # generous: the machine is shared, and a worker (re)started imports torch and warms up


def wait_for(predicate, what: str, deadline_s: float = WAIT_S):
    """``predicate()``'s first true answer, asked every 0.2 s; fails naming ``what`` after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def token_env(directory: Path) -> dict[str, str]:
    """Token authentication with a token of this test's, in a file only its user can read."""
    path = directory / "auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(directory: Path, env: dict[str, str], *options: str, num_cpus: int = 1, cwd: Path | None = None
               ) -> tuple[subprocess.Popen, str]:
    """A head node (no dashboard, ``num_cpus`` CPUs, more of ``ray start``'s ``options``, e.g. ``--num-gpus
    2``), its processes in one process group, started in ``cwd``; returns it and its address."""
    port = free_port()
    temp = directory / "ray"
    cmd = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", str(num_cpus),
           "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(temp), *options]
    with open(directory / "ray-start.log", "w") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((directory / "ray-start.log").read_text()[-3000:])
        if "Ray runtime started" in (directory / "ray-start.log").read_text():
            return proc, f"127.0.0.1:{port}"
        time.sleep(0.2)
    stop_head(proc)
    raise RuntimeError("ray start did not finish")


def stop_head(proc: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (``--block`` stops its processes on it), SIGKILL after a while."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what its children left behind
    except ProcessLookupError:
        pass


def start_node(directory: Path, env: dict[str, str], head: str, num_gpus: int) -> subprocess.Popen:
    """Another node of the cluster at ``head`` on this host (one CPU, ``num_gpus`` logical GPUs), its
    processes in one process group: a raylet of its own, as on another machine."""
    log_path = directory / f"node-{free_port()}.log"
    cmd = [RAY, "start", "--block", "--address", head, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
           "--num-gpus", str(num_gpus), "--disable-usage-stats",
           "--dashboard-agent-listen-port", str(free_port())]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log_path.read_text()[-3000:])
        if "Ray runtime started" in log_path.read_text():
            return proc
        time.sleep(0.2)
    stop_head(proc)
    raise RuntimeError("ray start (a node) did not finish")


def records(env: dict[str, str], pool: str) -> list[dict]:
    """The pool's workers recorded on this host (every one ever started here and not yet reaped)."""
    from fusion_shim.pool import host

    directory = Path(host.state_dir(env))
    found = []
    for path in sorted(directory.glob("*.json")) if directory.exists() else ():
        entry = json.loads(path.read_text())
        if entry["pool"] == pool:
            found.append(entry)
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == pid:
                out.append(int(entry))
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""

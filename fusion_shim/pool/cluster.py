"""Whether a Ray cluster may carry a pool's keys, asked before Ray is joined: it is reached as Ray will
dial it, it refuses a caller without Ray's token, and this user's token file is readable by no one
else. Whoever can call the pool's actors can give keys to them (D152), so a cluster that serves
anyone is refused unless ``--insecure`` (D210). Every answer is one line that names the fix.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from typing import Callable, Mapping

REACH_TIMEOUT_S = 3.0   # D151: the TCP check of the cluster's address
CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` writes this host's cluster address
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
PROBE_TIMEOUT_S = 8.0  # D212: the whole answer, Ray's import included, within 10 s
START = ("(umask 077 && ray get-auth-token --generate) && "
         "RAY_AUTH_MODE=token ray start --head --node-ip-address 127.0.0.1")
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def check(address: str, insecure: bool = False, env: Mapping[str, str] | None = None,
          on_spawn: Callable[[subprocess.Popen], None] | None = None, timeout: float = PROBE_TIMEOUT_S
          ) -> tuple[str | None, str | None]:
    """(why the pool must not use the cluster at ``address``, a warning to show) -- each None or one line.
    ``on_spawn``: called with the probe's process as it starts (D300: a run lowers its priority)."""
    env = os.environ if env is None else env
    why = unreachable(address)
    if why is not None:
        return f"{why}; start one: {START}", None
    found = probe(address, env, on_spawn, timeout)
    state, dialed = found.get("state"), found.get("address", address)
    if state == "unreachable":
        via = f" (Ray dials {dialed})" if dialed != address else ""
        return f"the Ray cluster at {address}{via} cannot be reached: {found.get('why')}", None
    if state == "error":
        return f"the Ray cluster at {address}: {found.get('why')}", None
    if state == "open":
        text = (f"the Ray cluster at {address} runs without token authentication: anyone who reaches it can "
                f"join the pool and run code as its user; restart it with RAY_AUTH_MODE=token (docs/pool.md)")
        return (None, text) if insecure else (f"{text}, or pass --insecure", None)
    exposed = exposed_token(env)
    if exposed is not None:
        return (None, exposed) if insecure else (exposed, None)
    return None, None


def probe(address: str, env: Mapping[str, str], on_spawn: Callable[[subprocess.Popen], None] | None = None,
          timeout: float = PROBE_TIMEOUT_S) -> dict:
    """:mod:`.probe`'s answer, from a process of its own that carries no token (D211)."""
    # no token, and no shim: FUSION_SHIM=1, inherited from a run, would install it in the probe too
    child = {k: v for k, v in env.items() if k not in AUTH_ENV and not k.startswith("FUSION_SHIM")}
    child["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.Popen([sys.executable, "-I", PROBE, address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child, stdin=subprocess.DEVNULL)
    if on_spawn is not None:
        on_spawn(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"address": address, "state": "unreachable",
                "why": f"no answer as a Ray cluster within {timeout:.0f} s"}
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"address": address, "state": "error", "why": f"the probe failed: {tail}"[:300]}


def token_file(env: Mapping[str, str]) -> str | None:
    """The file Ray reads its token from, as Ray looks for it; None where the token is in the environment."""
    return None if env.get("RAY_AUTH_TOKEN") else token_files(env)[0]


def token_files(env: Mapping[str, str]) -> list[str]:
    """Every file Ray may read a token from, in Ray's order: ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``
    (D344: a pool worker keeps them all out of its stages' sandbox)."""
    default = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".ray", "auth_token")
    return list(dict.fromkeys(p for p in (env.get("RAY_AUTH_TOKEN_PATH"), default) if p))


def exposed_token(env: Mapping[str, str]) -> str | None:
    """Why this user's Ray token is not secret (its file readable or writable by others), or None."""
    path = token_file(env)
    if path is None:
        return None
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None  # no token file: Ray refuses this client, and says so
    if mode & 0o077:
        return f"Ray's token file {path} is open to other users (mode {mode:04o}): chmod 600 {path}"
    return None


def unreachable(address: str) -> str | None:
    """D151: why ``address`` cannot be a Ray cluster's (nothing accepts a TCP connection there), or None."""
    if address == "auto":
        try:
            with open(CURRENT_CLUSTER) as f:
                address = f.read().strip()
        except OSError:
            return f"ray://auto: this host belongs to no Ray cluster ({CURRENT_CLUSTER} is missing)"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"Ray address {address!r} is not HOST:PORT"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        return f"the Ray cluster at {address} cannot be reached ({exc.strerror or exc})"
    return None

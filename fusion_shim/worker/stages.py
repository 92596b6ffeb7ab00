"""Stages on the worker (docs/stages.md): code from authenticated clients, in a process per principal.

A worker started with ``--allow-code`` hands each ``stage`` request to :class:`StageHost`, which
answers it later from a thread of its own, so the loop keeps serving calls meanwhile. Code runs only
for an authenticated principal (a CURVE key the allow-list named, or this worker's own user over
``ipc://``); ``--allow-code parent`` (the embedded worker) only for the process that started it.
Each principal's stages run in a child process (:mod:`.stagechild`): one that crashes or outlives
its deadline is killed, its call answered with an error (the client computes it), and the next
stage call starts a new one. This module never unpickles: only the child does.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..protocol import messages, wire
from ..transport.principal import Principal
from . import isolation
from .isolation import BOOT, STAGE_USER, child_env, child_path, non_dumpable, stage_ids, why_not_other_user

MAX_DEADLINE_S = 24 * 3600.0
RUNS_PER_PRINCIPAL = 4  # D190: live stage processes one principal may hold; the least recent goes first
BUSY_POLL_MS = 2  # how often the loop looks for finished stages while some run
CHILD_EXIT_S = 5.0
TMP_PREFIX = "fusion-shim-stage-"  # then the worker's pid: what its starter removes once it is gone (D187)


def _versions() -> dict[str, str]:
    """This side's versions, cloudpickle's read without importing it."""
    try:
        cp = metadata.version("cloudpickle")
    except metadata.PackageNotFoundError:
        cp = "missing"
    return {"python": ".".join(map(str, sys.version_info[:3])), "cloudpickle": cp, "numpy": np.__version__}


class StageHost:
    """``allow``: ``"any"`` (every authenticated principal) or ``"parent:PID"`` (that process only);
    ``user``: who stage code runs as where this worker is root (D189)."""

    def __init__(self, allow: str, max_bytes: int, device: str = "cpu", user: str | int | None = STAGE_USER):
        self.allow, self.max_bytes = allow, max_bytes
        self.device = device  # the worker's device type: a stage's NumPy calls go there (D307)
        self.versions = _versions()
        self.ids = stage_ids(user)
        # D189: said with every answer where stage code runs as root, with the worker's reach
        self.note = "" if self.ids is not None or os.geteuid() != 0 else \
            f"stage code ran as root, not as user {user}: {why_not_other_user() or 'no stage user'}"
        self.dumpable = not non_dumpable()  # D189: before any stage process exists
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (routing identity, reply frames)
        self.children: collections.OrderedDict[tuple, _Child] = collections.OrderedDict()
        self.running = 0
        self._lock = threading.Lock()

    def poll_ms(self, idle_ms: int) -> int:
        return BUSY_POLL_MS if self.running else idle_ms

    def take(self, frames: list, principal: Principal) -> bool:
        """Take a ``stage`` request (``frames``: its routing identity first); False for any other."""
        try:
            header = wire.decode_header(frames[1]) if len(frames) > 1 else None
        except wire.WireError:
            return False
        if header is None or header["t"] != "stage":
            return False
        ident, rid = frames[0].bytes, header["id"]
        try:
            header, arrays = wire.decode(frames[1:], max_bytes=self.max_bytes, header=header)
        except wire.WireError as exc:
            return self._reply(ident, messages.error(rid, "bad_request", "WireError", str(exc)))
        why = self.refusal(header, principal, frames[0])
        if why is not None:
            return self._reply(ident, messages.error(rid, "refused", "CodeRefused", why))
        if not arrays or isinstance(arrays[0], wire.Ref) or arrays[0].dtype != np.uint8 or arrays[0].ndim != 1:
            return self._reply(ident, messages.error(rid, "bad_request", "WireError", "a stage's payload is |u1"))
        run = header.get("run")
        key = (principal.name, run if isinstance(run, str) and len(run) <= 64 else ident.hex())
        with self._lock:  # D190: a process per run, so a run sees its modules as they are now
            child = self.children.pop(key, None) or _Child(self)
            self.children[key] = child
            theirs = [k for k in self.children if k[0] == principal.name]
            for old in theirs[:-RUNS_PER_PRINCIPAL]:
                self.children.pop(old).jobs.put(None)
            self.running += 1
        child.jobs.put((ident, rid, header, arrays))
        return True

    def refusal(self, header: dict, principal: Principal, frame: Any) -> str | None:
        """Why this principal may not run code here, or None."""
        if principal.name.startswith("key:"):
            pass
        elif principal.uid is None:
            return "an unauthenticated connection: code runs only for a CURVE key on the allow-list or this user over ipc://"
        elif principal.uid != os.getuid():
            return f"uid {principal.uid} is not this worker's user: over ipc:// only the same user may run code"
        if self.allow.startswith("parent:") and _peer_pid(frame) != int(self.allow[7:]):
            return "this embedded worker runs code only for the program that started it"
        theirs = header.get("versions")
        if not isinstance(theirs, dict) or any(theirs.get(k) != v for k, v in self.versions.items()):
            return f"versions differ: the client has {theirs}, this worker {self.versions}"
        return None

    def _reply(self, ident: bytes, reply: messages.Reply) -> bool:
        self.done.put((ident, reply.frames()))
        return True

    def finished(self, ident: bytes, reply: messages.Reply) -> None:
        with self._lock:
            self.running -= 1
        self._reply(ident, reply)

    def replies(self) -> list:
        """The stage answers ready to send: (routing identity, frames)."""
        out = []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        for child in list(self.children.values()):
            child.jobs.put(None)
            child.kill()

    def abandon(self) -> None:
        """From a signal handler, as this process dies: each stage process killed and its directory
        removed, taking no lock (the interrupted thread may hold one)."""
        for child in list(self.children.values()):
            proc, tmp = child.proc, child.tmp
            if proc is not None:
                proc.kill()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)


def _peer_pid(frame: Any) -> int | None:
    try:
        parts = str(frame.get(b"Peer-Address") or "").rsplit(":", 3)
    except Exception:  # not a socket's frame (a test's bytes): no peer to name
        return None
    return int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None


class _Child:
    """One principal's stage process and the thread that feeds it, one job at a time."""

    def __init__(self, host: StageHost):
        self.host = host
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.tmp: str | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._loop, name="fusion-shim-stages", daemon=True).start()

    def _start(self) -> None:
        ids = self.host.ids
        self.tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")  # D214: the only place a stage may write
        if ids is not None:
            os.chown(self.tmp, *ids)
        env = {**child_env(ids), "TMPDIR": self.tmp}
        spec = isolation.sandbox_spec(self.tmp)
        ours, theirs = socket.socketpair()
        drop = {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": [], "cwd": "/"}
        try:  # D189: isolated (-I), only the socket inherited, as an unprivileged user where we are root
            self.proc = subprocess.Popen([sys.executable, "-I", "-c", BOOT, json.dumps(child_path()),
                                          isolation.__file__, json.dumps(spec), str(theirs.fileno()),
                                          self.host.device],
                                         pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, **drop)
        except OSError as exc:
            ours.close()
            who = "" if ids is None else f" as uid {ids[0]} (its Python and this package must be readable to it)"
            raise OSError(f"the stage process did not start{who}: {type(exc).__name__}: {exc}") from None
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())

    def kill(self) -> None:
        with self.lock:  # the worker's close and a retiring thread may both get here
            proc, conn, tmp, self.proc, self.conn, self.tmp = self.proc, self.conn, self.tmp, None, None, None
        if proc is not None:
            proc.kill()
            proc.wait(CHILD_EXIT_S)
        if conn is not None:
            conn.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                self.kill()
                return
            ident, rid, header, arrays = job
            try:
                reply = self._run(rid, header, arrays)
            except Exception as exc:  # the boundary: the call fails, the worker stays
                self.kill()
                reply = messages.error(rid, "kernel_error", type(exc).__name__, str(exc)[:500])
            self.host.finished(ident, reply)

    def _run(self, rid: int, header: dict, arrays: list) -> messages.Reply:
        deadline_s = header.get("deadline_s")
        deadline_s = min(float(deadline_s), MAX_DEADLINE_S) if isinstance(deadline_s, (int, float)) else 60.0
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            self._start()
        conn = self.conn
        t = time.perf_counter()
        try:
            messages.send_stage_job(conn, header.get("fn"), header["arrays"][1:], arrays[0], arrays[1:])
            if not conn.poll(max(deadline_s - (time.perf_counter() - t), 0.0)):
                self.kill()
                return messages.error(rid, "kernel_error", "StageTimeout", f"the stage ran past its {deadline_s:g} s")
            answer, value, out = messages.recv_stage_answer(conn, self.host.max_bytes)
        except (EOFError, OSError, wire.WireError) as exc:  # an answer over its bounds is a crash too
            code = self.proc.poll() if self.proc is not None else None
            self.kill()
            return messages.error(rid, "kernel_error", "StageCrashed",
                                  f"the stage's process died (exit {code}): {type(exc).__name__}")
        if "missing" in answer:
            return messages.error(rid, "missing", "KeyError", "stage inputs not held here", missing=answer["missing"])
        if "code_missing" in answer:
            return messages.error(rid, "code_missing", "ImportError", answer["code_missing"])
        nres = answer["nres"]
        return messages.stage_result(rid, np.frombuffer(value, np.uint8), out[:nres], answer["changed"],
                                     out[nres:], answer["raised"], {"stage": answer["stage_s"]},
                                     "; ".join(n for n in (str(answer.get("note") or ""), self.host.note) if n))


def remove_leftovers(worker_pid: int) -> None:
    """D187: the stage directories of a worker that is gone (a SIGKILL runs no handler)."""
    import glob

    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{TMP_PREFIX}{worker_pid}-*")):
        shutil.rmtree(path, ignore_errors=True)

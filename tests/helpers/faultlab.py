"""Fault injection for the client (issue 8): a worker that is killed, stopped or drops replies at
random points of every call phase, and a harness that keeps one running.

SIMULATED: the worker here is the real server loop (:func:`fusion_shim.worker.server.serve`, the
real wire, validation and dispatcher) with NumPy kernels in place of torch, so that a replacement
starts in ~0.2 s instead of ~3 s and hundreds of kills fit in a CI minute. The client is the real
shim (policy remote, an external worker over ``ipc://``).

Worker side (this file run as a script): before each ``call`` the worker draws, with probability
``--rate``, one injection: a phase and an action.

=============  ======================================================================
phase          where
=============  ======================================================================
on_receive     the request is read, nothing decoded or computed yet
in_kernel      inside the kernel, mid-computation
before_reply   the result is computed and encoded, nothing sent
mid_reply      the routing frame and header are queued, the buffers not yet
after_reply    the whole reply is queued for the socket (it may or may not get out)
=============  ======================================================================

Actions: ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself; the harness resumes it, or kills it,
after a random pause) and ``drop`` (the reply is never sent; phases before the reply only). Each
injection is written to ``--log`` before it happens. The harness adds its own: SIGKILL or SIGSTOP
at random moments, whatever the worker is doing (idle, reading a request, answering a probe).

Harness side (:class:`FaultLab`): a *zygote* process that has imported everything forks a fresh
worker the moment the serving one dies (it takes over the address within milliseconds), and a
thread watches the worker: it resumes a stopped one after a random pause (or kills it), and sends
its own SIGKILL/SIGSTOP at random moments while the client's link is up (``armed``).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

PHASES = ("on_receive", "in_kernel", "before_reply", "mid_reply", "after_reply")
ACTIONS = {"on_receive": ("kill", "stop", "drop"), "in_kernel": ("kill", "stop", "drop"),
           "before_reply": ("kill", "stop", "drop"), "mid_reply": ("kill", "stop"),
           "after_reply": ("kill", "stop")}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# -- the worker -------------------------------------------------------------------------------------

def numpy_worker(max_bytes: int | None = None) -> Any:
    """A real :class:`Worker` (server loop, wire, validation) with NumPy kernels. SIMULATED device."""
    import numpy as np

    from fusion_shim.worker.server import MAX_MESSAGE_BYTES
    from fusion_shim.worker.testing import FaultyWorker

    def raw(fn: Any) -> Any:
        # a worker thread inside a process running the shim must not call into the shim itself
        return getattr(fn, "__wrapped__", fn)

    kernels = {
        "matmul": lambda t, p: [raw(np.matmul)(t[0], t[1])],
        "dot": lambda t, p: [raw(np.dot)(t[0], t[1])],
        "linalg.solve": lambda t, p: [raw(np.linalg.solve)(t[0], t[1])],
        "linalg.inv": lambda t, p: [raw(np.linalg.inv)(t[0])],
        "fft.fft1": lambda t, p: [raw(getattr(np.fft, p["kind"]))(t[0], n=p["n"], axis=p["axis"], norm=p["norm"])],
    }

    class NumpyBackend:
        device = "cpu (NumPy test backend)"

        def warm(self) -> dict:
            return {}

        def run(self, kernel: Any, arrays: list, params: dict, layouts: list) -> tuple[list, dict]:
            cd = np.dtype(params["cdtype"])
            t = time.perf_counter()
            out = kernel([a.astype(cd, copy=False) for a in arrays], params)
            out = [np.asfortranarray(r) if lay == "F" else np.ascontiguousarray(r) for r, lay in zip(out, layouts)]
            return out, {"h2d": 0.0, "kernel": time.perf_counter() - t, "d2h": 0.0}

    # a testing worker (delay 0, honest) so that a test may hold its calls (``worker.delay``)
    return FaultyWorker(backend=NumpyBackend(), kernels=kernels, max_bytes=max_bytes or MAX_MESSAGE_BYTES)


class _Injector:
    def __init__(self, rate: float, seed: int, log: str | None):
        self.rng = random.Random(seed)
        self.rate = rate
        self.log = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if log else None
        self.plan: tuple[str, str] | None = None
        self.suppress = False  # a drop fired: the reply to this request is never sent

    def choose(self, frames: list) -> None:
        import msgpack

        self.plan, self.suppress = None, False
        try:
            header = msgpack.unpackb(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0])
            is_call = isinstance(header, dict) and header.get("t") == "call"
        except Exception:
            is_call = False
        if is_call and self.rng.random() < self.rate:
            phase = self.rng.choice(PHASES)
            self.plan = (phase, self.rng.choice(ACTIONS[phase]))

    def at(self, phase: str) -> None:
        """Fire the planned injection if it is for ``phase``."""
        if self.plan is None or self.plan[0] != phase:
            return
        action = self.plan[1]
        self.plan = None
        if self.log is not None:
            os.write(self.log, f"{os.getpid()} {phase} {action}\n".encode())
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # the harness resumes or kills it
        else:
            self.suppress = True


def run_worker(bind: str, rate: float, seed: int, log: str | None, delay: float = 0.0,
               crash_op: str | None = None) -> None:
    """Serve at ``bind`` with injections; never returns normally (the loop ends with the parent).
    ``delay``: every kernel sleeps this long first; ``crash_op``: that kernel kills the worker."""
    import zmq

    from fusion_shim.worker import inbox, server

    worker = numpy_worker()
    inj = _Injector(rate, seed, log)
    for kid, kernel in list(worker.kernels.items()):
        def wrapped(t: list, p: dict, kernel: Any = kernel, kid: str = kid) -> list:
            inj.at("in_kernel")
            if kid == crash_op:
                if log:
                    with open(log + ".crashes", "a") as f:
                        f.write(f"{kid} {t[0].dtype.str}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            if delay:
                time.sleep(delay)
            return kernel(t, p)
        worker.kernels[kid] = wrapped
    real_send, real_send_tracked = inbox.send_frames, inbox.send_tracked

    def inject(sock: Any, frames: Any, prefix: Any, real: Any) -> Any:
        """Send a reply through ``real`` with the planned reply-phase injection; None if it was dropped
        or sent here by hand."""
        inj.at("before_reply")
        if inj.suppress:
            inj.suppress = False
            return None
        if inj.plan is not None and inj.plan[0] == "mid_reply" and len(frames) > 1:
            for part in [*prefix, frames[0]]:
                sock.send(part, zmq.SNDMORE)
            inj.at("mid_reply")  # a stopped worker resumed finishes the message, late
            rest = list(frames[1:])
            for i, part in enumerate(rest):
                sock.send(part, zmq.SNDMORE if i < len(rest) - 1 else 0)
            return None
        if inj.plan is not None and inj.plan[0] == "mid_reply":
            inj.plan = ("after_reply", inj.plan[1])  # a header-only reply has no middle
        sent = real(sock, frames, prefix)
        inj.at("after_reply")
        return sent

    def nbytes(frames: Any) -> int:
        return sum(f.nbytes if hasattr(f, "nbytes") else len(f) for f in frames)

    def send(sock: Any, frames: Any, prefix: Any = ()) -> int:
        sent = inject(sock, frames, prefix, real_send)
        return nbytes(frames) if sent is None else sent

    def send_tracked(sock: Any, frames: Any, prefix: Any = ()) -> tuple:
        sent = inject(sock, frames, prefix, real_send_tracked)
        return (nbytes(frames), []) if sent is None else sent

    # the socket's owner looks both up at each reply: untracked replies and a principal's tracked ones
    inbox.send_frames, inbox.send_tracked = send, send_tracked

    def on_request(frames: list) -> None:
        inj.choose(frames)
        inj.at("on_receive")

    server.serve(bind, worker, parent_pid=os.getppid(), on_request=on_request)


def zygote_main(bind: str, rate: float, log: str, delay: float = 0.0, crash_op: str | None = None) -> None:
    """Import everything once, then fork a fresh worker per ``fork SEED`` line on stdin (its pid
    goes to stdout): a replacement serves within milliseconds. No ZeroMQ context exists before the
    fork (the worker's is made in the child). EOF on stdin: exit, and the workers follow."""
    import numpy  # noqa: F401
    import zmq  # noqa: F401

    from fusion_shim.worker import server  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # dead workers are reaped by the kernel
    for line in sys.stdin:
        cmd, seed = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)  # signals for the worker are not the zygote's
                sys.stdin.close()
                run_worker(bind, rate, int(seed), log, delay, crash_op)
            finally:
                os._exit(0)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()


# -- the harness --------------------------------------------------------------------------------------

def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


class FaultLab:
    """Keeps a fault-injecting worker serving at ``url``; counts every injection."""

    def __init__(self, directory: str, rate: float = 0.0, seed: int = 0, async_every_s: float | None = None,
                 resume_after: tuple[float, float] | None = (0.02, 0.25), kill_stopped: float = 0.3,
                 delay: float = 0.0, crash_op: str | None = None):
        """``resume_after`` None: a stopped worker stays stopped (the test resumes it)."""
        self.dir = directory
        self.url = f"ipc://{directory}/lab.sock"
        self.log = os.path.join(directory, "injections.log")
        self.rng = random.Random(seed)
        self.seed = seed
        self.async_every_s = async_every_s
        self.resume_after = resume_after
        self.kill_stopped = kill_stopped
        # the harness's own signals come only while this says the client is using the worker
        # (set by the test: the link is ready), so that they land in calls, not in outages
        self.armed = lambda: True
        self.async_injections: dict[str, int] = {"async_kill": 0, "async_stop": 0}
        self.spawned = 0
        self.pids: list[int] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
        env.update(FUSION_SHIM="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        errlog = open(os.path.join(directory, "workers.err"), "ab")
        self.zygote = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--bind", self.url, "--rate", str(rate), "--log", self.log,
             "--delay", str(delay), *(["--crash-op", crash_op] if crash_op else [])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog)
        errlog.close()
        self._stop = threading.Event()
        self.current = self._fork()
        self._thread = threading.Thread(target=self._watch, name="faultlab", daemon=True)
        self._thread.start()

    def _fork(self) -> int:
        self.spawned += 1
        self.zygote.stdin.write(f"fork {self.seed * 100003 + self.spawned}\n".encode())
        self.zygote.stdin.flush()
        pid = int(self.zygote.stdout.readline())
        self.pids.append(pid)
        return pid

    def _watch(self) -> None:
        resume_at: float | None = None
        next_async = self._next_async()
        while not self._stop.is_set():
            pid = self.current
            now = time.monotonic()
            state = _state(pid)
            if state in ("X", "Z"):
                self.current = self._fork()
                resume_at = None
                next_async = self._next_async()  # the clock starts again with each worker
                continue
            if state == "T":
                if self.resume_after is None:
                    pass
                elif resume_at is None:
                    resume_at = now + self.rng.uniform(*self.resume_after)
                elif now >= resume_at:
                    _signal(pid, signal.SIGKILL if self.rng.random() < self.kill_stopped else signal.SIGCONT)
                    resume_at = None
            elif next_async is not None and now >= next_async and self.armed():
                if self.rng.random() < 0.5:
                    self.async_injections["async_kill"] += 1
                    _signal(pid, signal.SIGKILL)
                else:
                    self.async_injections["async_stop"] += 1
                    _signal(pid, signal.SIGSTOP)
                next_async = self._next_async()
            time.sleep(0.003)

    def _next_async(self) -> float | None:
        if not self.async_every_s:
            return None
        return time.monotonic() + self.rng.expovariate(1 / self.async_every_s)

    def crashes(self) -> list[str]:
        try:
            with open(self.log + ".crashes") as f:
                return f.read().split("\n")[:-1]
        except FileNotFoundError:
            return []

    def injections(self) -> dict[str, int]:
        counts: dict[str, int] = dict(self.async_injections)
        try:
            with open(self.log) as f:
                for line in f:
                    _, phase, action = line.split()
                    counts[f"{phase}:{action}"] = counts.get(f"{phase}:{action}", 0) + 1
        except FileNotFoundError:
            pass
        return counts

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.zygote.stdin.close()
        self.zygote.kill()
        self.zygote.wait(10)
        for pid in self.pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass


# -- the client under faults ---------------------------------------------------------------------------

def make_cases(n: int, seed: int) -> list[tuple]:
    """(kind, inputs, expected) computed before the shim is installed. Shapes stay small: the point
    is what the faults do to the call, not the kernels. Operands differ call to call, so an answer
    delivered to the wrong call cannot pass."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        kind = ("matmul", "matmul_out", "matmul_inplace", "dot", "solve", "inv", "fft")[i % 7]
        k = int(rng.integers(8, 40))
        a = rng.standard_normal((k, k)) + k * np.eye(k)
        b = rng.standard_normal((k, k))
        if kind in ("matmul", "matmul_out"):
            cases.append((kind, (a, b), np.matmul(a, b)))
        elif kind == "matmul_inplace":
            # out= aliases the first operand: a result applied twice would not pass (issue 8)
            cases.append((kind, (a, b), np.matmul(a, b)))
        elif kind == "dot":
            cases.append((kind, (a, b[:, 0].copy()), np.dot(a, b[:, 0])))
        elif kind == "solve":
            cases.append((kind, (a, b), np.linalg.solve(a, b)))
        elif kind == "inv":
            cases.append((kind, (a,), np.linalg.inv(a)))
        else:
            x = rng.standard_normal(4 * k)
            cases.append((kind, (x,), np.fft.fft(x)))
    return cases


def run_case(kind: str, inputs: tuple) -> np.ndarray:
    if kind == "matmul":
        return np.matmul(*inputs)
    if kind == "matmul_out":
        out = np.empty_like(inputs[0])
        got = np.matmul(*inputs, out=out)
        assert got is out
        return out
    if kind == "matmul_inplace":
        a = inputs[0].copy()
        got = np.matmul(a, inputs[1], out=a)
        assert got is a
        return a
    if kind == "dot":
        return np.dot(*inputs)
    if kind == "solve":
        return np.linalg.solve(*inputs)
    if kind == "inv":
        return np.linalg.inv(*inputs)
    return np.fft.fft(*inputs)


def events(rt: Any) -> str:
    return "\n".join(text for _, text in rt.ledger.events)


def _signal(pid: int, sig: int) -> None:
    """A worker may exit by itself (an injected kill) between the watcher's look and its signal."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def fault_run(directory: str, n_calls: int, *, seed: int, rate: float, timeout: float,
              async_every_s: float | None, time_budget_s: float, min_injections: int,
              pace_s: float = 0.0002) -> dict:
    """Run calls against a FaultLab worker until ``n_calls`` are done and ``min_injections`` happened
    (or the time budget runs out); returns the figures."""
    import fusion_shim
    from fusion_shim.client import link as client_link

    from .shims import READY_S

    reprobe_max_s = client_link.REPROBE_MAX_S
    client_link.REPROBE_MAX_S = 0.1  # TEST SETTING: a faulted worker is asked again within 0.1 s
    cases = make_cases(n_calls, seed)  # before the shim: the expected answers are NumPy's own
    lab = FaultLab(directory, rate=rate, seed=seed, async_every_s=async_every_s)
    try:
        rt = fusion_shim.install(policy="remote", worker=lab.url, quiet=True, timeout=timeout, ready_timeout=1.0)
        # TEST SETTING: the random kills here are not the op's fault; CRASH_LIMIT is tested on its own
        rt.checks.crash_limit = 10**9
        lab.armed = rt.link.ready.is_set
        assert rt.link.wait_ready(READY_S), events(rt)
        wrong, raised, times, done, slow = [], [], [], 0, []
        started = time.monotonic()
        i = 0
        injected = 0
        while True:
            if i % 25 == 0:
                injected = sum(lab.injections().values())
            if (i >= n_calls and injected >= min_injections) or time.monotonic() - started > time_budget_s:
                break
            kind, inputs, want = cases[i % len(cases)]
            t = time.monotonic()
            try:
                got = run_case(kind, inputs)
            except Exception as exc:  # none may reach the program
                raised.append(f"{kind}: {type(exc).__name__}: {exc}")
                got = None
            times.append(time.monotonic() - t)
            if times[-1] > timeout + 0.05 and rt.ledger.records and len(slow) < 10:
                r = rt.ledger.records[-1]
                slow.append((round(times[-1], 3), r.kind, r.reason[:60], {k: round(v, 3) for k, v in r.phases.items()}))
            if got is not None and not np.allclose(got, want, rtol=1e-10, atol=1e-10):
                wrong.append((i, kind))
            i += 1
            done += 1
            time.sleep(pace_s)  # a program computes between calls; a busy loop would starve the lab
        kinds: dict[str, int] = {}
        reasons: dict[str, int] = {}
        for agg in rt.ledger.snapshot()["ops"].values():
            for kind in ("worker", "fallback", "local", "unsupported"):
                kinds[kind] = kinds.get(kind, 0) + agg[kind]
            for text, n in agg["reasons"].items():
                key = text.split(":")[1].strip()
                reasons[key] = reasons.get(key, 0) + n
        times.sort()
        return {"calls": done, "wrong": wrong, "raised": raised, "slowest_s": times[-1],
                "p99_s": times[int(len(times) * 0.99)], "median_s": times[len(times) // 2],
                "injections": lab.injections(), "injected": sum(lab.injections().values()),
                "workers_started": lab.spawned, "kinds": kinds, "fallback_reasons": reasons,
                "wall_s": time.monotonic() - started, "timeout": timeout,
                "events_tail": [e for _, e in rt.ledger.events[-12:]],
                "open_fds": len(os.listdir("/proc/self/fd")), "slow_calls": slow}
    finally:
        fusion_shim.uninstall()
        lab.close()
        client_link.REPROBE_MAX_S = reprobe_max_s


def _main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--log", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--crash-op", default=None)
    opts = parser.parse_args(argv)
    zygote_main(opts.bind, opts.rate, opts.log, opts.delay, opts.crash_op)


if __name__ == "__main__":  # the zygote; PYTHONPATH names the repository
    _main(sys.argv[1:])

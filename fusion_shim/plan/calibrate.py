"""Local calibration: short NumPy probes per (family, dtype), cached per host and build.

A probe set is run on first use of a (family, dtype), in a background thread the runtime starts (never
on the program's critical path): a few sizes of the family's representative op (matmul, solve,
fft/rfft), best of three timed runs after one warm-up, some tens of milliseconds per dtype. The
points become the local RateModel's curve for that family and dtype.

A probe must not share the CPUs with anything (D99): beside the program's own BLAS calls, or a
worker on the same host, it measures them, not the host, and it slows the program down. So a timed
run starts only when the rest of this process has been idle for a moment (its other threads' CPU
time over a few milliseconds, ``BUSY_SHARE``), and counts only when the probing thread was on a CPU
for most of it (its CPU time over its wall time, ``CLEAN_CPU_SHARE``: another process). Otherwise it
waits and tries again; a point with no clean run in ``ATTEMPTS`` makes the whole probe
:class:`Contended`: nothing is cached, and the program's own calls teach the model instead.

The cache lives in ``$XDG_CACHE_HOME/fusion_shim`` (``~/.cache/fusion_shim`` by default), one file
per *build key*: host name, CPU model, the CPUs this process may run on, NumPy's version and BLAS,
and the BLAS thread settings. A process pinned to one core with one BLAS thread gets its own file.
An entry older than ``MAX_AGE_S`` is stale and is measured again on first use; an entry whose local
model had to be reset (plan.model's StarPU rule) is dropped so that the next run measures afresh.

NumPy only: no zmq, no torch.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import tempfile
import threading
import time
from typing import Callable

import numpy as np

from ..cachedir import cache_dir

MAX_AGE_S = 7 * 24 * 3600
VERSION = 1
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# sizes per family: square n for products and linalg, length for fft; complex products do 4x the
# work per element, so they stop one size earlier
FLOAT_DTYPES = ("f4", "f8", "c8", "c16")
SIZES = {"products": (64, 192, 512), "linalg": (64, 192, 448), "fft": (1 << 10, 1 << 14, 1 << 18)}
CLEAN_CPU_SHARE = 0.8      # D99: a timed run is clean when the probing thread ran this share of its wall time
BUSY_SHARE = 0.25          # this process's other threads busier than this (CPUs' worth): the program is computing
BUSY_WINDOW_S = 0.005      # ... over this long, just before a timed run
ATTEMPTS = 8               # tries per point, at most, to get ``repeat`` clean timed runs
CONTENDED_PAUSE_S = 0.05   # after a busy check or an unclean run: let whatever holds the CPUs finish


def build_key() -> dict:
    """What local speed depends on; a different value means a different cache file."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = list(range(os.cpu_count() or 1))
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # an older NumPy or an unusual build: the version alone then
        blas = "?"
    cpu = platform.machine()  # (platform.processor() runs a subprocess: too slow for a start-up path)
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cpus": cpus, "numpy": np.__version__, "blas": blas,
            "threads": {v: os.environ.get(v) for v in THREAD_VARS if os.environ.get(v)}}


def cache_path(key: dict, directory: str | None = None) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(directory or cache_dir(), f"local-{digest}.json")


class Cache:
    """Calibration points per "family/dtype", read once and written back as entries are measured."""

    def __init__(self, path: str, key: dict, now: Callable[[], float] = time.time):
        self.path, self.key, self.now = path, key, now
        self.entries: dict[str, dict] = {}
        try:
            with open(path) as f:
                data = json.load(f)
            if data.get("version") == VERSION and data.get("key") == key:
                self.entries = {k: v for k, v in data.get("entries", {}).items()
                                if isinstance(v, dict) and isinstance(v.get("points"), list)}
        except (OSError, ValueError):
            pass  # no cache yet, or unreadable: measure

    def get(self, family: str, dtype: str) -> list[tuple[float, float]] | None:
        """The points, or None when absent or stale."""
        e = self.entries.get(f"{family}/{dtype}")
        if e is None or self.now() - float(e.get("created", 0)) > MAX_AGE_S:
            return None
        return [(float(f), float(s)) for f, s in e["points"]]

    def put(self, family: str, dtype: str, points: list[tuple[float, float]]) -> None:
        self.entries[f"{family}/{dtype}"] = {"created": self.now(), "points": [list(p) for p in points]}
        self._write()

    def drop(self, family: str, dtype: str) -> None:
        if self.entries.pop(f"{family}/{dtype}", None) is not None:
            self._write()

    def _write(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".local-", dir=os.path.dirname(self.path))
            with os.fdopen(fd, "w") as f:
                json.dump({"version": VERSION, "key": self.key, "entries": self.entries}, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only home: calibrate again next run, nothing worse


class Contended(RuntimeError):
    """No clean timed run of a probe point: the CPUs were busy with something else throughout."""

    def __init__(self, what: str, share: float | None):
        why = ("the program was computing throughout, here or on a worker sharing these CPUs" if share is None else
               f"another process was using the CPUs: the probing thread got at most {share:.0%} of its wall time")
        super().__init__(f"{what}: no clean timed run in {ATTEMPTS} tries ({why})")
        self.share = share


def probe(family: str, dtype: str, others: Callable[[], float] | None = None) -> list[tuple[float, float]]:
    """(flops, seconds) at a few sizes for the family's representative op in ``dtype``; raises
    :class:`Contended` when a size never got a clean timed run. ``others``: as :func:`best_time`'s."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    cf = 4 if dt.kind == "c" else 1
    points = []
    sizes = SIZES[family][:-1] if (cf == 4 and family != "fft") else SIZES[family]
    for n in sizes:
        if family == "products":
            a = _random(rng, (n, n), dt)
            fn, flops = (lambda: np.matmul(a, a)), 2.0 * n**3 * cf
        elif family == "linalg":
            a = _random(rng, (n, n), dt) + n * np.eye(n, dtype=dt)
            fn, flops = (lambda: np.linalg.solve(a, a)), (2 / 3 * n**3 + 2.0 * n**3) * cf
        else:
            x = _random(rng, (n,), dt)
            f = np.fft.fft if dt.kind == "c" else np.fft.rfft
            fn, flops = (lambda: f(x)), 5.0 * n * math.log2(n) / (1 if dt.kind == "c" else 2)
        try:
            points.append((flops, best_time(fn, others=others)))
        except Contended as exc:
            raise Contended(f"{family} {dtype} at n={n}", exc.share) from None
    return points


# Held while a probe computes. D100: a fork waits for it, at most FORK_WAIT_S (OpenBLAS forked
# mid-call in another thread leaves the child's BLAS waiting on threads that are not there).
_computing = threading.Lock()
_held_for_fork = False
FORK_WAIT_S = 5.0


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _computing.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    if _held_for_fork:
        _computing.release()


def _fresh_lock_after_fork() -> None:
    global _computing
    _computing = threading.Lock()  # the child has no probe running: whatever the parent held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_fresh_lock_after_fork)


def best_time(fn: Callable[[], object], repeat: int = 3, clock: Callable[[], tuple[float, float]] | None = None,
              pause: Callable[[float], None] = time.sleep, others: Callable[[], float] | None = None) -> float:
    """The best of ``repeat`` clean timed runs after one warm-up (see the module's docstring); raises
    :class:`Contended` when ATTEMPTS tries gave none. ``clock`` returns (wall, this thread's CPU)
    seconds, ``others`` the CPUs' worth this process's other threads are using (tests pass fakes)."""
    clock = clock or (lambda: (time.perf_counter(), time.thread_time()))
    others = others or others_busy
    warm = False
    best, clean, share_seen = math.inf, 0, None
    for _ in range(ATTEMPTS):
        if others() > BUSY_SHARE:  # the program is computing: never beside it
            pause(CONTENDED_PAUSE_S)
            continue
        with _computing:
            if not warm:
                fn()  # warm: first-touch pages, BLAS thread start-up
                warm = True
            w0, c0 = clock()
            fn()
            w1, c1 = clock()
        wall = w1 - w0
        share = (c1 - c0) / wall if wall > 0 else 1.0
        share_seen = share if share_seen is None else max(share_seen, share)
        if share >= CLEAN_CPU_SHARE:
            best, clean = min(best, wall), clean + 1
            if clean >= repeat:
                break
        else:
            pause(CONTENDED_PAUSE_S)
    if not clean:
        raise Contended("probe", share_seen)
    return best


def others_busy(window: float = BUSY_WINDOW_S) -> float:
    """CPUs' worth of time this process's other threads used over ``window`` (BLAS's helper threads
    still spinning after a call count: they would compete too)."""
    p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    time.sleep(window)
    p1, t1, w1 = time.process_time(), time.thread_time(), time.perf_counter()
    return max((p1 - p0) - (t1 - t0), 0.0) / max(w1 - w0, 1e-9)


def _random(rng: np.random.Generator, shape: tuple, dt: np.dtype) -> np.ndarray:
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)

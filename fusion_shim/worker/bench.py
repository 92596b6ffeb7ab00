"""The worker's self-benchmark, taken while it warms: per family and dtype, (flops, seconds) of the
planner's probe ops at two or three sizes, and each decomposition through its own kernel once. The
``ready`` reply carries it; the client's planner prices the worker off it until calls correct it."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import socket
import tempfile
import time
from typing import Any, Callable

import torch

from ..cachedir import cache_dir
from ..transport.shm_common import boot_id
from .kernels import KERNELS


# D50: a CPU worker's benchmark taken beside other processes is taken again (their load is not its rate)
BENCH_OTHERS_MAX = 0.15
BENCH_ATTEMPTS = 3
BENCH_PAUSE_S = 1.0
# D58: a worker reuses the benchmark its host took last, on this boot, of the same device and build
CACHE_VERSION = 1
CACHE_CLEAN_S = 24 * 3600   # a benchmark that ran clean
CACHE_CONTENDED_S = 600     # one that never did: taken again sooner, in case the CPUs are free now


def cpu_sample() -> tuple[float, float, float, int] | None:
    """(monotonic seconds, CPU-seconds spent busy on the CPUs this process may run on by every
    process, this process's CPU-seconds, how many CPUs), or None where /proc/stat is missing."""
    try:
        cpus = os.sched_getaffinity(0)
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(v) - v[3] - (v[4] if len(v) > 4 else 0)
    own = os.times()
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, len(cpus)


def others_share(before: tuple | None, after: tuple | None) -> float | None:
    """The share of this process's CPUs that other processes kept busy between two :func:`cpu_sample`
    (0: none, 1: all of them, all the time)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return min(max(others / ((after[0] - before[0]) * after[3]), 0.0), 1.0)


def bench_until_clean(measure: Callable[[], tuple[dict, dict, dict]], sample: Callable[[], Any],
                      attempts: int = BENCH_ATTEMPTS, pause: Callable[[float], None] = time.sleep,
                      ) -> tuple[dict, dict, dict, dict]:
    """``measure()`` -> (points, ops, failed), taken again while other processes used more than
    BENCH_OTHERS_MAX of the CPUs (``sample``: :func:`cpu_sample`, or one that returns None where the
    load cannot be read: one try).
    Returns each point's best time over the attempts, the ops no try could time, and what the hello
    says of the load: {"others_busy": [share per attempt], "contended": True if none was clean}."""
    points: dict = {}
    ops: dict = {}
    failed: dict = {}
    load: dict = {}
    busy: list[float] = []
    for attempt in range(max(attempts, 1)):
        start = sample()
        got_points, got_ops, got_failed = measure()
        share = others_share(start, sample())
        points, ops = _fastest(points, got_points), _fastest(ops, got_ops)
        failed = {**failed, **got_failed}
        if share is None:
            break
        busy.append(round(share, 3))
        load = {"others_busy": busy}
        if share <= BENCH_OTHERS_MAX:
            break
        if attempt + 1 < attempts:
            pause(BENCH_PAUSE_S)
    else:
        load["contended"] = True
    # an op timed in any try is not reported as failed
    failed = {op: why for op, why in failed.items() if f"{op}/f8" not in ops}
    return points, ops, failed, load


def _fastest(a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    """Per key, each [flops, seconds] point with the smaller time of the two (the same sizes)."""
    out = dict(a)
    for key, pts in b.items():
        mine = a.get(key)
        if mine is None or len(mine) != len(pts):
            out.setdefault(key, pts)
            continue
        out[key] = [p if p[1] <= q[1] else q for p, q in zip(mine, pts)]
    return out


# the decompositions the worker times at start-up, each through its own kernel (:func:`bench_ops`):
# (op, keyword arguments); svd twice, its two variants 2.6x apart in work (catalog.linalg)
OPS_BENCH = (("numpy.linalg.eigh", {}), ("numpy.linalg.eigvalsh", {}), ("numpy.linalg.svd", {}),
             ("numpy.linalg.svd", {"compute_uv": False}), ("numpy.linalg.qr", {}), ("numpy.linalg.cholesky", {}),
             ("numpy.linalg.inv", {}), ("numpy.linalg.det", {}), ("numpy.linalg.slogdet", {}),
             ("numpy.linalg.pinv", {}))


def self_benchmark(backend: Any, shared: bool, cache: bool = True) -> dict[str, Any]:
    """The ``bench`` of the worker's ``ready``: per family and dtype, (flops, seconds) at two or three
    sizes under ``points`` ("products/f8": [[flops, s], ...]), each decomposition under ``ops``, and,
    for older clients, one float64 rate in GFLOP/s per family. The probe ops match the client's
    calibration (fusion_shim.plan.calibrate): matmul, solve, fft (rfft for real). ``shared``: the
    worker shares its CPUs with the program that started it (embedded), and its short benchmark is
    neither cached nor reused; ``cache``: a worker of its own reuses its host's last one (D58)."""
    key = cache_key(backend) if cache and not shared else None
    got = load_cached(key) if key is not None else None
    if got is not None:
        return got
    bench = measure_benchmark(backend, shared)
    if key is not None:
        save_cached(key, bench)
    return bench


def measure_benchmark(backend: Any, shared: bool) -> dict[str, Any]:
    """:func:`self_benchmark`, measured now."""
    dev = backend.device
    # D53: a GPU at larger sizes; an embedded CPU worker briefly, beside the program it serves
    big = dev.type == "cuda"
    sizes = ({"products": (128, 512, 4096), "linalg": (128, 384, 2048), "fft": (1 << 12, 1 << 16, 1 << 22)} if big
             else {"products": (128, 384), "linalg": (96, 256), "fft": (1 << 12, 1 << 15)} if shared
             else {"products": (128, 512, 1024), "linalg": (128, 384, 768), "fft": (1 << 12, 1 << 16, 1 << 20)})
    # and each decomposition at one size
    n = 1024 if big else 192 if shared else 384

    def measure() -> tuple[dict, dict, dict]:
        points = bench_points(backend, sizes, big)
        return (points, *bench_ops(backend, n, repeat=1 if shared else 3))

    # a CPU worker of its own host checks that nothing else ran on its CPUs meanwhile (an embedded
    # one shares them with the program by design: the planner widens its margin instead)
    points, ops, failed, busy = bench_until_clean(measure, cpu_sample if dev.type == "cpu" and not shared
                                                  else lambda: None)
    rates = {family: max(f / s for f, s in points[f"{family}/f8"]) / 1e9 for family in sizes}
    return {**rates, "points": points, "ops": ops, **({"ops_failed": failed} if failed else {}), **busy}


def cache_key(backend: Any) -> dict[str, Any]:
    """What a benchmark depends on: this boot of this host, the device, the CPUs this process may
    use, torch's version and threads, and the benchmark's own format."""
    dev = backend.device
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = list(range(os.cpu_count() or 1))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"version": CACHE_VERSION, "boot": boot_id(), "host": socket.gethostname(), "device": str(dev),
            "name": name, "cpus": cpus, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "ops": [op for op, _ in OPS_BENCH]}


def cache_file(key: dict, directory: str | None = None) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(directory or cache_dir(), f"worker-bench-{digest}.json")


def load_cached(key: dict, directory: str | None = None, now: Callable[[], float] = time.time) -> dict | None:
    """The cached benchmark for ``key`` with ``cached_s`` (its age) added, or None: absent, stale,
    unreadable, or in a file this user does not own alone (another user could write its figures)."""
    path = cache_file(key, directory)
    try:
        with open(path) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            data = json.load(f)
        bench, taken = data["bench"], float(data["taken"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if data.get("key") != key or not isinstance(bench, dict):
        return None
    age = now() - taken
    if not 0 <= age <= (CACHE_CONTENDED_S if bench.get("contended") else CACHE_CLEAN_S):
        return None
    return {**bench, "cached_s": round(age, 1)}


def save_cached(key: dict, bench: dict, directory: str | None = None, now: Callable[[], float] = time.time) -> None:
    path = cache_file(key, directory)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".worker-bench-", dir=os.path.dirname(path))  # 0600
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "taken": now(), "bench": bench}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: measured again at the next start, nothing worse


def bench_points(backend: Any, sizes: dict[str, tuple], big: bool) -> dict[str, list]:
    """Per family and dtype, [[flops, best seconds], ...] of its representative op at ``sizes``."""
    dev = backend.device
    points: dict[str, list] = {}
    gen = torch.Generator(device="cpu").manual_seed(0)
    for name, dt in (("f8", torch.float64), ("f4", torch.float32), ("c16", torch.complex128),
                     ("c8", torch.complex64)):
        cf = 4 if dt.is_complex else 1
        for family, ns in sizes.items():
            pts = []
            for n in (ns[:-1] if cf == 4 and family != "fft" and not big else ns):
                if family == "fft":
                    x = torch.randn(n, generator=gen, dtype=dt).to(dev)
                    fn = (lambda x=x: torch.fft.fft(x)) if dt.is_complex else (lambda x=x: torch.fft.rfft(x))
                    flops = 5.0 * n * math.log2(n) / (1 if dt.is_complex else 2)
                elif family == "products":
                    a = torch.randn(n, n, generator=gen, dtype=dt).to(dev)
                    fn, flops = (lambda a=a: torch.matmul(a, a)), 2.0 * n**3 * cf
                else:
                    a = (torch.randn(n, n, generator=gen, dtype=dt) + n * torch.eye(n, dtype=dt)).to(dev)
                    fn, flops = (lambda a=a: torch.linalg.solve(a, a)), (2 / 3 * n**3 + 2.0 * n**3) * cf
                pts.append([flops, best(backend, fn)])
            points[f"{family}/{name}"] = pts
    return points


def bench_ops(backend: Any, n: int, repeat: int) -> tuple[dict[str, list], dict[str, str]]:
    """Each decomposition's own kernel timed once at one size, through the catalog's rule and the
    kernel a real call runs (float64, n x n, symmetric positive definite): "numpy.linalg.svd/f8":
    [[flops, seconds], ...] (D51: a family's solve curve misprices its other decompositions). Second: the ops whose kernel failed here, with why (the client reports them; their calls are
    priced off the family's curve, and a real call that fails falls back and says so itself)."""
    from ..catalog import BY_NAME, prepare

    # made with torch: a worker in a thread of a program the shim is installed in (tests) must not
    # send its own NumPy calls through the shim
    g = torch.randn(n, n, generator=torch.Generator(device="cpu").manual_seed(0), dtype=torch.float64)
    spd = (g @ g.T / n + torch.eye(n, dtype=torch.float64)).numpy()
    out: dict[str, list] = {}
    failed: dict[str, str] = {}
    for op, kwargs in OPS_BENCH:
        spec = BY_NAME.get(op)
        kernel = KERNELS.get(spec.kernel_id) if spec is not None else None
        if kernel is None:
            continue
        try:
            prep = prepare(spec, inspect.signature(library_function(spec)), (spd,), kwargs)
            tensors = [backend.to_device(x) for x in prep.arrays]
            seconds = best(backend, lambda: backend.compute(kernel, tensors, prep.params, prep.layouts), repeat)
        except Exception as exc:  # not on this device: nothing is claimed for it, and the client says so
            failed[op] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        out.setdefault(f"{op}/f8", []).append([prep.flops, seconds])
    return out, failed


def best(backend: Any, fn: Callable[[], Any], repeat: int = 3) -> float:
    """The best of ``repeat`` timed runs of ``fn`` after an untimed one, each until the device is idle."""
    fn()
    backend.sync()
    fastest = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        backend.sync()
        fastest = min(fastest, time.perf_counter() - t)
    return fastest


def library_function(spec: Any) -> Callable:
    """The catalog row's function where it lives, as the worker's process sees it: nothing is
    patched there, and in a process running the shim (a worker in a test's thread) its signature
    is still the library's, since :func:`inspect.signature` follows the wrapper's ``__wrapped__``."""
    return getattr(importlib.import_module(spec.module), spec.attr)

"""Device and link models for a replay, as data: peaks, bandwidths, latencies, efficiency curves.

Every figure and its source is listed in docs/replay.md; the efficiency curves are ASSUMPTIONS
(shaped after public GEMM/FFT/LAPACK benchmarks, not measured here). A user's own TOML
(``--device-file``/``--link-file``) adds or overrides entries with the same keys.

A call's device time: ``launches * launch_s + max(flops / (peak * eff(flops)), bytes / mem_bps)``,
``peak`` by dtype (``gemm_peak`` for products where the device's matrix units apply), ``eff`` by
family class, interpolated in log flops; the first call of an op class and dtype its self-benchmark did
not run adds ``first_call_s`` (library handles, workspaces). A link's time: ``per_call_s + rtt_s + up/bps + down/bps``.
``noise`` (device: of a kernel's time; link: of a transfer's) is the relative spread of run-to-run
times, which a replay's noise band draws from (ASSUMED figures, docs/replay.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# (flops, efficiency) per class; log-linear between points, constant beyond (ASSUMED: docs/replay.md)
GPU_EFF = {
    "gemm": [(1e6, 0.01), (1e8, 0.15), (1e10, 0.6), (1e12, 0.85)],
    "fft": [(1e6, 0.005), (1e8, 0.05), (1e10, 0.2), (1e12, 0.3)],
    "factor": [(1e6, 0.002), (1e8, 0.02), (1e10, 0.15), (1e12, 0.4)],
    "spectral": [(1e6, 0.0005), (1e8, 0.004), (1e10, 0.03), (1e12, 0.08)],
}
LAUNCHES = {"gemm": 1, "fft": 2, "factor": 6, "spectral": 30}  # kernels per call (ASSUMED)
SPECTRAL = ("svd", "eig", "eigh", "eigvals", "eigvalsh", "lstsq", "pinv", "matrix_rank", "svdvals")


def op_class(op: str, family: str) -> str:
    """gemm | fft | factor (LU, QR, Cholesky, solve, inv) | spectral (SVD, eigh and their kin)."""
    if family == "fft":
        return "fft"
    if family == "linalg" or op.startswith(("numpy.linalg.", "scipy.linalg.")):
        return "spectral" if op.rsplit(".", 1)[-1] in SPECTRAL else "factor"
    return "gemm"


@dataclass
class Device:
    name: str
    peak: dict[str, float]                 # flop/s by dtype code (f8, f4, c16, c8)
    mem_bps: float                         # memory bandwidth, bytes/s
    memory: float                          # capacity, bytes
    launch_s: float                        # one kernel launch
    cold_start_s: float                    # process start, context, warm-up, self-benchmark
    first_call_s: float = 0.0              # a class/dtype's first call on the worker: handles, workspaces
    noise: float = 0.0                     # relative spread of a kernel's time from run to run
    gemm_peak: dict[str, float] = field(default_factory=dict)  # matrix units, where they apply to products
    eff: dict[str, list] = field(default_factory=lambda: GPU_EFF)
    source: str = ""
    # measured (flops, seconds) per "family/dtype" and per "op/dtype" (a worker's self-benchmark):
    # where present they replace peak and efficiency
    curves: dict[str, list] = field(default_factory=dict)
    # measured (flops, seconds) per "op/dtype" of the recorded run's own kernels on this worker: they
    # price its calls before the self-benchmark does, and are never reported as its self-benchmark
    kernels: dict[str, list] = field(default_factory=dict)
    shares_cpus: bool = False              # D317: on the recording host's CPUs, beside the program

    def compute_s(self, op: str, family: str, dtype: str, flops: float, nbytes: float) -> float:
        measured = (self.kernels.get(f"{op}/{dtype}") or self.curves.get(f"{op}/{dtype}")
                    or self.curves.get(f"{family}/{dtype}"))
        if measured is None and dtype not in ("f8", "f4", "c16", "c8"):
            measured = self.curves.get(f"{family}/f8")
        if measured:
            return flops / _interp_rate(measured, flops)
        cls = op_class(op, family)
        peak = (self.gemm_peak if cls == "gemm" else {}).get(dtype) or self.peak.get(dtype) or self.peak.get("f8", 1e9)
        eff = _interp(self.eff.get(cls) or GPU_EFF[cls], flops)
        return LAUNCHES[cls] * self.launch_s + max(flops / (peak * eff), nbytes / self.mem_bps)

    def bench(self) -> dict[str, Any]:
        """What this device's worker would report as its self-benchmark (points per family/dtype and
        per decomposition), timed through the model: the planner's first knowledge of it."""
        if self.curves:
            points = {k: v for k, v in self.curves.items() if k.split("/")[0] in ("products", "linalg", "fft")}
            ops = {k: v for k, v in self.curves.items() if k not in points}
            return {"points": points, "ops": ops}
        rep = {"products": "numpy.matmul", "linalg": "numpy.linalg.solve", "fft": "numpy.fft.fft"}
        points = {}
        for family, op in rep.items():
            for dtype, size in (("f4", 4), ("f8", 8), ("c8", 8), ("c16", 16)):
                pts = []
                for n in (256, 1024, 4096):
                    flops, nbytes = _shape_work(family, n, size)
                    pts.append([flops, self.compute_s(op, family, dtype, flops, nbytes)])
                points[f"{family}/{dtype}"] = pts
        ops = {}
        for op in ("numpy.linalg.svd", "numpy.linalg.eigh", "numpy.linalg.qr", "numpy.linalg.cholesky"):
            pts = []
            for n in (256, 1024):
                flops, nbytes = _shape_work("linalg", n, 8)
                pts.append([flops, self.compute_s(op, "linalg", "f8", flops, nbytes)])
            ops[f"{op}/f8"] = pts
        return {"points": points, "ops": ops}


@dataclass
class Link:
    name: str
    rtt_s: float
    up_bps: float
    down_bps: float
    per_call_s: float                      # this project's own per-call work: encode, decode, copies
    source: str = ""
    noise: float = 0.0                     # relative spread of a transfer's time from run to run
    # what a worker's connect probe measured (round trip, bytes/s up and down, None: not measured),
    # where known; else the model's own figures
    probed: tuple[float, float | None, float | None] | None = None

    def transfer_s(self, up: float, down: float) -> float:
        return self.per_call_s + self.rtt_s + up / self.up_bps + down / self.down_bps

    def probe(self) -> tuple[float, float | None, float | None]:
        """What the planner is told at connect: (round trip, up, down bytes/s)."""
        return self.probed or (self.rtt_s + self.per_call_s, self.up_bps, self.down_bps)


def _shape_work(family: str, n: int, size: int) -> tuple[float, float]:
    if family == "fft":
        m = n * n
        return 5.0 * m * math.log2(m), 2.0 * m * size
    return 2.0 * n ** 3, 3.0 * n * n * size


def _interp(points: list, x: float) -> float:
    pts = sorted((math.log(a), b) for a, b in points)
    lx = math.log(max(x, 1.0))
    if lx <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if lx <= x1:
            return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)
    return pts[-1][1]


def _interp_rate(points: list, flops: float) -> float:
    """flop/s at ``flops`` from measured (flops, seconds) points, log-log, held beyond the ends."""
    logs = [(math.log(f), math.log(f / s)) for f, s in points if f > 0 and s > 0]
    return math.exp(_interp([(math.exp(a), b) for a, b in logs], flops))


T = 1e12
# datasheet figures (docs/replay.md lists each source)
DEVICES: dict[str, dict[str, Any]] = {
    "h100-sxm": dict(peak={"f8": 34 * T, "c16": 34 * T, "f4": 67 * T, "c8": 67 * T}, gemm_peak={"f8": 67 * T, "c16": 67 * T},
                     mem_bps=3.35e12, memory=80e9, launch_s=5e-6, cold_start_s=8.0, first_call_s=0.02, noise=0.03,
                     source="NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    "h100-pcie": dict(peak={"f8": 26 * T, "c16": 26 * T, "f4": 51 * T, "c8": 51 * T}, gemm_peak={"f8": 51 * T, "c16": 51 * T},
                      mem_bps=2.0e12, memory=80e9, launch_s=5e-6, cold_start_s=8.0, first_call_s=0.02, noise=0.03,
                      source="NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    "h200": dict(peak={"f8": 34 * T, "c16": 34 * T, "f4": 67 * T, "c8": 67 * T}, gemm_peak={"f8": 67 * T, "c16": 67 * T},
                 mem_bps=4.8e12, memory=141e9, launch_s=5e-6, cold_start_s=8.0, first_call_s=0.02, noise=0.03,
                 source="NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    "a100": dict(peak={"f8": 9.7 * T, "c16": 9.7 * T, "f4": 19.5 * T, "c8": 19.5 * T}, gemm_peak={"f8": 19.5 * T, "c16": 19.5 * T},
                 mem_bps=2.039e12, memory=80e9, launch_s=5e-6, cold_start_s=8.0, first_call_s=0.02, noise=0.03,
                 source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    "l4": dict(peak={"f8": 0.47 * T, "c16": 0.47 * T, "f4": 30.3 * T, "c8": 30.3 * T},
               mem_bps=300e9, memory=24e9, launch_s=5e-6, cold_start_s=6.0, first_call_s=0.02, noise=0.03,
               source="NVIDIA L4 Tensor Core GPU datasheet; FP64 = FP32/64 (Ada), derived"),
    "rtx5090": dict(peak={"f8": 1.64 * T, "c16": 1.64 * T, "f4": 104.8 * T, "c8": 104.8 * T},
                    mem_bps=1.792e12, memory=32e9, launch_s=5e-6, cold_start_s=6.0, first_call_s=0.02, noise=0.03,
                    source="NVIDIA GeForce RTX 5090 specifications (104.8 TFLOP/s FP32, 1792 GB/s, 32 GB); "
                           "FP64 = FP32/64 (GB202), derived"),
}
LINKS: dict[str, dict[str, Any]] = {
    "nvlink-c2c": dict(rtt_s=5e-6, up_bps=450e9, down_bps=450e9, per_call_s=50e-6, noise=0.02,
                       source="NVIDIA Grace Hopper Superchip datasheet: NVLink-C2C 900 GB/s both ways together; "
                              "5 us round trip ASSUMED"),
    "pcie5": dict(rtt_s=10e-6, up_bps=50e9, down_bps=50e9, per_call_s=50e-6, noise=0.02,
                  source="PCI-SIG PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s each way; 50 GB/s pinned ASSUMED"),
    "pcie5-pageable": dict(rtt_s=10e-6, up_bps=25e9, down_bps=25e9, per_call_s=50e-6, noise=0.02,
                           source="PCIe 5.0 x16 with pageable host memory: half the pinned rate ASSUMED"),
    "pcie4": dict(rtt_s=10e-6, up_bps=25e9, down_bps=25e9, per_call_s=50e-6, noise=0.02,
                  source="PCI-SIG PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s each way; 25 GB/s pinned "
                         "ASSUMED"),
    "pcie4-pageable": dict(rtt_s=10e-6, up_bps=12.5e9, down_bps=12.5e9, per_call_s=50e-6, noise=0.02,
                           source="PCIe 4.0 x16 with pageable host memory: half the pinned rate ASSUMED"),
    "100gbe": dict(rtt_s=50e-6, up_bps=11.75e9, down_bps=11.75e9, per_call_s=50e-6, noise=0.05,
                   source="IEEE 802.3ba/bj 100 Gbit/s; 94% TCP goodput; 50 us round trip ASSUMED"),
    "25gbe": dict(rtt_s=80e-6, up_bps=2.94e9, down_bps=2.94e9, per_call_s=50e-6, noise=0.05,
                  source="IEEE 802.3by 25 Gbit/s; 94% TCP goodput; 80 us round trip ASSUMED"),
    "10gbe": dict(rtt_s=100e-6, up_bps=1.17e9, down_bps=1.17e9, per_call_s=50e-6, noise=0.05,
                  source="IEEE 802.3ae 10 Gbit/s; 94% TCP goodput; 100 us LAN round trip ASSUMED"),
    "1gbe": dict(rtt_s=200e-6, up_bps=1.17e8, down_bps=1.17e8, per_call_s=50e-6, noise=0.05,
                 source="IEEE 802.3ab 1 Gbit/s; 94% TCP goodput; 200 us LAN round trip ASSUMED"),
    "wan": dict(rtt_s=20e-3, up_bps=12.5e6, down_bps=12.5e6, per_call_s=50e-6, noise=0.2,
                source="100 Mbit/s, 20 ms round trip (the scenario fusion_shim targets)"),
}


def cpu_worker(report: dict[str, Any]) -> Device:
    """This host's CPU worker, from its self-benchmark in the report (``worker.info.bench``)."""
    info = ((report.get("worker") or {}).get("info") or {})
    bench = info.get("bench") if isinstance(info.get("bench"), dict) else {}
    curves = {**(bench.get("points") or {}), **(bench.get("ops") or {})}
    if not curves:
        raise ValueError("the report holds no worker self-benchmark (worker.info.bench): record a run with "
                         "a CPU worker (--device cpu or --policy remote) to replay on 'cpu-worker'")
    ready = (report.get("worker") or {}).get("ready_after_s")
    kernels = recorded_kernels(report.get("records") or [])
    return Device("cpu-worker", peak={}, mem_bps=20e9, memory=8e9, launch_s=0.0,
                  cold_start_s=float(ready) if isinstance(ready, (int, float)) else 2.0, noise=0.1,
                  source="the recorded worker's own self-benchmark" + (
                      f"; its kernels as measured in the recorded run ({len(kernels)} ops)" if kernels else ""),
                  curves=curves, kernels=kernels, shares_cpus=True)


def recorded_kernels(records: list) -> dict[str, list]:
    """D316: "op/dtype" -> [(flops, mean kernel seconds)] per size, of the recorded worker calls.
    A self-benchmark is taken once per host and cached, at whatever load the host had then; the
    run's own kernels ran beside the program and its host's load as they were during the run."""
    acc: dict[str, dict[float, list[float]]] = {}
    for r in records:
        kernel = (r.get("phases") or {}).get("kernel")
        if r.get("kind") != "worker" or not kernel or not r.get("flops"):
            continue
        acc.setdefault(f"{r.get('op')}/{r.get('cdtype') or 'f8'}", {}).setdefault(float(r["flops"]), []).append(kernel)
    return {key: [(f, sum(v) / len(v)) for f, v in sorted(sizes.items())] for key, sizes in acc.items()}


def loopback(report: dict[str, Any]) -> Link:
    """The link of the recorded run: its round trip measured at connect (``worker.info.link``), and
    its per-call cost and bandwidth fitted to the recorded worker calls' own times outside the kernel
    (least squares of seconds on bytes moved; D240, D318), else the bandwidth its probe measured."""
    info = ((report.get("worker") or {}).get("info") or {})
    link = info.get("link") if isinstance(info.get("link"), dict) else {}
    rtt = link.get("rtt_s")
    if not isinstance(rtt, (int, float)):
        raise ValueError("the report holds no measured link (worker.info.link.rtt_s): record a run with a worker")
    up, down = link.get("up_bytes_per_s"), link.get("down_bytes_per_s")
    probe = (float(up or 2e9), float(down or up or 2e9))
    # D317: the planner is told what the recorded run's probe told it, never the calls' fitted cost
    probed = (float(rtt), float(up) if up else None, float(down) if down else None)
    fit = _fit_link(report.get("records") or [], probe)
    if fit is not None:
        per_call, up_bps, down_bps, how = fit
        return Link("loopback", float(rtt), up_bps, down_bps, per_call_s=max(per_call - rtt, 0.0),
                    source=f"round trip measured at connect; {how}", probed=probed)
    return Link("loopback", float(rtt), *probe, per_call_s=0.0, source="measured at connect in the recorded run",
                probed=probed)


def _fit_link(records: list, probe: tuple[float, float]) -> tuple[float, float, float, str] | None:
    """(seconds per call, up bytes/s, down bytes/s, how) from worker calls: wall time less kernel,
    waits and checks, on the bytes sent and received. D318: each way its own rate (an answer is
    decoded and copied out where a request is copied in), else one rate for both; where neither fit
    is physical (a negative cost per call: the calls' sizes cannot tell the two apart), the rates
    ``probe`` measured and the calls' mean time beyond them as the cost per call."""
    groups: dict[tuple[float, float], list[tuple[float, float, float]]] = {}
    for r in records:
        ph = r.get("phases") or {}
        if r.get("kind") != "worker" or "kernel" not in ph:
            continue
        sent = (r.get("bytes_sent") or 0) + (r.get("shm_sent") or 0)
        received = (r.get("bytes_received") or 0) + (r.get("shm_received") or 0)
        rest = sum(ph.get(k, 0.0) for k in ("kernel", "wait_ready", "link_probe", "verify"))
        key = (round(math.log2(sent + 1) * 4), round(math.log2(received + 1) * 4))  # quarter octaves
        groups.setdefault(key, []).append((float(sent), float(received), (r.get("wall_s") or 0.0) - rest))
    if sum(len(v) for v in groups.values()) < 4:
        return None
    # D318: sizes seen under FIT_MIN times left out where others remain: one slow call (the first
    # upload's new shared-memory segment) must not set the rate hundreds of calls are priced at
    common = [v for v in groups.values() if len(v) >= FIT_MIN]
    pts = [c for v in (common if len(common) >= 2 else groups.values()) for c in v]
    ys = [y for *_, y in pts]
    both = _least_squares([(1.0, u, d) for u, d, _ in pts], ys)
    if both is not None and both[0] >= 0 and both[1] > 0 and both[2] > 0:
        return both[0], 1.0 / both[1], 1.0 / both[2], "per-call cost and bandwidth each way fitted to its worker calls"
    one = _least_squares([(1.0, u + d) for u, d, _ in pts], ys)
    if one is not None and one[0] >= 0 and one[1] > 0:
        return one[0], 1.0 / one[1], 1.0 / one[1], "per-call cost and bandwidth fitted to its worker calls"
    per_call = sum(y - u / probe[0] - d / probe[1] for u, d, y in pts) / len(pts)
    return max(per_call, 0.0), *probe, "bandwidth measured at connect; per-call cost its worker calls' mean beyond it"


FIT_MIN = 3  # calls of a size before they are points of the link's fit


def _least_squares(rows: list[tuple[float, ...]], ys: list[float]) -> list[float] | None:
    """The coefficients minimising the squared error of ``rows . x = ys`` (normal equations, each
    column scaled to unit size first); None where the columns are not independent."""
    k = len(rows[0])
    scale = [max(abs(row[j]) for row in rows) or 1.0 for j in range(k)]
    a = [[sum(row[i] * row[j] for row in rows) / (scale[i] * scale[j]) for j in range(k)]
         + [sum(row[i] * y for row, y in zip(rows, ys)) / scale[i]] for i in range(k)]
    for c in range(k):  # Gauss-Jordan with partial pivoting
        p = max(range(c, k), key=lambda i: abs(a[i][c]))
        if abs(a[p][c]) < 1e-9 * max(abs(a[i][i]) for i in range(k)):
            return None
        a[c], a[p] = a[p], a[c]
        for i in range(k):
            if i != c:
                f = a[i][c] / a[c][c]
                a[i] = [x - f * y for x, y in zip(a[i], a[c])]
    return [a[i][k] / a[i][i] / scale[i] for i in range(k)]


def _load_toml(path: str) -> dict[str, dict[str, Any]]:
    import tomllib

    with open(path, "rb") as f:
        data = tomllib.load(f)
    if not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: each entry must be a table, [name]")
    return data


def device(name: str, report: dict[str, Any], path: str | None = None) -> Device:
    table = {**DEVICES, **(_load_toml(path) if path else {})}
    if name == "cpu-worker" and name not in table:
        return cpu_worker(report)
    if name not in table:
        raise ValueError(f"unknown device {name!r}; known: " + ", ".join(sorted([*table, "cpu-worker"])))
    try:
        return Device(name, **table[name])
    except TypeError as exc:
        raise ValueError(f"device {name!r}: {exc}") from None


def link(name: str, report: dict[str, Any], path: str | None = None) -> Link:
    table = {**LINKS, **(_load_toml(path) if path else {})}
    if name == "loopback" and name not in table:
        return loopback(report)
    if name not in table:
        raise ValueError(f"unknown link {name!r}; known: " + ", ".join(sorted([*table, "loopback"])))
    try:
        return Link(name, **table[name])
    except TypeError as exc:
        raise ValueError(f"link {name!r}: {exc}") from None

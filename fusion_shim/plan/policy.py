"""The decision: where one call runs. :func:`decide` is pure (no I/O, no clock, no mutation).

Policies: ``local`` never offloads; ``remote`` offloads every supported call to a ready worker (tests,
measurement); ``auto`` (the default) offloads when the predicted time on a worker, with a safety
margin, beats the predicted time here.

What ``auto`` prices, per candidate worker:

- only the input bytes that worker does not already hold (``WorkerState.bytes_in``; the residency
  mirror answers it) going up, and the result's bytes coming back, over its link model;
  an input this process keeps passing to calls counts by its share of an upload that will serve
  them all (``WorkerState.reused``; residency.Reuse);
- its device's compute time for the op, dtype and work;
- the work queued ahead of the call on that worker (``backlog_s``; a busy worker is not free);
- a cold or warming worker is never a candidate: its warm-up is never waited for.

The margin is ``exp(Z * sqrt(sigma_local^2 + sigma_remote^2))``: wide for priors (Z_PRIOR sigmas
where a side has nothing but the static prior), narrowing as the models gather samples (on a worker
contended by the program's BLAS threads, SIGMA_SHARED_CPUS wider until a call has run there). Exploration
tries the place predicted slower when it could plausibly win (optimistic by Z_EXPLORE sigmas), its
model has few samples for that size, and what it could cost (priced pessimistically, Z_EXPLORE_COST
sigmas slow, with SIGMA_SHARED_CPUS_EXPLORE more on a worker contended by the program's BLAS threads) fits the
exploration budget the caller passes in (plan.planner keeps it under ~2% of the run's intercepted
time).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .cells import NEVER
from .margins import MIN_LOG_MARGIN, SIGMA_SHARED_CPUS, Z, Z_PRIOR
from .model import SIGMA_PRIOR, Profile

Z_EXPLORE = 2.0          # "could plausibly win": optimistic by this many sigmas
Z_EXPLORE_COST = 1.0     # D85: what an exploration could cost, pessimistic by this many sigmas
# D87: an exploration on a contended worker is waited for: priced at its worst seen (30x)
SIGMA_SHARED_CPUS_EXPLORE = math.log(30.0)
EXPLORE_SAMPLES = 2      # a place with fewer samples than this for the call's size may be explored
CANDIDATE_STATES = ("ready", "busy")


@dataclass(frozen=True)
class Call:
    """What a decision needs to know of one call (from catalog.Prepared)."""
    op: str                 # "numpy.matmul"
    family: str             # "products" | "linalg" | "fft"
    dtype: str              # compute dtype, "f8", "c16", ...
    flops: float
    bytes_in: int           # all input bytes
    bytes_out: int          # the results' bytes


@dataclass(frozen=True)
class WorkerState:
    """One worker as the runtime sees it at the moment of the call."""
    state: str              # "cold" | "warming" | "starting" | "ready" | "busy" | "down" | "stopped"
    queued: int = 0         # this process's calls in flight on it
    backlog_s: float = 0.0  # their predicted remaining seconds
    bytes_in: int | None = None  # input bytes it is priced for (not held yet; reused ones by their share); None: all
    name: str = ""
    contended: bool = False      # it computes on CPUs this process's BLAS threads may be spinning on
#                                  (runtime.WorkerLink.contended)
    reused: int = 0              # bytes of inputs this process keeps reusing, counted in bytes_in only
#                                  by their share of the upload (residency.Reuse): once there, they stay


@dataclass(frozen=True)
class Decision:
    where: str                     # "local" or "worker"
    reason: str
    local_s: float | None = None   # predicted seconds, where a prediction was made
    remote_s: float | None = None
    worker: int | None = None      # index of the chosen worker
    explore: bool = False          # chosen to learn, not because it was predicted faster
    local_sigma: float = 0.0
    remote_sigma: float = 0.0


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def price_remote(call: Call, profile: Profile, i: int, w: WorkerState,
                 link_free: bool = False) -> tuple[float, float, int]:
    """(seconds, sigma, samples) for running ``call`` on worker ``i`` in state ``w``; with
    ``link_free``, as if its bytes crossed the link in no time (the round trip still paid)."""
    model = profile.workers[i]
    up = call.bytes_in if w.bytes_in is None else min(max(w.bytes_in, 0), call.bytes_in)
    compute, sigma_c, n = model.device.predict(call.op, call.family, call.dtype, call.flops)
    link = model.link.predict(0, 0) if link_free else model.link.predict(up, call.bytes_out)
    sl = model.link.sigma()
    total = link + compute + max(w.backlog_s, 0.0)
    # the log-sigma of a sum: each part's share of the total weighs its own uncertainty
    sigma = math.hypot(sigma_c * compute / total, sl * link / total)
    return total, sigma, n


def decide(policy: str, call: Call, profile: Profile, workers: Sequence[WorkerState],
           explore_left_s: float = 0.0, min_flops: float = 0.0, link_free: bool = False) -> Decision:
    """Where ``call`` runs. ``link_free``: the decision it would get were every worker's link free
    and measured: whether measuring a link could change it (a link's bulk probe is paid only then)."""
    if policy == "local":
        return Decision("local", "policy local")
    ready = [i for i, w in enumerate(workers) if w.state in CANDIDATE_STATES]
    if not ready:
        states = sorted({w.state for w in workers}) or ["none"]
        return Decision("local", f"worker {'/'.join(states)}" if workers else "no worker")
    local_s, sigma_l, n_l = profile.local.predict(call.op, call.family, call.dtype, call.flops)
    priced = [(price_remote(call, profile, i, workers[i], link_free), i) for i in ready]
    (remote_s, sigma_r, n_r), best = min(priced, key=lambda p: p[0][0])
    where = f" on {workers[best].name}" if len(workers) > 1 and workers[best].name else ""
    if policy == "remote":
        # priced anyway, so that the report can estimate what offloading saved or cost
        return Decision("worker", "policy remote", local_s, remote_s, best, False, sigma_l, sigma_r)
    if call.flops < min_flops:
        return Decision("local", f"below the floor: {call.flops:.3g} flops < {min_flops:.3g}")
    # D86: on a contended worker an op not yet run there, before its drift is measured, is as
    # uncertain to offload as to explore
    shared = workers[best].contended and n_r < EXPLORE_SAMPLES and not profile.workers[best].device.drift_n
    spread = math.hypot(sigma_l, math.hypot(sigma_r, SIGMA_SHARED_CPUS) if shared else sigma_r)
    z = Z_PRIOR if max(sigma_l, sigma_r) >= SIGMA_PRIOR else Z
    margin = math.exp(z * spread + MIN_LOG_MARGIN)
    invest = (f", {workers[best].reused / 1e6:.3g} MB of reused inputs priced over their reuse"
              if workers[best].reused else "")
    if remote_s * margin < local_s:
        if (n_l < EXPLORE_SAMPLES and local_s * math.exp(-Z_EXPLORE * sigma_l) < remote_s
                and 0 < local_s * math.exp(Z_EXPLORE_COST * sigma_l) - remote_s <= explore_left_s):
            # the local model could be wrong the other way: measuring it here is how it learns
            return Decision("local", f"exploring here: predicted {_ms(local_s)} vs {_ms(remote_s)}{where}, "
                            f"{n_l} samples", local_s, remote_s, None, True, sigma_l, sigma_r)
        return Decision("worker", f"predicted {_ms(remote_s)}{where} < {_ms(local_s)} here (margin x{margin:.2f})"
                        f"{invest}", local_s, remote_s, best, False, sigma_l, sigma_r)
    # exploration: the slower-looking place, when it could win and its price fits the budget; D88:
    # never over a link not yet measured, nor against a local side known only by its prior; D350: one
    # priced free needs no budget left (the program's first call has none yet), an overspent one stops it
    cost_sigma = math.hypot(sigma_r, SIGMA_SHARED_CPUS_EXPLORE) if workers[best].contended else sigma_r
    if (n_r < EXPLORE_SAMPLES and (link_free or profile.workers[best].link.measured) and sigma_l < SIGMA_PRIOR
            and remote_s * math.exp(-Z_EXPLORE * sigma_r) < local_s
            and 0 <= explore_left_s and remote_s * math.exp(Z_EXPLORE_COST * cost_sigma) - local_s <= explore_left_s):
        return Decision("worker", f"exploring{where}: predicted {_ms(remote_s)} there vs {_ms(local_s)} here, "
                        f"{n_r} samples{invest}", local_s, remote_s, best, True, sigma_l, sigma_r)
    return Decision("local", f"predicted {_ms(local_s)} here <= {_ms(remote_s)}{where or ' on the worker'} "
                    f"(margin x{margin:.2f})", local_s, remote_s, None, False, sigma_l, sigma_r)


# -- the floor: the smallest call that could possibly win ------------------------------------------
# For each op, the densest shape it takes: square operands of side n (for FFTs, n*n elements).
# (input elements, flops before the complex factor, output elements). A call with fewer input bytes
# than the floor its op gets from these never leaves the interceptor's fast path. Denser calls exist
# (an einsum contracting many indices of small operands): below the floor they stay local, which can
# miss a win but never cost one.
_PRODUCT = (lambda n: 2 * n * n, lambda n: 2.0 * n**3, lambda n: n * n)
_FFT = (lambda n: n * n, lambda n: 5.0 * n * n * math.log2(max(n * n, 2)), lambda n: n * n)
FLOOR_SHAPES = {
    "numpy.matmul": _PRODUCT, "numpy.dot": _PRODUCT, "numpy.tensordot": _PRODUCT, "numpy.einsum": _PRODUCT,
    "numpy.linalg.solve": (lambda n: 2 * n * n, lambda n: 8 / 3 * n**3, lambda n: n * n),
    "numpy.linalg.inv": (lambda n: n * n, lambda n: 2.0 * n**3, lambda n: n * n),
    "numpy.linalg.cholesky": (lambda n: n * n, lambda n: n**3 / 3, lambda n: n * n),
    "numpy.linalg.eigh": (lambda n: n * n, lambda n: 9.0 * n**3, lambda n: n * n + n),
    "numpy.linalg.svd": (lambda n: n * n, lambda n: 26.0 * n**3, lambda n: 2 * n * n + n),
    "numpy.linalg.qr": (lambda n: n * n, lambda n: 8 / 3 * n**3, lambda n: 2 * n * n),
    "numpy.fft.fft": _FFT, "numpy.fft.ifft": _FFT, "numpy.fft.rfft": _FFT, "numpy.fft.irfft": _FFT,
    "numpy.fft.fft2": _FFT, "numpy.fft.ifft2": _FFT,
}
# any other op: the densest shape of its family (svd's for linalg), so that its floor is never
# higher than the lowest any op of the family could have: a floor may miss a win, never cost one
FAMILY_SHAPES = {"products": _PRODUCT, "linalg": FLOOR_SHAPES["numpy.linalg.svd"], "fft": _FFT}
FLOOR_DTYPES = {"f4": 4, "f8": 8, "c8": 8, "c16": 16}  # integer products: below the float floor, local
Z_FLOOR = 1.5            # "could possibly": the worker's device this many sigmas faster than predicted


def family_of(op: str) -> str:
    return ("fft" if op.startswith(("numpy.fft.", "scipy.fft.")) else
            "linalg" if op.startswith(("numpy.linalg.", "scipy.linalg.")) else "products")


def _could_win(profile: Profile, remotes: Sequence[tuple], op: str, family: str, dtype: str, flops: float,
               up: int, down: int) -> bool:
    """Whether a call of this work could beat its local prediction on one of ``remotes`` ((link, device)
    pairs; a None device: infinitely fast) with each device Z_FLOOR sigmas faster than predicted."""
    # D89: the local side as predicted, not pessimistically
    here, _, _ = profile.local.predict(op, family, dtype, flops)
    for link, device in remotes:
        there = link.predict(up, down)
        if device is not None:
            compute, sd, _ = device.predict(op, family, dtype, flops)
            there += compute * math.exp(-Z_FLOOR * sd)
        if there < here:
            return True
    return False


def could_win(profile: Profile, workers: Sequence[int], call: Call, up: int | None = None) -> bool:
    """The floor's test applied to one real call: could it win on one of ``workers`` (indices into the
    profile) with the device Z_FLOOR sigmas faster than predicted, sending ``up`` of its input bytes
    (None: all of them)? A call that could not is evidence for raising its op's floor (plan.planner)."""
    remotes = [(profile.workers[i].link, profile.workers[i].device) for i in workers]
    return _could_win(profile, remotes, call.op, call.family, call.dtype, call.flops,
                      call.bytes_in if up is None else up, call.bytes_out)


def floors(profile: Profile, workers: Sequence[int] | None, inputs_free: bool = False,
           ops: dict[str, str] | None = None) -> dict[str, int]:
    """Input bytes below which each op (``ops``: name -> family; default the ops of FLOOR_SHAPES)
    cannot win on any of ``workers`` (indices into the profile),
    even with the worker's device Z_FLOOR sigmas faster than predicted. With
    ``workers`` None (none ready yet) the link is the prior one and the worker's device infinitely
    fast: the smallest work that could win anywhere plausible. ``inputs_free``: inputs may already
    be resident on a worker, so they are not priced; the result's way back still is."""
    return {op: min(by.values(), default=NEVER)
            for op, by in floors_by_dtype(profile, workers, inputs_free, ops).items()}


def floors_by_dtype(profile: Profile, workers: Sequence[int] | None, inputs_free: bool = False,
                    ops: dict[str, str] | None = None,
                    dtypes: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """:func:`floors` for each dtype of FLOOR_DTYPES (``dtypes``: only those) apart: an op's first
    measurements in one dtype move that dtype's floor alone (the planner recomputes only it)."""
    from .model import LinkModel

    remotes = [(profile.workers[i].link, profile.workers[i].device) for i in workers] if workers else []
    if not remotes:
        remotes = [(LinkModel(), None)]

    def could_win(op: str, family: str, dtype: str, size: int, cf: int, n: float) -> bool:
        n_in, flops_of, n_out = FLOOR_SHAPES.get(op) or FAMILY_SHAPES[family]
        return _could_win(profile, remotes, op, family, dtype, flops_of(n) * cf,
                          0 if inputs_free else n_in(n) * size, n_out(n) * size)

    from .model import REPRESENTATIVE, SAME_KERNEL

    models = [profile.local] + [d for _, d in remotes if d is not None]
    wanted = {d: FLOOR_DTYPES[d] for d in dtypes if d in FLOOR_DTYPES} if dtypes is not None else FLOOR_DTYPES
    out: dict[str, dict[str, int]] = {}
    # ops that would compute alike in a dtype share one result: most have no samples of their own
    # in most dtypes (a worker times each decomposition in float64 only)
    same: dict[tuple, int] = {}
    for op, family in (ops or {op: family_of(op) for op in FLOOR_SHAPES}).items():
        shape = FLOOR_SHAPES.get(op) or FAMILY_SHAPES[family]
        alike = (id(shape), family, REPRESENTATIVE.get(op) == family, op.endswith((".rfft", ".irfft")))
        n_in = shape[0]
        by: dict[str, int] = {}
        out[op] = by
        for dtype, size in wanted.items():
            if dtype == "f4" and family == "fft" and not op.endswith((".rfft", ".irfft")):
                continue
            measured = any(m.buckets.get((op, dtype)) or (op, dtype) in m.op_curves for m in models)
            # an op with no calls of its own is priced off its kernel's other names' (model.SAME_KERNEL)
            group = SAME_KERNEL.get(op)
            borrows = group is not None and not measured and any(
                SAME_KERNEL.get(o) == group and d == dtype and stats
                for m in models for (o, d), stats in list(m.buckets.items()))
            key = (*alike, dtype, op if measured else group if borrows else None)
            if key in same:
                by[dtype] = same[key]
                continue
            cf = 4 if dtype[0] == "c" and family != "fft" else 1
            # bisection on log2(n) in [2, 15.6]: the advantage of the worker grows with n (more work
            # per byte for the dense ops; a fixed round trip amortised for all of them)
            lo, hi = 2.0, 15.6
            if not could_win(op, family, dtype, size, cf, 2 ** hi):
                by[dtype] = same[key] = NEVER
                continue
            for _ in range(10):
                mid = (lo + hi) / 2
                if could_win(op, family, dtype, size, cf, 2 ** mid):
                    hi = mid
                else:
                    lo = mid
            by[dtype] = same[key] = int(n_in(2 ** hi) * size)
    return out

"""Cost models: how long a call takes here, on a worker's device, and on the link between.

A :class:`RateModel` predicts one place's compute time for an op, dtype and amount of work. It holds
two layers:

- a *curve* per (family, dtype): measured (flops, seconds) points from calibration probes (local,
  :mod:`fusion_shim.plan.calibrate`) or from the worker's self-benchmark in its ``ready`` reply,
  interpolated in log-log space (the rate at the ends is held constant);
- *buckets* per (op, dtype): every measured call, grouped by work (one bucket spans 4x in flops).
  A bucket keeps a mean log rate and its spread. A prediction inside a measured bucket uses it; near
  one, that bucket's offset from the curve; for an op with no measured call yet, the nearest bucket of
  another name for the same kernel (``SAME_KERNEL``: np.dot after np.matmul); otherwise the curve, or
  the static prior table.

A worker's device also has an *op curve* for each op it timed on its own (the decompositions, in
its self-benchmark): read before the family's curve, as that op's offset from it. And a *drift*:
how far the first call of each op and size on it came out from the curve it was predicted off
(D83), added to every prediction read off a curve; an op's own measured calls are unaffected.
The local model's counterpart, per family and dtype: how far the first call of each op read off
another op's curve or the prior came out from it, added to the next such readings (D331).
Where the local side has nothing but the prior for an op a worker timed, the prior is averaged (in
logs) with this host's GEMM curve scaled by that op's rate against GEMM on the worker (*kin*, D348).

Every prediction comes with ``sigma``, the uncertainty of its log: large for a prior, smaller for
a calibration curve, shrinking as 1/sqrt(samples) once a bucket has measurements. The policy turns
it into a safety margin (:mod:`fusion_shim.plan.policy`).

A bucket that keeps mispredicting is reset, by StarPU's rule: once a bucket has two samples, a
measurement more than 2x away from its mean is an *error* and is not folded in; when errors reach the
number of samples the model was most probably wrong, the bucket is flushed and relearnt, and the reset
is reported. (StarPU starts counting at one sample; a size's first call is often a cold one.)

The :class:`LinkModel` is a round trip plus bytes over a bandwidth each way, measured at connect
(pings and a bulk transfer each way) and corrected from the timing of every remote call.

Pure Python: no NumPy, no I/O, no threads. Callers serialize updates (plan.planner holds a lock).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

FAMILIES = ("products", "linalg", "fft")
# the op each family's calibration curve is measured with; other ops of the family read that curve
# with extra uncertainty until they have measurements of their own
REPRESENTATIVE = {"numpy.matmul": "products", "numpy.dot": "products", "numpy.tensordot": "products",
                  "numpy.linalg.solve": "linalg", "numpy.fft.fft": "fft", "numpy.fft.ifft": "fft",
                  "numpy.fft.rfft": "fft", "numpy.fft.irfft": "fft",
                  # the ndarray operators and the same kernels under other names
                  "numpy.ndarray.__matmul__": "products", "numpy.ndarray.__imatmul__": "products",
                  "numpy.ndarray.dot": "products", "numpy.linalg.matmul": "products",
                  "scipy.linalg.solve": "linalg", "scipy.fft.fft": "fft", "scipy.fft.ifft": "fft",
                  "scipy.fft.rfft": "fft", "scipy.fft.irfft": "fft"}
# D81: until an op has measured calls, the nearest bucket of another name for its kernel stands in
SAME_KERNEL = {op: "gemm" for op in ("numpy.matmul", "numpy.dot", "numpy.ndarray.__matmul__",
                                     "numpy.ndarray.__imatmul__", "numpy.ndarray.dot", "numpy.linalg.matmul")}
SAME_KERNEL.update({op: "c2c-fft" for op in ("numpy.fft.fft", "numpy.fft.ifft")})
# D80: float64 GFLOP/s until calibrated, set below the measured local rates
PRIOR_GFLOPS = {"products": 50.0, "linalg": 10.0, "fft": 3.0}
DTYPE_SPEED = {"f4": 2.0, "c8": 2.0, "f8": 1.0, "c16": 1.0}  # relative to f8; anything else 0.1

BUCKET = math.log(4.0)          # one size bucket spans 4x in flops
ERROR_LOG = math.log(2.0)       # StarPU's "too big deviation": more than 2x from the bucket's mean
NOISE = 0.3                     # prior spread (log) of one measurement around its bucket's mean
SIGMA_PRIOR = 1.0               # a rate from PRIOR_GFLOPS
SIGMA_CURVE = 0.25              # a rate read off a measured curve (best of three runs, same op and device)
SIGMA_OTHER = 0.5               # added: another dtype's curve, or another op's of the family
SIGMA_PER_BUCKET = 0.15         # added per bucket between the call and the nearest measured bucket
# D348: the prior and a worker's op-to-GEMM ratio on this host's GEMM, two guesses of the prior's spread, averaged
SIGMA_KIN = SIGMA_PRIOR / math.sqrt(2.0)
EWMA_AFTER = 8                  # past this many samples a bucket forgets (tracks drift) at 1/8
MAX_DRIFT = math.log(20.0)      # one call's say in a model's drift is clipped to 20x either way
MAX_RATE = 1e17                 # flop/s: a measured point beyond this (1,000x an H200) is not believed


@dataclass
class Stat:
    """One bucket: measured log rates (flops/s) and the log flops they were measured at."""
    n: int = 0
    mean: float = 0.0           # mean log rate
    lf: float = 0.0             # mean log flops of the samples
    var: float = 0.0            # spread of log rate
    errors: int = 0

    def sigma(self) -> float:
        """Uncertainty of the mean: the spread shrunk toward NOISE with two pseudo-samples, over sqrt(n)."""
        var = (self.var * self.n + 2 * NOISE * NOISE) / (self.n + 2)
        return math.sqrt(var / self.n)

    def add(self, x: float, lf: float) -> None:
        self.n += 1
        w = 1.0 / min(self.n, EWMA_AFTER)
        d = x - self.mean
        self.mean += w * d
        self.lf += w * (lf - self.lf)
        self.var = (1 - w) * (self.var + w * d * d)


def _log_points(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(log flops, log rate) of the measured pairs that a device could have produced, sorted."""
    return sorted((math.log(f), math.log(f / s)) for f, s in points
                  if 0 < f < math.inf and 0 < s < math.inf and f / s <= MAX_RATE)


def _nearest(stats: dict[int, "Stat"], b: int) -> tuple[int, "Stat"] | None:
    """The measured bucket nearest bucket ``b`` (another thread may add one meanwhile: a copy is read)."""
    near = None
    for k, s in list(stats.items()):
        if s.n and (near is None or abs(k - b) < abs(near[0] - b)):
            near = (k, s)
    return near


def _beyond(points: list[tuple[float, float]], x: float) -> float:
    """Extra uncertainty of a curve read outside the sizes it was measured at: SIGMA_PER_BUCKET per
    bucket of distance (probes stop at a few hundred MFLOP; programs go far past them)."""
    d = points[0][0] - x if x < points[0][0] else x - points[-1][0] if x > points[-1][0] else 0.0
    return SIGMA_PER_BUCKET * d / BUCKET


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear y(x) through sorted points, constant beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    i = bisect_left(points, (x, -math.inf))
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1


class RateModel:
    """Compute time of one place (``local`` or a worker's device)."""

    def __init__(self, name: str, prior_gflops: dict[str, float] | None = None, learn_drift: bool = False,
                 learn_siblings: bool = False):
        self.name = name
        self.prior = dict(prior_gflops or PRIOR_GFLOPS)
        self.curves: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (family, dtype) -> (log flops, log rate)
        self.op_curves: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (op, dtype) -> the same, one op's own
        self.buckets: dict[tuple[str, str], dict[int, Stat]] = {}           # (op, dtype) -> bucket -> Stat
        self.resets = 0
        # D83: the mean log ratio of the first call of each op and size to its curve, added to every
        # prediction read off a curve (not to those from an op's own measured calls)
        self.learn_drift = learn_drift
        self.drift = 0.0
        self.drift_n = 0
        # D331: (family, dtype) -> [mean log ratio, ops]: how far the first call of each op read off
        # another op's curve or the prior came out from that reading, added to the next such readings
        self.learn_siblings = learn_siblings
        self.siblings: dict[tuple[str, str], list[float]] = {}
        # D348: (op, dtype) -> (log flops, log of the op's rate over GEMM's) as a worker timed them
        self.kin: dict[tuple[str, str], list[tuple[float, float]]] = {}

    # -- knowledge in -------------------------------------------------------------------------------
    def set_curve(self, family: str, dtype: str, points: list[tuple[float, float]]) -> None:
        """Measured (flops, seconds) pairs; the curve replaces any earlier one for that family and dtype."""
        pts = _log_points(points)
        if pts:
            self.curves[(family, dtype)] = pts
            self.siblings.pop((family, dtype), None)  # learnt against the reading this curve replaces

    def set_op_curve(self, op: str, dtype: str, points: list[tuple[float, float]]) -> None:
        """One op's own measured (flops, seconds) pairs (a worker times each decomposition's kernel):
        read before its family's curve, without the extra uncertainty of another op's."""
        pts = _log_points(points)
        if pts:
            self.op_curves[(op, dtype)] = pts

    def set_kin(self, op: str, dtype: str, offsets: list[tuple[float, float]]) -> None:
        """An op's log rate over GEMM's as another device timed it (:meth:`gemm_offsets`): read, with
        this model's GEMM curve, where this model knows the op by nothing but its prior (D348)."""
        if offsets:
            self.kin[(op, dtype)] = sorted(offsets)

    def gemm_offsets(self, op: str, dtype: str) -> list[tuple[float, float]]:
        """Where this device timed ``op`` on its own: (log flops, its log rate less GEMM's there)."""
        own, gemm = self.op_curves.get((op, dtype)), self.curves.get(("products", dtype))
        if own is None or gemm is None:
            return []
        return [(x, y - _interp(gemm, x)) for x, y in own]

    def observe(self, op: str, family: str, dtype: str, flops: float, seconds: float,
                force: bool = False) -> str | None:
        """Fold one measured call in; returns a message when the bucket was reset (StarPU's rule).
        ``force``: a lower bound known for certain (a call that ran out of its deadline), folded in
        even when it is far from the bucket's mean."""
        if not (0 < flops < math.inf and 0 < seconds < math.inf):
            return None
        lf = math.log(flops)
        x = lf - math.log(seconds)
        stats = self.buckets.setdefault((op, dtype), {})
        if self.learn_siblings and not force and not any(s.n for s in list(stats.values())):
            self._sibling(op, family, dtype, lf, x)
        b = int(lf // BUCKET)
        st = stats.get(b)
        if st is None:
            st = stats[b] = Stat()
        if self.learn_drift and not force and st.n == 0:
            # the first call of this op and size was predicted off a curve: how far off, in the mean
            base, _, measured = self._source(op, family, dtype, lf)
            if measured:
                self.drift_n += 1
                self.drift += (min(max(x - base, -MAX_DRIFT), MAX_DRIFT) - self.drift) / min(self.drift_n, EWMA_AFTER)
        if st.n >= 2 and not force:  # the first sample of a size is often a cold one (page faults): not a yardstick yet
            # D44: a bucket of one size only (a loop's calls) is its own expectation at that size
            expected = st.mean if st.lf == lf else (
                st.mean + self._base(op, family, dtype, lf)[0] - self._base(op, family, dtype, st.lf)[0])
            if abs(x - expected) > ERROR_LOG:
                st.errors += 1
                if st.errors >= st.n:
                    msg = (f"{self.name} model of {op} {dtype} near {flops:.2g} flops reset: {st.errors} "
                           f"measurements off by more than 2x against {st.n} that agreed; relearning")
                    del stats[b]
                    self.resets += 1
                    return msg
                return None
        st.add(x, lf)
        return None

    def _sibling(self, op: str, family: str, dtype: str, lf: float, x: float) -> None:
        """D331: an op's first call, where it was read off another op's curve or the prior: how far
        that reading was off, in the mean over the family's ops so far (each op once)."""
        rate, _, measured = self._source(op, family, dtype, lf)
        if measured:
            return
        acc = self.siblings.setdefault((family, dtype), [0.0, 0])
        acc[1] += 1
        acc[0] += (min(max(x - rate, -MAX_DRIFT), MAX_DRIFT) - acc[0]) / min(acc[1], EWMA_AFTER)

    # -- predictions out ----------------------------------------------------------------------------
    def _base(self, op: str, family: str, dtype: str, lf: float) -> tuple[float, float]:
        """(log rate, sigma) from the curves (corrected by the drift) or the prior, before this op's
        own measurements; a reading off another op's curve or the prior, by its family's siblings
        (D331): then as certain as another op's measured curve."""
        rate, sigma, measured = self._source(op, family, dtype, lf)
        if measured:
            return rate + self.drift, sigma
        sib = self.siblings.get((family, dtype))
        if sib is None:
            return rate, sigma
        return rate + sib[0], min(sigma, SIGMA_CURVE + SIGMA_OTHER)

    def _source(self, op: str, family: str, dtype: str, lf: float) -> tuple[float, float, bool]:
        """(log rate, sigma, read off a measured curve of this op or of its family's representative)."""
        own = self.op_curves.get((op, dtype))
        curve = self.curves.get((family, dtype))
        if own is not None:
            if curve is None:
                return _interp(own, lf), SIGMA_CURVE + _beyond(own, lf), True
            # D82: the op's offset from its family's curve where it was timed, the curve's shape elsewhere
            offsets = [(x, y - _interp(curve, x)) for x, y in own]
            return (_interp(curve, lf) + _interp(offsets, lf),
                    SIGMA_CURVE + _beyond(curve, lf) + _beyond(own, lf) / 2, True)
        extra = 0.0 if REPRESENTATIVE.get(op) == family else SIGMA_OTHER
        if curve is not None:
            return _interp(curve, lf), SIGMA_CURVE + extra + _beyond(curve, lf), not extra
        speed = DTYPE_SPEED.get(dtype, 0.1)
        for (fam, dt), other in list(self.curves.items()):
            if fam == family and dt in DTYPE_SPEED:
                return (_interp(other, lf) + math.log(speed / DTYPE_SPEED[dt]),
                        SIGMA_CURVE + SIGMA_OTHER + extra + _beyond(other, lf), False)
        prior = math.log(self.prior.get(family, 1.0) * 1e9 * speed)
        kin, gemm = self.kin.get((op, dtype)), self.curves.get(("products", dtype))
        if kin is not None and gemm is not None and family != "products":
            # D348: another device's ratio to GEMM on this one's GEMM: a guess as wide as the prior, not of it
            return (prior + _interp(gemm, lf) + _interp(kin, lf)) / 2, SIGMA_KIN, False
        return prior, SIGMA_PRIOR, False

    def predict(self, op: str, family: str, dtype: str, flops: float) -> tuple[float, float, int]:
        """(seconds, sigma of its log, samples in its bucket)."""
        lf = math.log(max(flops, 1.0))
        base, sigma = self._base(op, family, dtype, lf)
        b = int(lf // BUCKET)
        stats = self.buckets.get((op, dtype))
        if stats:
            st = stats.get(b)
            if st is not None and st.n:
                # D44: a bucket of one size only (a loop's calls) is read at the call's own size
                rate = st.mean + base - (base if st.lf == lf else self._base(op, family, dtype, st.lf)[0])
                return flops / math.exp(rate), st.sigma(), st.n
        near = _nearest(stats, b) if stats else None
        if near is None and op in SAME_KERNEL:  # none of its own yet: another name's for the same kernel
            group = SAME_KERNEL[op]
            for other, theirs in list(self.buckets.items()):
                if other[1] == dtype and other[0] != op and SAME_KERNEL.get(other[0]) == group:
                    found = _nearest(theirs, b)
                    if found is not None and (near is None or abs(found[0] - b) < abs(near[0] - b)):
                        near = found
        if near is not None:
            k, s = near
            nsigma = s.sigma() + SIGMA_PER_BUCKET * abs(k - b)
            if nsigma < sigma:
                rate = s.mean + base - self._base(op, family, dtype, s.lf)[0]
                return flops / math.exp(rate), nsigma, 0
        return flops / math.exp(base), sigma, 0

    def samples(self, op: str, dtype: str) -> int:
        return sum(s.n for s in self.buckets.get((op, dtype), {}).values())


@dataclass
class LinkModel:
    """One worker's link: ``rtt + up/up_bps + down/down_bps`` seconds for a call's bytes.

    Everything a remote call spends outside the worker's kernel counts as link time: encoding,
    the network both ways, the worker's copies to and from its device, decoding."""
    rtt: float = 150e-6
    up_bps: float = 2e9
    down_bps: float = 2e9
    measured: bool = False      # from the connect-time probe, not the prior
    n: int = 0                  # calls folded in since
    resets: int = 0
    at_connect: tuple[float, float, float] = (150e-6, 2e9, 2e9)
    # per regime ("rtt": small messages, "bw": bulk, "mixed"): [samples, errors] for StarPU's rule
    counts: dict = field(default_factory=lambda: {"rtt": [0, 0], "bw": [0, 0], "mixed": [0, 0]})

    def predict(self, up: float, down: float) -> float:
        return self.rtt + up / self.up_bps + down / self.down_bps

    def sigma(self) -> float:
        base = 0.3 if self.measured else 1.0
        return max(base / math.sqrt(1 + self.n), 0.05)

    def set_measured(self, rtt: float, up_bps: float, down_bps: float) -> None:
        self.rtt, self.up_bps, self.down_bps = rtt, up_bps, down_bps
        self.at_connect = (rtt, up_bps, down_bps)
        self.measured, self.n = True, 0
        self.counts = {"rtt": [0, 0], "bw": [0, 0], "mixed": [0, 0]}

    def observe(self, up: float, down: float, seconds: float) -> str | None:
        """Fold in one call's link time. Byte-dominated calls correct both bandwidths by the ratio of
        measured to predicted byte time; round-trip-dominated calls correct the round trip; calls in
        between scale both. Each regime that keeps mispredicting by 2x (StarPU's rule, as for
        rates) goes back to its connect-time measurement and relearns."""
        if seconds <= 0:
            return None
        byte_s = up / self.up_bps + down / self.down_bps
        regime = "bw" if byte_s > self.rtt else "rtt" if byte_s < 0.25 * self.rtt else "mixed"
        count = self.counts[regime]
        # as for rates: judged from two samples on (a first call is often a cold one)
        if count[0] >= 2 and abs(math.log(seconds / self.predict(up, down))) > ERROR_LOG:
            count[1] += 1
            if count[1] >= count[0]:
                rtt, up_bps, down_bps = self.at_connect
                if regime != "bw":
                    self.rtt = rtt
                if regime != "rtt":
                    self.up_bps, self.down_bps = up_bps, down_bps
                what = {"rtt": "round trip", "bw": "bandwidth", "mixed": "round trip and bandwidth"}[regime]
                msg = (f"link model ({what}) reset: {count[1]} calls "
                       f"off by more than 2x against {count[0]} that agreed; relearning from the connect-time value")
                self.counts[regime] = [0, 0]
                self.resets += 1
                return msg
            return None
        count[0] += 1
        self.n += 1
        w = 1.0 / min(count[0] + 1, EWMA_AFTER)
        if regime == "bw":
            ratio = min(max((seconds - self.rtt) / byte_s, 0.05), 20.0)
            scale = ratio ** w
            self.up_bps /= scale
            self.down_bps /= scale
        elif regime == "rtt":
            self.rtt += w * (max(seconds - byte_s, 1e-6) - self.rtt)
        else:
            scale = min(max(seconds / self.predict(up, down), 0.05), 20.0) ** w
            self.rtt *= scale
            self.up_bps /= scale
            self.down_bps /= scale
        return None


@dataclass
class RemoteModel:
    """What a decision knows of one worker: its device's rates and its link."""
    device: RateModel
    link: LinkModel = field(default_factory=LinkModel)
    benchmarked: bool = False   # rates from its self-benchmark, not the prior


class Profile:
    """Everything the planner knows: the local model and one RemoteModel per worker."""

    def __init__(self, workers: int = 1, local_prior: dict[str, float] | None = None,
                 worker_prior: dict[str, float] | None = None):
        self.local = RateModel("local", local_prior, learn_siblings=True)
        self.workers = [RemoteModel(RateModel(f"worker {i}", worker_prior, learn_drift=True)) for i in range(workers)]

    @classmethod
    def synthetic(cls, local_gflops: float | dict = 100.0, worker_gflops: float | dict = 1000.0,
                  rtt: float = 100e-6, bandwidth: float = 2e9, workers: int = 1,
                  measured: bool = True) -> "Profile":
        """A profile with flat rates (GFLOP/s per family, or one number for all) and a measured link,
        for tests and what-if pricing. Rates are set as calibration curves, so sigma is SIGMA_CURVE."""
        p = cls(workers)

        def rates(v: float | dict) -> dict:
            return v if isinstance(v, dict) else {f: v for f in FAMILIES}

        for model, gf in [(p.local, rates(local_gflops))] + [(w.device, rates(worker_gflops)) for w in p.workers]:
            for family, rate in gf.items():
                for dtype in ("f8",):
                    model.set_curve(family, dtype, [(1e9, 1e9 / (rate * 1e9))])
        for w in p.workers:
            w.benchmarked = measured
            if measured:
                w.link.set_measured(rtt, bandwidth, bandwidth)
            else:
                w.link.rtt, w.link.up_bps, w.link.down_bps = rtt, bandwidth, bandwidth
        return p

"""Where a stage call runs: a value with its reason, from what this run measured (D173). The run's
planner holds the one :class:`StageDecider` (``Planner.stages``, D347), which prices with its profile.

Per stage and argument shapes: its first ``FIRST_LOCAL`` calls run here and are timed (the
intercepted calls inside them counted); a remote run is then predicted from the link (the bytes to
send and to bring back, at what the link has shown per byte, plus its round trip) and the worker's
time, and taken when it wins by ``MARGIN``. The worker's time is its own measurement once the stage
ran there (D173); before that, this host's time with the intercepted calls inside priced by the
worker's per-op models (the planner's profile, D176). The other place is measured again only while
that costs at most ``EXPLORE_SHARE`` of the time this stage has taken so far, and at least every
``REMEASURE_AFTER`` calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

if TYPE_CHECKING:
    from .model import Profile

FIRST_LOCAL = 2
MARGIN = 1.1           # D173: remote must be predicted this much faster
EXPLORE_SHARE = 0.02   # D173: exploration's budget, a share of the stage's own time
REMEASURE_AFTER = 50
EWMA = 0.5
REUSE_CAP = 3          # D178: the most calls an input passed again is expected in (calls' own cap)
MAX_BUFFERS = 256      # input buffers remembered per stage and argument shapes
DEFAULT_BYTES_S = 1e9  # the link's speed before it has carried a stage: an exploration measures it


class Choice(NamedTuple):
    where: str
    reason: str
    local_s: float | None = None
    remote_s: float | None = None


class Measured(NamedTuple):
    where: str
    wall_s: float
    worker_s: float = 0.0
    sent: int = 0
    received: int = 0
    unsent: int = 0          # input bytes that travelled by value
    inner: dict | None = None
    result_bytes: int = 0
    inner_s: float = 0.0     # of wall_s, the time in the intercepted calls of ``priced``
    priced: dict | None = None  # those calls: plan.Call -> how many


@dataclass
class Stats:
    calls: int = 0
    local_n: int = 0
    remote_n: int = 0
    local_s: float | None = None
    worker_s: float | None = None
    s_per_byte: float | None = None
    unsent: int | None = None
    result_bytes: int = 0
    input_bytes: int = 0
    spent_s: float = 0.0
    since: dict = field(default_factory=lambda: {"local": 0, "remote": 0})  # calls since each was measured
    inner: dict = field(default_factory=dict)
    priced: dict = field(default_factory=dict)  # the latest local run's priced calls: plan.Call -> how many
    inner_s: float | None = None  # ... and their seconds here


Price = Callable[[dict], "float | None"]  # the worker's seconds for {plan.Call: calls}, None: cannot say


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


def arrays(obj: Any, depth: int = 0) -> Iterator[Any]:
    """The ndarrays in ``obj`` and its lists, tuples and dicts (a few levels deep)."""
    if isinstance(getattr(obj, "nbytes", None), int) and hasattr(obj, "dtype"):
        yield obj
    elif depth <= 3 and isinstance(obj, (list, tuple)):
        for o in obj:
            yield from arrays(o, depth + 1)
    elif depth <= 3 and isinstance(obj, dict):
        for o in obj.values():
            yield from arrays(o, depth + 1)


def array_bytes(obj: Any) -> int:
    return sum(a.nbytes for a in arrays(obj))


class Reused:
    """The input buffers one stage's calls keep passing, by address, size, shape and dtype. One
    passed in k earlier calls is priced at 1/(k+1) of its upload, k at most ``REUSE_CAP``: residency
    uploads it once (D178, as for calls' inputs)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, int] = {}

    def priced_bytes(self, obj: Any, kept: Callable[[int], bool]) -> int:
        """The input bytes of a call with arguments ``obj``; ``kept``: whether a size is kept there."""
        if len(self.seen) > MAX_BUFFERS:
            self.seen.clear()
        total = 0.0
        for a in arrays(obj):
            if not kept(a.nbytes) or not hasattr(a, "__array_interface__"):
                total += a.nbytes
                continue
            ident = (a.__array_interface__["data"][0], a.nbytes, a.shape, a.dtype.str)
            k = self.seen.get(ident, 0)
            self.seen[ident] = k + 1
            total += a.nbytes / (min(k, REUSE_CAP) + 1)
        return int(total)


def _shapes(obj: Any, depth: int = 0) -> tuple:
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return (tuple(obj.shape), str(obj.dtype))
    if depth < 3 and isinstance(obj, (list, tuple)):
        return tuple(_shapes(o, depth + 1) for o in obj)
    if depth < 3 and isinstance(obj, dict):
        return tuple((k, _shapes(v, depth + 1)) for k, v in obj.items() if isinstance(k, str))
    return (type(obj).__name__,)


def shape_key(name: str, args: tuple, kwargs: dict) -> tuple:
    """A stage's models are kept per argument shapes and dtypes."""
    return name, _shapes(args), _shapes(kwargs)


class StageDecider:
    """The stage calls' decisions of one run; ``profile``: the planner's, whose worker models price
    the calls inside a stage before it ran there (None: they are not priced)."""

    def __init__(self, policy: str, profile: "Profile | None" = None):
        self.policy = policy
        self.profile = profile
        self.stats: dict[tuple, Stats] = {}
        self.pinned: dict[str, str] = {}  # stage -> why it runs here from now on

    def pin(self, name: str, why: str) -> None:
        self.pinned.setdefault(name, why)

    def _stats(self, key: tuple) -> Stats:
        s = self.stats.get(key)
        if s is None:
            s = self.stats[key] = Stats()
        return s

    def decide(self, name: str, key: tuple, link: Any, input_bytes: int = 0, price: Price | None = None) -> Choice:
        """Where this call runs, and why; ``price``: the worker's seconds for the calls inside, in place
        of the profile's models."""
        s = self._stats(key)
        s.calls += 1
        s.input_bytes = input_bytes or s.input_bytes
        if name in self.pinned:
            return Choice("local", f"pinned here: {self.pinned[name]}")
        if link is None:
            return Choice("local", "no worker ready")
        if self.policy == "remote":
            return Choice("remote", "policy remote")
        if s.local_n < FIRST_LOCAL:
            return Choice("local", f"first {FIRST_LOCAL} calls run here and are measured")
        remote_s, basis = self.predict_remote(s, link, price or self._price_on(link))
        local_s = s.local_s or 0.0
        best, other = ("remote", "local") if remote_s * MARGIN < local_s else ("local", "remote")
        extra = abs(remote_s - local_s)
        due = s.since[other] >= REMEASURE_AFTER or (other == "remote" and s.remote_n == 0)
        if due and extra <= EXPLORE_SHARE * s.spent_s:
            return Choice(other, f"exploring: {other} measured again (predicted {remote_s:.3g}s there, "
                                 f"{basis}, {local_s:.3g}s here)", local_s, remote_s)
        return Choice(best, f"predicted {remote_s:.3g}s there ({basis}) vs {local_s:.3g}s here (margin {MARGIN})",
                      local_s, remote_s)

    def _price_on(self, link: Any) -> Price | None:
        """The worker's seconds for a stage's intercepted calls, from its per-op models (D176)."""
        workers = getattr(self.profile, "workers", ())
        index = getattr(link, "index", len(workers))
        if index >= len(workers):
            return None
        device = workers[index].device

        def price(calls: dict) -> float:
            return sum(n * device.predict(c.op, c.family, c.dtype, c.flops)[0] for c, n in calls.items())
        return price

    def predict_remote(self, s: Stats, link: Any, price: Price | None = None) -> tuple[float, str]:
        """(seconds, what the worker's share rests on)."""
        rtt = getattr(link, "rtt_s", None) or 0.0
        unsent = s.input_bytes if s.unsent is None else s.unsent
        if s.s_per_byte is not None:  # what stage calls measured, both ways
            moving = s.s_per_byte * (unsent + s.result_bytes)
        else:
            up, down = getattr(link, "bandwidth", None) or (DEFAULT_BYTES_S, DEFAULT_BYTES_S)
            moving = unsent / up + s.result_bytes / down
        worker_s, basis = self._worker_s(s, price)
        return rtt + moving + worker_s, basis

    @staticmethod
    def _worker_s(s: Stats, price: Price | None) -> tuple[float, str]:
        if s.worker_s is not None:
            return s.worker_s, "measured there"
        local_s = s.local_s or 0.0
        there = price(s.priced) if price is not None and s.priced else None
        if there is None:
            return local_s, "the worker assumed as fast as here"
        n = sum(s.priced.values())
        # D176: the stage's own Python and the calls not intercepted run there as fast as here
        return max(local_s - (s.inner_s or 0.0), 0.0) + there, f"the worker's models for its {n} calls inside"

    def learn(self, name: str, key: tuple, m: Measured) -> None:
        s = self._stats(key)
        s.spent_s += m.wall_s
        for where in s.since:
            s.since[where] += 1
        s.since[m.where] = 0
        if m.where == "local":
            s.local_n += 1
            s.local_s = _ewma(s.local_s, m.wall_s)
            # calls that stayed under their floors leave no record: the run that showed most is kept
            if m.priced and sum(m.priced.values()) >= sum(s.priced.values()):
                s.priced, s.inner_s = m.priced, m.inner_s
            for op, (n, nbytes) in (m.inner or {}).items():
                got = s.inner.setdefault(op, [0, 0])
                got[0] += n
                got[1] += nbytes
            return
        s.remote_n += 1
        s.worker_s = _ewma(s.worker_s, m.worker_s)
        moved = m.sent + m.received
        if moved:
            s.s_per_byte = _ewma(s.s_per_byte, max(m.wall_s - m.worker_s, 0.0) / moved)
        s.unsent = m.unsent

    def note_result(self, name: str, key: tuple, result_bytes: int, input_bytes: int = 0) -> None:
        s = self._stats(key)
        s.result_bytes = result_bytes
        if input_bytes:
            s.input_bytes = input_bytes

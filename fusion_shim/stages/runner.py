"""The stages of one run: each call decided once by the run's planner (``Planner.stages``, D347),
run here or on a worker (:mod:`.remote`), checked where sampled, and recorded in the run's ledger as
op ``stage NAME``. The runtime makes the one Runner of a run, on a stage's first call."""
from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import transport
from ..client.call import fell_back, strict_error, wait_cold
from ..config import Config
from ..errors import FallbackKind as Why
from ..ledger import Ledger, Record, call_site
from ..plan.stages import Measured, Reused, StageDecider, array_bytes, shape_key
from ..verify import Sampler
from .state import Raised, RemoteTraceback

if TYPE_CHECKING:
    from ..client.link import WorkerLink
    from ..plan import Planner


class Runner:
    """``planner`` and ``link``: the runtime's, made on first need (the planner learns what the calls
    left it before it is read, D47); ``guard``: its re-entrancy guard (D336)."""

    def __init__(self, config: Config, ledger: Ledger, guard: Any, planner: "Callable[[], Planner]",
                 link: "Callable[[], WorkerLink | None]"):
        self.config, self.ledger, self.guard = config, ledger, guard
        self._planner, self._first_link = planner, link
        self.held: dict[str, set] = {}       # link url -> fingerprints its stage process holds
        self.by_value: set[str] = set()      # stages whose reference the worker could not import
        self.noted: set[str] = set()         # the worker's notes already said as events
        self.sampled = Sampler(config.verify)  # --verify's share of stage calls
        self.reused: dict[tuple, Reused] = {}      # per stage and argument shapes

    @property
    def decider(self) -> StageDecider:
        """The run's one stage decider, the planner's (D347)."""
        return self._planner().stages

    def call(self, stage: Any, args: tuple, kwargs: dict) -> Any:
        key = shape_key(stage.name, args, kwargs)
        phases: dict[str, float] = {}
        link = self._link(phases)
        choice = self.decider.decide(stage.name, key, link, self._input_bytes(key, args, kwargs))
        rec = Record(f"stage {stage.name}", "stage", site=call_site(3), reason=choice.reason,
                     predicted_local_s=choice.local_s, predicted_remote_s=choice.remote_s,
                     thread=threading.get_ident(), kind="local")
        rec.phases.update(phases)
        rec.start_s = self.ledger.now()
        t = time.perf_counter()
        if choice.where == "remote":
            done, value = self._remote(stage, key, link, args, kwargs, rec)
            if done:
                rec.wall_s = time.perf_counter() - t
                if isinstance(value, Raised):  # D216: as a local run records it
                    rec.raised = type(value.exc).__name__
                self.ledger.add(rec)
                if isinstance(value, Raised):
                    _raise(value.exc)
                return value
            if self.config.strict:  # a fallback is an error in strict mode, as for calls; the stage is not run
                rec.wall_s = time.perf_counter() - t
                self.ledger.add(rec)
                raise strict_error(rec, "would run here")
        return self._local(stage, key, args, kwargs, rec, t)

    def _link(self, phases: dict) -> Any:
        """The first worker's link where it is ready (a stage goes there only): waited for as a call waits."""
        link = self._first_link()
        if link is None:
            return None
        wait_cold(self.config, [link], phases)  # D336
        if not link.ready.is_set():
            return None
        if link.bandwidth is None:  # D176: a stage's bytes are priced at the link's measured speed
            link.measure_bandwidth_soon()
        return link

    def _input_bytes(self, key: tuple, args: tuple, kwargs: dict) -> int:
        """The bytes a remote run would upload, those passed again priced by their share (D178)."""
        if not self.config.residency:
            return array_bytes((args, kwargs))
        from ..protocol.fingerprint import worth_keeping

        reused = self.reused.get(key)
        if reused is None:
            reused = self.reused[key] = Reused()
        return reused.priced_bytes((args, kwargs), worth_keeping)

    def _local(self, stage: Any, key: tuple, args: tuple, kwargs: dict, rec: Record, t: float) -> Any:
        ledger = self.ledger
        seen: list[Record] = []
        ledger.taps[rec.thread] = seen
        guard = self.guard  # D336: the stages it calls run plain (Stage), its NumPy calls as calls
        guard.stages = getattr(guard, "stages", 0) + 1
        try:
            value = stage.fn(*args, **kwargs)
        except BaseException as exc:
            rec.raised = type(exc).__name__
            raise
        finally:
            guard.stages -= 1
            ledger.taps.pop(rec.thread, None)
            rec.wall_s = rec.phases["local"] = time.perf_counter() - t
            inner, priced, inner_s = _inner(seen)
            self.decider.learn(stage.name, key, Measured("local", rec.wall_s, inner=inner, inner_s=inner_s,
                                                          priced=priced))
            ledger.add(rec)
        self.decider.note_result(stage.name, key, array_bytes(value))
        return value

    def _remote(self, stage: Any, key: tuple, link: Any, args: tuple, kwargs: dict, rec: Record) -> tuple[bool, Any]:
        """(True, value) when the worker answered; (False, None) to compute it here (the record says why)."""
        from . import remote
        from .verifying import Check

        name = stage.name
        by_value = name in self.by_value
        try:
            ref = None if by_value else remote.code.by_reference(stage.fn)
            packed = remote.pack(stage.fn, args, kwargs, ref is None, self.config.residency)
        except Exception as exc:  # an argument cloudpickle cannot carry: this stage stays here
            self.decider.pin(name, f"its arguments do not pickle ({type(exc).__name__}: {exc})"[:200])
            rec.kind, rec.fallback, rec.reason = "fallback", Why.UNENCODABLE, self.decider.pinned[name]
            return False, None
        check = Check.maybe(self, packed)
        held = self.held.setdefault(link.url, set())
        t = time.perf_counter()
        try:
            try:
                out = remote.send(link, stage.fn, ref, packed, held, self.config.timeout)
            except remote.Failed as exc:
                if getattr(exc, "kind", None) != "code_missing":
                    raise
                self.by_value.add(name)
                self.ledger.event(f"stage {name}: the worker cannot import it ({exc}); sent by value")
                packed = remote.pack(stage.fn, args, kwargs, True, self.config.residency)
                out = remote.send(link, stage.fn, None, packed, held, self.config.timeout)
        except remote.Refused as exc:
            self.decider.pin(name, f"the worker refuses code: {exc}")
            rec.kind, rec.fallback, rec.reason = "fallback", Why.REFUSED, self.decider.pinned[name]
            self.ledger.event(f"stage {name} runs here: {rec.reason}")
            return False, None
        except transport.TransportError as exc:
            fell_back(rec, exc)
            if not isinstance(exc, remote.Failed):  # an error reply is about this stage, not the worker
                link.fault(exc)
            return False, None
        wall = time.perf_counter() - t
        if out.note and out.note not in self.noted:
            self.noted.add(out.note)
            self.ledger.event(f"stage {name}: {out.note}")
        rec.kind, rec.worker = "worker", link.index
        rec.bytes_sent, rec.bytes_received = out.sent, out.received
        rec.resident_hits, rec.bytes_saved = out.by_ref, out.saved
        rec.phases.update(kernel=out.worker_s, transfer=max(wall - out.worker_s, 0.0))
        sent_bytes = sum(a.nbytes for a, fp in zip(packed.arrays, packed.fps) if fp is None or fp not in held)
        self.decider.learn(name, key, Measured("remote", wall, worker_s=out.worker_s, sent=out.sent,
                                               received=out.received, unsent=sent_bytes))
        value = Raised(out.value) if out.raised else out.value
        if check is not None:
            value = check.finish(stage, args, kwargs, value, rec)
        return True, value


def _raise(exc: BaseException) -> None:
    """Raise a stage's exception, caused by its frames on the worker where it carries them (D216)."""
    from ..protocol.code import STAGE_TRACEBACK  # loaded already: the answer came through it

    frames = getattr(exc, "__dict__", {}).pop(STAGE_TRACEBACK, None)
    if isinstance(frames, str):
        raise exc from RemoteTraceback(frames)
    raise exc


def _inner(seen: list[Record]) -> tuple[dict, dict, float]:
    """The intercepted calls a stage made while it ran here: op -> [calls, input bytes]; the ones
    the planner priced, plan.Call -> calls; and the seconds those took."""
    inner: dict[str, list] = {}
    calls: dict[Any, int] = {}
    inner_s = 0.0
    for r in seen:
        if r.op.startswith("stage "):
            continue
        got = inner.setdefault(r.op, [0, 0])
        got[0] += 1
        got[1] += sum(math.prod(shape) * np.dtype(dt).itemsize for shape, dt in zip(r.shapes, r.dtypes))
        planned = getattr(r, "plan", None)
        if planned is not None:
            calls[planned.call] = calls.get(planned.call, 0) + 1
            inner_s += r.wall_s
    return inner, calls, inner_s

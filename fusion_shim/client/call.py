"""One intercepted call that is a candidate, from its arguments to the worker's answer or a record
of why it runs here: prepare, decide (once), send, fall back.

The decision is one step (:meth:`CallPath.decide`): the planner's, asked once (D310) with the
workers as this client finds them: what they hold of the inputs where those may be resident (D30),
a link measured first where it is not yet and that could move the call (D25). Any fault on the
way to the worker (no reply by the deadline, a dead worker, an error reply, a malformed reply) is
recorded and the call is computed here: a fault costs time, never an exception or a wrong answer.
Each call's deadline follows its prediction once that worker has answered the op (D27).
"""
from __future__ import annotations

import inspect
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from .. import plan, transport
from ..catalog import OpSpec, Prepared, Unsupported, prepare
from ..config import Config
from ..errors import FallbackError, FallbackKind as Why
from ..ledger import Ledger, Record, call_site
from ..protocol import wire
from . import remote, repeat, residency
from .checks import Checks, Done
from .link import WorkerLink
from .residency import HashRate, Reuse, Wired

DEADLINE_FLOOR_S = 5.0   # D27: per-call deadline: max(floor, factor x predicted), capped by Config.timeout,
DEADLINE_FACTOR = 20.0   # once the family has a measured worker time (before that: Config.timeout)
SYNC_LINK_PROBE_S = 0.05  # D25: a call predicted to take this long here waits for its link's first bandwidth
SYNC_LINK_PROBE_RTTS = 100  # probe, and this many of the link's round trips


class Planned(NamedTuple):
    """What the planner decided for one call, kept on its record (``rec.plan``, not a field: the
    record's fields are what the report serialises) until the call is timed and learnt from."""
    call: plan.Call
    decision: plan.Decision
    inputs_up: int | None = None  # the fewest input bytes a worker could be priced for, where looked at


class CallPath:
    """The calls of one run; ``links`` is the runtime's list, filled when the workers start."""

    def __init__(self, config: Config, ledger: Ledger, planner: plan.Planner, links: list[WorkerLink],
                 checks: Checks, hash_rate: HashRate, reuse: Reuse):
        self.config = config
        self.ledger = ledger
        self.planner = planner
        self.links = links
        self.checks = checks
        self.hash_rate = hash_rate  # how fast this process fingerprints inputs (what a look costs)
        self.reuse = reuse  # inputs this process keeps passing to remote candidates
        self._inflight_lock = threading.Lock()
        self.templates: dict[tuple, repeat.Template] = {}  # D45: (op, layout key) -> what its first call made
        self.repeated = 0  # the run's calls a worker answered that were sent from a template (a cleared ledger forgets)
        # D47: under policy remote, what calls sent from a template leave the planner to learn, in order
        self.unlearnt: deque = deque()
        self._defer_learning = config.policy == "remote"

    def run(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> Done | Record:
        """``Done`` (the worker's answer, to be checked) or a ``Record`` (compute here, then
        :meth:`local_done`)."""
        t0 = time.perf_counter()
        rec = Record(spec.name, spec.family, site=call_site(4), start_s=t0 - self.ledger.started,
                     thread=threading.get_ident())
        try:
            return self._run(spec, sig, args, kwargs, rec, t0)
        except KeyboardInterrupt:  # Ctrl-C while it waited: the report still shows the call
            rec.kind, rec.fallback, rec.reason = "fallback", Why.INTERRUPTED, "interrupted before it ran"
            rec.raised = "KeyboardInterrupt"
            rec.wall_s = time.perf_counter() - t0
            self.ledger.add(rec)
            raise

    def _run(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict, rec: Record,
             t0: float) -> Done | Record:
        seen = _ERR_SEEN  # D346: the error state unchanged since it was last read: its answer without a call
        here, watch = seen[1] if _errobj.get() is seen[0] else fp_state()
        if here is not None:  # D198: NumPy's error state asks for what no result shows
            rec.kind, rec.fallback, rec.reason = "fallback", Why.ERROR_STATE, here
            return rec
        key = repeat.layout_key(args, kwargs) if spec.repeat else None  # D45: repeat.repeatable's fact, D351: read here
        tmpl = self.templates.get((spec.name, key)) if key is not None else None
        fresh = False  # no template for this key yet: this call may leave one
        if tmpl.__class__ is repeat.Template and self._may_repeat(spec, tmpl, rec):
            prep, call, wired = tmpl.prepared(args, kwargs), tmpl.call, None
            planned = self._repeat_decision(spec, tmpl, prep, rec)
        else:
            fresh, tmpl = tmpl is None and key is not None, None
            prep = self._prepare(spec, sig, args, kwargs, rec)
            if prep is None:  # unsupported, pinned, or no worker has its kernel: the record says so
                return rec
            call = plan.Call(spec.name, spec.family, _dtype_code(prep), prep.flops, prep.bytes_in, prep.bytes_out)
            planned, wired = self.decide(spec, call, prep, rec)
        decision = planned.decision
        rec.plan = planned
        rec.reason = decision.reason
        rec.predicted_local_s, rec.predicted_remote_s = decision.local_s, decision.remote_s
        if decision.where == "local":
            # under policy remote every supported call was meant for the worker: that is a fallback
            rec.kind = "fallback" if self.config.policy == "remote" else "local"
            if rec.kind == "fallback":  # D323: the planner's own failure says so in its reason
                rec.fallback = Why.INTERNAL_ERROR if rec.reason.startswith("planner error") else Why.NO_WORKER_READY
            return rec
        got = self._send(spec, call, decision, prep, rec, wired, t0, tmpl, watch)
        if tmpl is not None:
            rec.repeated = got.__class__ is Done
            self.repeated += rec.repeated
        elif (fresh and got.__class__ is Done and wired is None and len(self.templates) < repeat.TEMPLATES_MAX
              and (not self.config.residency or residency.holds_nothing(prep))):  # D38: nothing a worker keeps
            made = repeat.make(prep, args, kwargs, call, rec.shapes, rec.dtypes)
            if made is not None:
                self.templates[(spec.name, key)] = made
        return got

    # -- a call repeating an earlier one's layout (D45) -------------------------------------------
    def _may_repeat(self, spec: OpSpec, tmpl: repeat.Template, rec: Record) -> bool:
        """Whether what :meth:`_prepare` would do for this call is what it did for the template's:
        the same signature is not pinned, some worker is up (a cold one is waited for there), one
        offers the kernel."""
        rec.shapes, rec.dtypes = tmpl.shapes, tmpl.dtypes  # D351: shared, never changed in place (as_dict copies)
        checks = self.checks  # D351: nothing pinned (the norm) is seen without a call
        if (checks.pinned_checks or checks.pinned) and checks.pinned_reason(rec, tmpl.op_key) is not None:
            return False
        for link in self.links:
            if link.ready.is_set():
                return self._unoffered(spec) is None
        return False

    def _repeat_decision(self, spec: OpSpec, tmpl: repeat.Template, prep: Prepared, rec: Record) -> Planned:
        """The call's decision: under policy remote with one ready worker, the template's for
        ``REPRICE_EVERY`` calls (there the planner only prices it for the report); else made afresh."""
        if self.config.policy != "remote" or len(self.links) != 1:
            return self.decide(spec, tmpl.call, prep, rec)[0]
        planned = tmpl.planned
        if planned is None or tmpl.uses >= repeat.REPRICE_EVERY or self.links[0].state not in ("ready", "busy"):
            planned = tmpl.planned = self.decide(spec, tmpl.call, prep, rec)[0]  # after learning what is left
            tmpl.uses = 0
        tmpl.uses += 1
        return planned

    # -- prepare ----------------------------------------------------------------------------------
    def _prepare(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict,
                 rec: Record) -> Prepared | None:
        """The call laid out for the worker, or None where it cannot go to one (``rec`` says why)."""
        try:
            prep = prepare(spec, sig, args, kwargs)
        except Unsupported as exc:
            rec.kind, rec.reason = "unsupported", str(exc)
            return None
        rec.shapes = [list(a.shape) for a in prep.arrays]
        rec.dtypes = [a.dtype.str for a in prep.arrays]
        pinned = self.checks.pinned_reason(rec, (spec.kernel_id, tuple(rec.dtypes)))
        if pinned is not None:
            rec.kind, rec.reason = pinned
            rec.fallback = Why.PINNED if rec.kind == "fallback" else None
            return None
        wait_cold(self.config, self.links, rec.phases)
        unoffered = self._unoffered(spec)
        if unoffered is not None:
            rec.kind, rec.reason = "unsupported", unoffered
            return None
        return prep

    def _unoffered(self, spec: OpSpec) -> str | None:
        """Why no worker can run this row (a numba row where no worker has numba-cuda)."""
        kernel_id = spec.kernel_id
        for link in self.links:
            if link.offers(kernel_id):
                return None
        if not self.links:
            return None
        return f"the worker has no kernel {spec.kernel_id} (numba: {self.links[0].info.get('numba')})"

    # -- decide, once -------------------------------------------------------------------------------
    def decide(self, spec: OpSpec, call: plan.Call, prep: Prepared, rec: Record) -> tuple[Planned, Wired | None]:
        """The call's decision, and its inputs laid out for the wire where they were looked at. D310:
        the planner is asked once, with the workers as :meth:`_snapshot` found them for this call."""
        if self.unlearnt:
            self.learn()
        states, priced, wired, inputs_up = self._snapshot(spec, call, prep, rec)
        return Planned(call, self.planner.decide(call, states, priced), inputs_up), wired

    def _snapshot(self, spec: OpSpec, call: plan.Call, prep: Prepared,
                  rec: Record) -> tuple[list[plan.WorkerState], plan.Decision | None, Wired | None, int | None]:
        """Each worker as the planner is to see the call (its state and queue), with what it holds of
        the inputs where the call is a remote candidate (:meth:`_priced_by_residency`, D30), its link
        measured first where that could move the call (:meth:`_measure_links`, D25); each step judged
        on what was found before it, priced without deciding (Planner.price). Returns (the states,
        their pricing where it is still theirs, the inputs wired where looked at, ``inputs_up``)."""
        unknown = [None] * len(self.links)
        states = self._states(spec, unknown)
        priced = self.planner.price(call, states)
        wired, to_send, inputs_up = None, None, None
        if self._worth_looking(spec, call, priced):
            if residency.holds_nothing(prep):  # D38: what a look would find: every input travels
                inputs_up = prep.bytes_in
            else:
                wired, to_send, inputs_up = self._priced_by_residency(prep, rec)
                if any(bytes_priced != prep.bytes_in for bytes_priced, _ in to_send):
                    states = self._states(spec, *zip(*to_send))
                    priced = self.planner.price(call, states)
        if self._measure_links(spec, call, priced, rec):
            states = self._states(spec, *(zip(*to_send) if to_send is not None else (unknown,)))
            priced = None  # the link's model moved: the decision prices it
        return states, priced, wired, inputs_up

    def _worth_looking(self, spec: OpSpec, call: plan.Call, priced: plan.Decision | None) -> bool:
        """D30: fingerprint only a remote candidate: a call that goes to a worker, or one that would if
        its inputs were already there by more than hashing them costs, or one for which where its
        inputs are decides whether it is evidence for its op's floor (``priced``: as the call stands)."""
        return bool(self.config.residency and self.links and priced is not None and priced.remote_s is not None and (
            priced.where == "worker" or self._would_offload_if_resident(spec, call)
            or self.planner.residency_decides(call, priced)))

    def _priced_by_residency(self, prep: Prepared, rec: Record) -> tuple[Wired, list, int]:
        """The inputs fingerprinted; per worker (input bytes it is priced for, bytes priced over
        their reuse), and the fewest any worker could be priced for: the one that holds them is
        preferred."""
        t = time.perf_counter()
        wired = Wired(prep.arrays)
        rec.phases["fingerprint"] = spent = time.perf_counter() - t
        self.hash_rate.observe(wired.hashed, spent)
        # D349: a reused input's upload is shared over its reuse once it recurs at a site (a loop)
        to_send = [wired.to_send(link.mirror, self.reuse, rec.site) for link in self.links]
        inputs_up = min(wired.least_to_send(link.mirror, self.reuse) for link in self.links)
        self.reuse.note(wired.fps, rec.site)
        return wired, to_send, inputs_up

    def _would_offload_if_resident(self, spec: OpSpec, call: plan.Call) -> bool:
        """Would some ready worker take the call if it held every input, with the time hashing them
        to find out added to its side? A look that costs more than the call could gain (a
        matrix-vector product reads its matrix once) loses even when they are there. (Pure: no
        learning.)"""
        look = self.hash_rate.seconds(call.bytes_in)
        states = [replace(w, backlog_s=w.backlog_s + look)
                  for w in self._states(spec, [0] * len(self.links))]
        priced = self.planner.price(call, states, explore=False)
        return priced is not None and priced.where == "worker"  # None: a planner bug, no residency for it

    def _measure_links(self, spec: OpSpec, call: plan.Call, decision: plan.Decision | None, rec: Record) -> bool:
        """D25: a worker is in the running for this call, its link aside: the link's bandwidth is
        worth measuring now (priced with the prior until then; where even a free link would leave
        the call here, never; under policy remote nothing is decided, and the probe's traffic would
        only blur the counts). Returns whether a probe was made on this thread, so that the call is
        decided with the measured link; so is the next call to want it after the probe's thread
        found the program busy (WorkerLink.measure_bandwidth_soon)."""
        if not (self.config.policy == "auto" and decision is not None and decision.remote_s is not None
                and decision.local_s is not None
                and any(link.bandwidth is None for link in self.links) and (decision.where == "worker" or (
                    self.planner.link_could_matter(call, self._states(spec, [None] * len(self.links)))))):
            return False
        t = time.perf_counter()
        probed = False
        for link in self.links:
            if link.bandwidth is None:
                # the probe takes a few round trips and ~1-4 MB: waited for only where that is small
                wait = decision.local_s >= max(SYNC_LINK_PROBE_S, SYNC_LINK_PROBE_RTTS * (link.rtt_s or 1.0))
                probed = link.measure_bandwidth_soon(wait) or probed
        if probed:
            rec.phases["link_probe"] = time.perf_counter() - t
        return probed

    def _states(self, spec: OpSpec, missing: Any, reused: Any = None) -> list[plan.WorkerState]:
        """Each worker as the planner sees it for this call (``missing``, ``reused``: per worker, as
        plan_state takes them); one without the row's kernel is no candidate."""
        return [link.plan_state(m, r) if link.offers(spec.kernel_id) else plan.WorkerState("without-kernel",
                                                                                            name=link.url or "")
                for link, m, r in zip(self.links, missing, reused or [0] * len(self.links))]

    # -- send, and fall back ----------------------------------------------------------------------
    def _send(self, spec: OpSpec, call: plan.Call, decision: plan.Decision, prep: Prepared, rec: Record,
              wired: Wired | None, t0: float, tmpl: repeat.Template | None = None,
              watch: bool = False) -> Done | Record:
        link = self.links[decision.worker or 0]
        predicted = decision.remote_s
        deadline_s, bounded = self._deadline(link, call, decision)
        with self._inflight_lock:
            link.queued(+1, predicted)
        t_sent = time.perf_counter()
        try:
            value, seconds, kernel_s = remote.send(prep, rec, link, wired, deadline_s, tmpl, watch)
            # the device model learns the kernel's time; the link model everything else of the round
            # trip, with the bytes that crossed it (socket and shared memory)
            sent, received = rec.bytes_sent + rec.shm_sent, rec.bytes_received + rec.shm_received
            learnt = (link.index, call, decision, seconds, kernel_s, sent, received)
            if tmpl is not None and self._defer_learning:
                self.unlearnt.append(learnt)
                if len(self.unlearnt) >= repeat.REPRICE_EVERY:
                    self.learn()
            else:
                self.planner.observed_remote(*learnt)
        except transport.Timeout as exc:
            if not bounded:
                return self._failed(exc, rec, link, call, spec, t_sent, deadline_s, predicted)
            return self._abandoned(rec, link, call, decision, t_sent)
        except transport.TransportError as exc:
            return self._failed(exc, rec, link, call, spec, t_sent, deadline_s, predicted)
        except remote.ReportedHere as exc:  # D198: the worker is fine; NumPy reports what the result holds
            rec.kind, rec.fallback, rec.reason = "fallback", Why.ERROR_STATE, str(exc)
            return rec
        except wire.Unencodable as exc:  # D263: this side's request, not the worker: nothing was sent
            rec.kind, rec.fallback = "fallback", Why.UNENCODABLE
            rec.reason = f"the request could not be encoded here: {exc}"[:300]
            return rec
        except Exception as exc:
            # a bug on the shim's own remote path (not NumPy's error, not the worker's: NumPy runs
            # after this, in the caller's frame) must not reach the program either
            link.fault(exc)
            rec.kind, rec.fallback = "fallback", Why.INTERNAL_ERROR
            rec.reason = f"internal error: {type(exc).__name__}: {exc}"[:300]
            return rec
        finally:
            with self._inflight_lock:
                link.queued(-1, predicted)
        rec.kind, rec.worker = "worker", link.index
        rec.wall_s = time.perf_counter() - t0
        link.answered.add((call.op, call.dtype))
        link.answered_call(sent, received)
        return Done(value, rec, prep)

    def learn(self) -> None:
        """D47: the planner learns what the calls sent from a template under policy remote left, in
        their order (before any decision, any fault's lesson, and anything that reads it)."""
        unlearnt, observed = self.unlearnt, self.planner.observed_remote
        while True:
            try:
                learnt = unlearnt.popleft()
            except IndexError:
                return
            observed(*learnt)

    def _deadline(self, link: WorkerLink, call: plan.Call, decision: plan.Decision) -> tuple[float, bool]:
        """(seconds the call may wait for its reply, whether running out is an abandoned exploration)."""
        deadline_s = self.config.timeout
        if decision.remote_s is not None and (call.op, call.dtype) in link.answered:
            deadline_s = min(deadline_s, max(DEADLINE_FLOOR_S, DEADLINE_FACTOR * decision.remote_s))
        # D28: an exploration's cost is bounded: past this it is computed here; not where the worker
        # computes on this machine's CPUs, where the abandoned call would go on competing with the
        # local one (there the planner prices explorations more pessimistically instead)
        bounded = decision.explore and not link.cpus_shared
        if bounded:
            deadline_s = min(deadline_s, self.planner.explore_deadline(decision))
        return deadline_s, bounded

    def _abandoned(self, rec: Record, link: WorkerLink, call: plan.Call, decision: plan.Decision,
                   t_sent: float) -> Record:
        """An exploration out of its deadline: not a fault (the worker is up, only slower than
        hoped); the late reply is dropped when it comes, and the call runs here. The worker may
        still be computing it: its next answers, measured, will show that."""
        waited = time.perf_counter() - t_sent
        self.planner.abandoned(link.index, call, waited)
        rec.phases["abandoned"] = waited
        rec.kind = "local"
        rec.reason = (f"exploration abandoned after {waited * 1e3:.3g} ms (predicted {(decision.remote_s or 0) * 1e3:.3g} "
                      f"ms there, {(decision.local_s or 0) * 1e3:.3g} ms here): computed here")
        rec.plan = Planned(call, plan.Decision("local", rec.reason, decision.local_s, decision.remote_s))
        if self.planner.explorations_abandoned == 1:
            self.ledger.event(f"an exploration of {call.op} on {link.url} was abandoned after "
                              f"{waited * 1e3:.3g} ms and computed here (explorations' cost is bounded "
                              "by their budget; the report's planner section counts them)")
        return rec

    def _failed(self, exc: Exception, rec: Record, link: WorkerLink, call: plan.Call, spec: OpSpec,
                t_sent: float, deadline_s: float, predicted: float | None) -> Record:
        """A call the link failed: a fallback, said in its record; the link is faulted unless the
        worker only answered this call with an error."""
        detail = ""
        if isinstance(exc, transport.Timeout):
            detail = f" ({deadline_s:.3g} s: predicted {predicted or 0:.3g} s)"
            # it took at least this long: the next prediction for the op moves up
            self.learn()
            self.planner.timed_out(link.index, call, time.perf_counter() - t_sent)
        if isinstance(exc, (transport.WorkerDied, transport.WorkerLost)):
            self.checks.count_crash((spec.kernel_id, tuple(rec.dtypes)), exc)
        if not isinstance(exc, remote.WorkerFault):  # an error reply is about this call, not the worker
            link.fault(exc)
        return fell_back(rec, exc, detail)

    # -- after a local computation ------------------------------------------------------------------
    def local_done(self, rec: Record, seconds: float, exc: BaseException | None) -> None:
        """A call computed here, in the caller's frame: timed, learnt from, recorded."""
        rec.phases["local"] = seconds
        rec.wall_s = time.perf_counter() - self.ledger.started - rec.start_s
        if exc is not None:  # D351: a record's own ``raised`` only where it has one
            rec.raised = type(exc).__name__
        if isinstance(exc, Exception):  # D281: the program's error (a singular matrix) is NumPy's, never a fallback
            # why it ran here stays said, but for a worker's refusal of the same input (its fault text misleads)
            why = f"; here: {rec.reason}" if rec.reason and "WorkerFault" not in rec.reason else ""
            rec.kind, rec.reason = "raised", f"{rec.raised}: {str(exc)[:100]}{why}"[:400]
            rec.fallback = None  # NumPy's error, not a fallback
        planned: Planned | None = getattr(rec, "plan", None)
        if planned is not None and exc is None:
            self.planner.observed_local(planned.call, planned.decision, seconds, planned.inputs_up)
        self.ledger.add(rec)
        if self.config.strict and exc is None and rec.kind in ("unsupported", "fallback"):
            raise strict_error(rec, f"ran locally ({rec.kind})")


def wait_cold(config: Config, links: list[WorkerLink], phases: dict) -> None:
    """Under policy remote, the first of ``links`` waited for while it is cold and none is ready (up
    to ``ready_timeout``), the wait kept as ``phases["wait_ready"]``: a call's and a stage's (D336)."""
    # only a cold worker is waited for; one that faulted is probed in the background instead
    first = links[0] if links else None
    if (config.policy == "remote" and first is not None and first.state == "starting"
            and not any(link.ready.is_set() for link in links)):
        waited = time.perf_counter()
        try:
            first.wait_ready(config.ready_timeout, while_starting=True)
        finally:
            phases["wait_ready"] = time.perf_counter() - waited


def fell_back(rec: Record, exc: Exception, detail: str = "") -> Record:
    """``rec`` as a fallback for a fault on the way to the worker: its kind and the fault in words."""
    rec.kind, rec.fallback = "fallback", fault_kind(exc)
    rec.reason = f"{type(exc).__name__}: {exc}{detail}"[:300]
    return rec


def strict_error(rec: Record, ran: str) -> FallbackError:
    """Strict mode's error for a call or a stage that ``ran`` here (``rec``: its record)."""
    # a fallback recorded without its kind would be the shim's own slip
    kind = Why.UNSUPPORTED if rec.kind == "unsupported" else rec.fallback or Why.INTERNAL_ERROR
    return FallbackError(kind, f"{rec.op} at {rec.site} {ran}: {rec.reason}")


_REPLY_KINDS = {"busy": Why.BUSY, "refused": Why.REFUSED, "out_of_memory": Why.OUT_OF_MEMORY}
# by the exception's name where it says more than its kind: the kernel's own refusal (worker/kernels),
# a stage past its deadline on the worker (worker/stages)
_REPLY_EXCS = {"NotReproducible": Why.NOT_REPRODUCIBLE, "StageTimeout": Why.TIMEOUT}


def fault_kind(exc: Exception) -> Why:
    """D323: the kind of a fault on the way to the worker, a call's or a stage's (D335), by its
    exception (an error reply: by the worker's error kind, ``wire.ERROR_KINDS``)."""
    if isinstance(exc, remote.WontFit):
        return Why.OUT_OF_MEMORY
    if isinstance(exc, remote.WorkerFault):
        named = _REPLY_EXCS.get(exc.exc)
        return named if named is not None else _REPLY_KINDS.get(exc.kind, Why.WORKER_FAULT)
    if isinstance(exc, transport.Timeout):
        return Why.TIMEOUT
    if isinstance(exc, transport.BadReply):
        return Why.BAD_REPLY
    if isinstance(exc, (transport.Refused, transport.Unauthenticated)):
        return Why.REFUSED
    return Why.WORKER_LOST  # died, lost, never listening, a socket error: the worker is out of reach


try:  # D200: np.seterr, np.errstate and np.seterrcall replace this object, never change it
    from numpy._core.umath import _extobj_contextvar as _errobj
except ImportError:  # pragma: no cover - a NumPy that moved it: read np.geterr() each call (D351: its get() is None)
    import contextvars

    _errobj = contextvars.ContextVar("fusion_shim_errstate_unknown", default=None)
_ERR_SEEN: tuple = (object(), (None, True))  # (the last error-state object read, what it asked for)
_NONFINITE = ("divide", "over", "invalid")


def fp_state() -> tuple[str | None, bool]:
    """What NumPy's error state asks of an offloaded call: (why it must run here whatever its
    result, or None; whether a result holding inf or nan must run here). D200: read once per state
    object, not per call (np.geterr() costs microseconds)."""
    global _ERR_SEEN
    obj = _errobj.get()
    seen = _ERR_SEEN
    if obj is not None and obj is seen[0]:
        return seen[1]
    err = np.geterr()
    here = None
    if err["under"] != "ignore":
        here = (f"np.geterr() has under={err['under']!r}: underflow leaves no trace in a worker's result, "
                "so NumPy computes the call here")
    got = (here, any(err[k] != "ignore" for k in _NONFINITE))
    if obj is not None:
        _ERR_SEEN = (obj, got)  # one tuple, swapped whole: a racing thread reads either pair
    return got


_codes: dict[Any, str] = {}  # D43: a compute dtype's code, made once per dtype


def _dtype_code(prep: Prepared) -> str:
    """The compute dtype as the planner's models key it: "f8", "c16", "i8", ..."""
    dt = prep.params.get("cdtype") if isinstance(prep.params, dict) else None
    dt = dt if dt else (prep.arrays[0].dtype if prep.arrays else "f8")
    code = _codes.get(dt)
    if code is None:
        parsed = np.dtype(dt)
        code = f"{parsed.kind}{parsed.itemsize}"
        if len(_codes) < 256:
            _codes[dt] = code
    return code

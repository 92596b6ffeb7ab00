"""A call repeating an earlier remote call's layout is sent from that call's template (D45): the
rules it skips read only what the layout key holds, its answers are NumPy's, and it stops where
the full path would do something else."""
from __future__ import annotations

import gc
import importlib
import inspect
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion_shim.catalog import CATALOG, Unsupported, prepare
from fusion_shim.client import remote, repeat
from fusion_shim.plan import Call
from fusion_shim.protocol import wire
from fusion_shim.protocol.fingerprint import RESIDENT_MIN
from fusion_shim.protocol.skeleton import Skeleton
from fusion_shim.transport import shm, shm_client
from tests.catalog.test_hypothesis import STRATEGIES, Draw, _materialize, run_call
from tests.helpers.shims import installed, last_record

pytestmark = pytest.mark.usefixtures("no_shim_after")

ROWS = sorted(s.name for s in CATALOG if repeat.repeatable(s))
EXAMPLES = 60


def _numpy_function(spec):
    """The library's function (no shim is installed here)."""
    return getattr(importlib.import_module(spec.module), spec.attr)


def _spec(name):
    return next(s for s in CATALOG if s.name == name)


def _fields(prep):
    return (prep.params, prep.results, prep.layouts, prep.flops, prep.out is None, prep.scalar_0d, prep.scalar_out,
            prep.returns, prep.finish is None)


def _other_values(x, rng):
    """``x``'s layout (dtype, shape, strides) with other values; anything else as it is."""
    if type(x) is not np.ndarray or not (x.flags.c_contiguous or x.flags.f_contiguous):
        return x
    try:  # the very strides, size-1 axes' too (empty_like may choose others for those)
        y = np.ndarray(x.shape, x.dtype, np.empty(max(x.nbytes, 1), np.uint8), 0, x.strides)
    except ValueError:
        return x
    y[...] = rng.integers(-3, 4, size=x.shape).astype(x.dtype)
    return y


def _generated(name, body):
    """``body(call)`` for EXAMPLES calls of the row's differential strategy (derandomized)."""
    strategy = STRATEGIES[name]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        body(strategy(Draw(data)))

    run()


def test_the_repeatable_rows():
    assert "numpy.matmul" in ROWS and "numpy.einsum" in ROWS
    assert "numpy.bincount" not in ROWS  # its result's length is in its values
    assert set(ROWS) <= set(STRATEGIES)


@pytest.mark.parametrize("name", ROWS)
def test_a_repeatable_rule_reads_only_the_layout_key(name):
    """Generated calls, and the same calls with other values in arrays of the same layout: the rule
    refuses both or makes the same call of both, a template of the first makes the second's, and a
    layout the first says can never repeat says so of the second too."""
    spec = _spec(name)
    sig = inspect.signature(_numpy_function(spec))
    rng = np.random.default_rng(0)
    seen = {"keyed": 0}

    def body(call):
        a1, k1 = call.args, _materialize(call.kwargs)
        key = repeat.layout_key(a1, k1)
        if key is None:
            return
        a2 = tuple(_other_values(x, rng) for x in a1)
        k2 = {k: _other_values(v, rng) for k, v in k1.items()}
        assert repeat.layout_key(a2, k2) == key
        seen["keyed"] += 1
        try:
            p1 = prepare(spec, sig, a1, k1)
        except Unsupported:
            with pytest.raises(Unsupported):
                prepare(spec, sig, a2, k2)
            return
        p2 = prepare(spec, sig, a2, k2)
        assert _fields(p1) == _fields(p2)
        tmpl = repeat.make(p1, a1, k1, None, [], [])
        if tmpl == repeat.NEVER:  # said of the layout: so of every call with its key
            assert repeat.make(p2, a2, k2, None, [], []) == repeat.NEVER
        elif tmpl is not None:
            again = tmpl.prepared(a2, k2)
            assert len(again.arrays) == len(p2.arrays) and all(x is y for x, y in zip(again.arrays, p2.arrays))
            assert _fields(again) == _fields(p2)

    _generated(name, body)
    assert seen["keyed"] or name in ("numpy.linalg.multi_dot",), f"{name}: no generated call had a layout key"


def test_the_key_tells_apart_what_a_rule_reads():
    a = np.ones((4, 3))
    base = repeat.layout_key((a, a), {})
    assert base == repeat.layout_key((np.zeros((4, 3)), np.zeros((4, 3))), {})
    for other in [(a.T.copy().T, a), (a.astype("f4"), a), (a[:, :2], a), (a.reshape(3, 4), a), (a,)]:
        assert repeat.layout_key(other, {}) != base
    assert repeat.layout_key((a, a), {"axes": 1}) != repeat.layout_key((a, a), {"axes": True})
    assert repeat.layout_key((a, 1.5), {}) is None
    assert repeat.layout_key((np.asmatrix(a), a), {}) is None
    assert repeat.layout_key((a, [1, 2]), {}) is None


@pytest.mark.parametrize("second", [np.asfortranarray, np.ascontiguousarray])
def test_the_encoded_header_is_the_full_paths(second):
    spec = _spec("numpy.matmul")
    a, b = np.ones((3, 4)), second(np.ones((4, 5)))
    prep = prepare(spec, inspect.signature(_numpy_function(spec)), (a, b), {})
    tmpl = repeat.make(prep, (a, b), {}, Call(spec.name, spec.family, "f8", prep.flops, prep.bytes_in,
                                                   prep.bytes_out), [], [])
    assert tmpl is not None and tmpl.c_order == (second is np.ascontiguousarray)
    c, d = np.full((3, 4), 2.0), second(np.arange(20.0).reshape(4, 5))
    again = tmpl.prepared((c, d), {})
    for rid in (0, 7, 300, 1 << 40):
        want = remote.call_message(rid, again)
        got = tmpl.request(rid, again, []).frames()
        assert wire.decode(got)[0] == wire.decode(want)[0]
        assert [bytes(memoryview(f)) for f in got[1:]] == [bytes(memoryview(f)) for f in want[1:]]
    header, _ = wire.decode(tmpl.request(9, again, ["seg-a"]).frames())
    assert header["shm_drop"] == ["seg-a"] and header["id"] == 9


def test_no_template_of_an_input_passed_twice_or_made_by_the_rule():
    spec = _spec("numpy.dot")
    sig = inspect.signature(_numpy_function(spec))
    a = np.ones((3, 3))
    prep = prepare(spec, sig, (a, a), {})
    assert repeat.make(prep, (a, a), {}, None, [], []) is None
    strided = np.ones((3, 6))[:, ::2]
    prep = prepare(spec, sig, (strided, a), {})
    assert repeat.make(prep, (strided, a), {}, None, [], []) == repeat.NEVER
    out = np.empty((3, 3))
    prep = prepare(spec, sig, (a, a.copy()), {"out": out})
    assert repeat.make(prep, (a, a.copy()), {"out": out}, None, [], []) == repeat.NEVER


def test_a_layout_that_cannot_repeat_is_tried_once(inproc_worker, monkeypatch):
    """A non-contiguous input is copied on its way to the wire: no call with that layout can be
    sent from a template, and the next ones do not try again; an aliased call does not stop a
    later one with its layout from making one."""
    made = []
    make = repeat.make
    monkeypatch.setattr(repeat, "make", lambda *a: made.append(1) or make(*a))
    strided, b = np.ones((6, 12))[:, ::2], np.ones((6, 6))
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        for _ in range(4):
            np.testing.assert_array_equal(np.dot(strided, b), np.full((6, 6), 6.0))
        assert last_record(rt).kind == "worker" and len(made) == 1 and rt.calls.repeated == 0
        np.dot(b, b)
        np.dot(b, b.copy())
        np.dot(b.copy(), b)
        assert len(made) == 3 and rt.calls.repeated == 1 and last_record(rt).repeated


def test_a_template_keeps_no_array_alive():
    spec = _spec("numpy.matmul")
    a, b = np.ones((3, 4)), np.ones((4, 5))
    prep = prepare(spec, inspect.signature(_numpy_function(spec)), (a, b), {})
    tmpl = repeat.make(prep, (a, b), {}, None, [], [])
    gone = weakref.ref(a)
    del a, prep
    gc.collect()
    assert tmpl is not None and gone() is None


@pytest.mark.parametrize("lane", ["socket", "shm"])
@pytest.mark.parametrize("name", ROWS)
def test_repeated_calls_are_the_librarys(inproc_worker, name, lane, monkeypatch):
    """Differential, repeated: each generated call of the row run three times through the shim
    (policy remote, residency off: inputs by value), against the library each time; the second and
    the third are sent from its template where the first made one, the third's reply read from the
    skeleton of the second's where the socket carries it (D48). ``shm``: every buffer through the
    shared-memory lane, whose calls are prepared from their template and encoded in full."""
    if lane == "shm":
        if not shm.available():
            pytest.skip("no /dev/shm on this machine")
        monkeypatch.setattr(shm_client, "MIN_BYTES", 0)
    read, reads = Skeleton.read, []

    def counted(self, frames, rid):
        reads.append(read(self, frames, rid))
        return reads[-1]

    monkeypatch.setattr(Skeleton, "read", counted)
    outcomes = []
    with installed(inproc_worker, residency=False, timeout=30.0, shm="auto" if lane == "shm" else "0") as rt:
        # torch warns once per process of a read-only input (a segment); the in-process worker's
        # warning would land in the first generated call's
        np.dot(np.ones(2), np.ones(2))

        def body(call):
            for _ in range(3):  # the first makes a template, the second its reply's skeleton (D48)
                outcomes.append(run_call(rt, name, call))

        _generated(name, body)
        repeated = rt.calls.repeated
        pool = rt.link.shm()
        staged = pool.stats["bytes_staged"] if pool is not None else 0
    assert outcomes.count("worker") >= EXAMPLES // 2, outcomes
    assert (staged > 0) == (lane == "shm")
    if name != "numpy.linalg.multi_dot":  # its arrays come in a list: never repeated
        assert repeated > 0
        # the lane's replies are read in full; the socket's third calls from the skeleton
        assert any(r is not None for r in reads) == (lane == "socket")


def test_aliased_arguments_take_the_template_apart(inproc_worker):
    """``dot(a, a)`` makes no template; one made of ``dot(b, c)`` answers ``dot(c, b)`` and
    ``dot(b, b)`` with their own arguments."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((5, 5)) for _ in range(3))
    want = [np.dot(a, a), np.dot(b, c), np.dot(c, b), np.dot(b, b)]
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        got = [np.dot(a, a), np.dot(b, c), np.dot(c, b), np.dot(b, b)]
        assert rt.calls.repeated == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_residency_on_repeats_only_a_layout_whose_arrays_a_worker_cannot_keep(inproc_worker, monkeypatch):
    """D38: with residency on, a call whose every input and result is below RESIDENT_MIN travels by
    value (nothing to fingerprint, nothing kept) and repeats from a template, its third reply read
    from the skeleton; one with an input at RESIDENT_MIN or more has no template, and its input is
    sent once, then held there."""
    read, reads = Skeleton.read, []

    def counted(self, frames, rid):
        reads.append(read(self, frames, rid))
        return reads[-1]

    monkeypatch.setattr(Skeleton, "read", counted)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    big = rng.standard_normal((RESIDENT_MIN // 8 // 64 + 1, 64))  # just over RESIDENT_MIN bytes
    v = rng.standard_normal(64)
    with installed(inproc_worker, timeout=30.0) as rt:
        assert rt.config.residency
        small = [np.matmul(a, b) for _ in range(3)]
        recs = rt.ledger.records[-3:]
        assert [r.kind for r in recs] == ["worker"] * 3 and [r.repeated for r in recs] == [False, True, True]
        assert all("fingerprint" not in r.phases for r in recs)
        assert reads[-1] is not None  # the third reply, read from the second's skeleton (D48)
        large = [np.dot(big, v) for _ in range(3)]
        recs = rt.ledger.records[-3:]
        assert [r.kind for r in recs] == ["worker"] * 3 and not any(r.repeated for r in recs)
        assert [r.resident_hits for r in recs] == [0, 1, 1]  # the matrix held after its first upload
        assert [key[0] for key in rt.calls.templates] == ["numpy.matmul"]
    for got in small:
        np.testing.assert_allclose(got, a @ b, rtol=1e-12)
    for got in large:
        np.testing.assert_allclose(got, big @ v, rtol=1e-12)


def test_policy_remote_reprices_a_template(inproc_worker):
    a, b = np.ones((8, 8)), np.ones((8, 8))
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        decided = []
        planner_decide = rt.planner.decide

        def counting(*args, **kwargs):
            decided.append(1)
            return planner_decide(*args, **kwargs)

        rt.planner.decide = counting
        calls = 3 * repeat.REPRICE_EVERY + 1
        for _ in range(calls):
            np.matmul(a, b)
        assert rt.calls.repeated == calls - 1
        assert len(decided) == 1 + 3  # the first call, then once per REPRICE_EVERY repeats


def test_the_report_counts_calls_sent_from_a_template(inproc_worker):
    from fusion_shim.reporting import build, format_table

    a, b = np.ones((8, 8)), np.ones((8, 8))
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        for _ in range(5):
            np.matmul(a, b)
        report = build(rt)
    assert report["ops"]["numpy.matmul"]["repeated"] == 4 == report["summary"]["calls"]["repeated"]
    assert [r["repeated"] for r in report["records"]][-5:] == [False] + [True] * 4
    assert "(5 calls, 4 sent from an earlier call's template)" in format_table(report, full=True)


def test_policy_remote_learns_a_templates_calls_before_anything_reads_the_planner(inproc_worker):
    """D47: the calls sent from a template are learnt REPRICE_EVERY at a time, in their order, and
    all of them before a decision, a report or any other reader of the planner."""
    a, b = np.ones((8, 8)), np.ones((8, 8))
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        planner = rt.made_planner()
        seen = []
        observed = planner.observed_remote
        planner.observed_remote = lambda *args: seen.append(args[3]) or observed(*args)
        for _ in range(repeat.REPRICE_EVERY + 4):
            np.matmul(a, b)
        # the first call at once, the next REPRICE_EVERY together, the last three not yet
        assert len(seen) == 1 + repeat.REPRICE_EVERY and len(rt.calls.unlearnt) == 3
        (tmpl,) = rt.calls.templates.values()
        assert all(x[2] is tmpl.planned.decision for x in rt.calls.unlearnt)  # the decision they went by
        spent = planner.intercepted_s
        rt.planner  # noqa: B018 - reading it is the point
        assert len(seen) == 4 + repeat.REPRICE_EVERY and not rt.calls.unlearnt
        assert planner.intercepted_s == pytest.approx(spent + sum(seen[-3:]))
        np.matmul(a, b)
        report = __import__("fusion_shim").report(format="json")
        assert len(seen) == 5 + repeat.REPRICE_EVERY and report["planner"]["intercepted_s"] == planner.intercepted_s


def test_a_pinned_signature_is_not_repeated(inproc_worker):
    a, b = np.ones((8, 8)), np.ones((8, 8))
    with installed(inproc_worker, residency=False, timeout=30.0) as rt:
        np.matmul(a, b)
        np.matmul(a, b)
        assert rt.calls.repeated == 1
        (tmpl,) = rt.calls.templates.values()
        rt.checks.pinned[tmpl.op_key] = "pinned local: a test"
        np.testing.assert_array_equal(np.matmul(a, b), np.full((8, 8), 8.0))
        assert last_record(rt).kind == "fallback" and rt.calls.repeated == 1

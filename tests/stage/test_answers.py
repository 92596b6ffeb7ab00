"""A worker's answer to a stage is data: what it may name when it is loaded here (D174), and a
changed argument that does not fit, refused before any argument is touched."""
from __future__ import annotations

import collections
import os
import pickle
import subprocess

import numpy as np
import pytest

from fusion_shim import transport
from fusion_shim.protocol import code, messages
from fusion_shim.stages import remote
from tests.helpers.shims import install
from tests.stage import stagefns

M = "tests.stage.stagefns"
OWN = frozenset({M, "__main__"})


class _Calls:
    """Pickles as a call of ``fn(*args)``: what a hostile answer would hold."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _answer(obj) -> bytes:
    payload, arrays = code.dumps(obj)
    assert not arrays
    return payload


@pytest.mark.parametrize("obj", [
    _Calls(os.system, "touch /tmp/should-not-exist"),
    _Calls(subprocess.Popen, ["true"]),   # a class, but another module's
    _Calls(stagefns.os.getcwd),           # a function the stage's module imported
    _Calls(eval, "1"),
])
def test_an_answer_naming_a_function_or_anothers_class_is_refused(obj):
    with pytest.raises(pickle.UnpicklingError, match="may not name"):
        code.loads_answer(_answer(obj), [], OWN)


def test_an_answer_of_values_containers_exceptions_and_the_programs_classes_loads():
    value = {"x": np.float64(1.5), "i": np.int32(3), "d": np.dtype("f4"), "c": 1 + 2j, "r": range(3),
             "o": collections.OrderedDict(a=1), "s": {1, 2}, "obj": np.array([1, "a"], dtype=object),
             "e": ValueError("v"), "la": np.linalg.LinAlgError("singular"), "own": stagefns.Box(2)}
    got = code.loads_answer(_answer(value), [], OWN)
    assert got["x"] == 1.5 and got["x"].dtype == np.float64 and got["i"].dtype == np.int32
    assert got["d"] == np.dtype("f4") and got["o"] == {"a": 1} and got["obj"].tolist() == [1, "a"]
    assert type(got["la"]) is np.linalg.LinAlgError and got["own"].n == 2
    with pytest.raises(pickle.UnpicklingError):  # the program's class, but not the stage's module
        code.loads_answer(_answer(stagefns.Box(2)), [], frozenset({"__main__"}))


def test_a_changed_argument_that_does_not_fit_touches_no_argument():
    a, b = np.zeros(4), np.zeros(3)
    good, bad = np.ones(4), np.ones(5)
    for changed in ([(0, good), (1, bad)], [(0, good), (7, good)], [(0, good), (1, np.ones(3, np.float32))]):
        with pytest.raises(transport.BadReply):
            remote._changes(changed, [a, b])
    assert not a.any() and not b.any()


def test_a_hostile_answer_costs_the_call_a_local_run_and_runs_nothing_here(code_worker, monkeypatch, tmp_path):
    flag = tmp_path / "ran"
    real = messages.read_stage

    def hostile(reply, arrays):
        got = real(reply, arrays)
        payload = np.frombuffer(_answer(_Calls(os.system, f"touch {flag}")), np.uint8)
        return got._replace(payload=payload)

    monkeypatch.setattr(messages, "read_stage", hostile)
    rng = np.random.default_rng(3)
    A, x = rng.standard_normal((32, 32)), rng.standard_normal(32)
    rt = install(code_worker[0], stages=(f"{M}:scaled_sum",))
    assert stagefns.scaled_sum(A, x) == float((A @ x).sum())
    rec = [r for r in rt.ledger.records if r.op == f"stage {M}:scaled_sum"][-1]
    assert rec.kind == "fallback" and "may not name" in rec.reason, rec.reason
    assert not flag.exists()

"""Issue 8: the long fault-injection run, >= 2,000 injections (the CI test makes 200).

SIMULATED device: tests/helpers/faultlab.py (the real server loop and wire, NumPy kernels, workers forked
from a zygote). The client is the real shim, policy remote, over ipc://, deadline cap 0.1 s.
Recorded: injections by phase and action, calls, wrong answers, exceptions, slowest call.

    python -m pytest benchmarks/bench_reliability.py --benchmark-only -s
"""
import json
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from tests.helpers import faultlab as _faultlab  # noqa: E402

INJECTIONS = int(os.environ.get("FAULT_INJECTIONS", "2000"))


def _run():
    d = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
    try:
        return _faultlab.fault_run(d, 2 * INJECTIONS, seed=2026, rate=0.6, timeout=0.1, async_every_s=0.5,
                                   time_budget_s=900, min_injections=INJECTIONS)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.benchmark(group="fault injection")
def test_fault_injection_2000(benchmark):
    res = benchmark.pedantic(_run, rounds=1, iterations=1)
    benchmark.extra_info.update({k: v for k, v in res.items() if k not in ("wrong", "raised")})
    print(json.dumps({k: v for k, v in res.items() if k not in ("wrong", "raised")}, indent=1))
    assert res["injected"] >= INJECTIONS >= 2000
    assert res["wrong"] == [] and res["raised"] == []
    assert res["slowest_s"] < res["timeout"] + 0.5

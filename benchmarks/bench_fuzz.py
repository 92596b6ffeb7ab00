"""Issue 8: fuzzing a live worker with 10,000 mutated messages (the CI test sends 2,000).

A real worker process (torch kernels, CPU), CURVE over tcp://127.0.0.1 with an allow-listed client,
budget 256 MiB; tests/helpers/fuzz.py has the mutation operators and the verdicts. Recorded: messages per
verdict, time per message, worker RSS before/after/peak.

    python -m pytest benchmarks/bench_fuzz.py --benchmark-only -s
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from tests.protocol import test_fuzz  # noqa: E402

N = int(os.environ.get("FUZZ_MESSAGES", "10000"))


@pytest.mark.benchmark(group="fuzz a live worker")
def test_fuzz_live_worker_10000(benchmark, tmp_path):
    res = benchmark.pedantic(test_fuzz.fuzz_live_worker, args=(tmp_path, N, 2026), rounds=1, iterations=1)
    benchmark.extra_info.update({k: v for k, v in res.items() if k != "failures"})
    print(json.dumps({k: v for k, v in res.items() if k != "failures"}, indent=1))
    assert res["messages"] == N >= 10000
    assert res["failures"] == [], res["failures"][:10]
    assert res["alive"] and res["pid_after"] == res["pid"]
    assert res["wire_invalid_error"] == res["wire_invalid"]
    assert res["rss_ratio"] <= 1.05

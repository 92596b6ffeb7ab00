"""Client peak memory: a forced-remote float64 matmul of two 4096x4096 arrays, and ``np.dot(x, x)``
of one 512 MiB vector, against plain NumPy, measured in the same run. Target: the shim's client
peak <= 1.3x NumPy's.

    python -m pytest benchmarks/bench_memory.py --benchmark-only

Each side is a fresh process (``benchmarks/_peak_matmul.py``, ``_peak_dot.py``) so peak RSS is that program's alone;
the shim's side runs under ``python -m fusion_shim --policy remote`` with its embedded CPU worker
(a separate process, not counted: the client's memory is what the program pays).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CASES = {"matmul_4096": ("_peak_matmul.py", 4096), "dot_512mib": ("_peak_dot.py", 1 << 26)}


def _run(shim: bool, prog: str, n: int) -> dict:
    cmd = [sys.executable, *(["-m", "fusion_shim", "--quiet", "--policy", "remote"] if shim else []),
           str(HERE / prog), str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_client_peak_memory(benchmark, case):
    prog, n = CASES[case]
    plain = _run(False, prog, n)
    shim = benchmark.pedantic(_run, args=(True, prog, n), rounds=1, iterations=1)
    ratio = shim["peak_mib"] / plain["peak_mib"]
    benchmark.extra_info.update(plain_peak_mib=plain["peak_mib"], shim_peak_mib=shim["peak_mib"], ratio=ratio)
    print(f"\n{case} client peak: plain NumPy {plain['peak_mib']:.0f} MiB, shim (remote) {shim['peak_mib']:.0f} MiB, "
          f"ratio {ratio:.3f}")
    assert shim["where"] == "worker", "the product was not computed on the worker"
    assert abs(shim["checksum"] - plain["checksum"]) <= 1e-9 * max(1.0, abs(plain["checksum"]))
    assert ratio <= 1.3

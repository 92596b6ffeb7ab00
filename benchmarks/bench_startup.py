"""What the shim costs a whole process at start, against plain ``python`` measured in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--pairs 15] [--python PATH] [--no-program]
    FS_BENCH_PYTHON=PATH .venv/bin/python -m pytest benchmarks/bench_startup.py --benchmark-only -s

Each case runs its two launches in pairs, alternating which goes first, each a fresh process, with
no ``FUSION_SHIM*`` variable inherited (the machines are shared: a load spike should hit both sides
of a pair or neither). Reported: the medians of each side's wall time, their ratio, the median of
the pairs' differences, and the medians of CPU time (user + system from ``wait4``, in the kernel's
ticks: coarse for the short cases). The case that never imports NumPy runs ``HELLO_PAIRS_X`` times
as many pairs: its difference is a fraction of a millisecond. Targets:

- ``FUSION_SHIM=1 python hello.py`` (a script that never imports NumPy): within 1.05x of plain;
- ``python -m fusion_shim app.py`` and ``FUSION_SHIM=1 python app.py`` where ``app.py`` is only
  ``import numpy``: within +25 ms of plain;
- a 0.3 s NumPy program (small calls, all under every floor) under ``auto``: within 1.05x.

``--instructions``: each launch once under valgrind's callgrind, in instructions, which the
machine's load does not move (a proxy for CPU, blind to I/O and waits). ``--python``: the
interpreter to measure; ``FUSION_SHIM=1`` needs the ``fusion_shim.pth`` of its
install. Measure an install whose bytecode is compiled (``pip install .`` compiles it): a source
checkout run under ``PYTHONDONTWRITEBYTECODE=1`` compiles the shim's modules at every start.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

HELLO = 'print("hello")\n'
APP = "import numpy\n"
# ~0.3 s in all on an idle 2-core host (~0.1 s of it Python's and NumPy's start), of small NumPy
# work: every call below its floor, so the shim's share is its fixed cost and its fast path
PROGRAM = """\
import numpy as np
a = np.ones((8, 8))
for _ in range(20000):
    np.matmul(a, a)
    np.linalg.inv(a + np.eye(8))
"""


HELLO_PAIRS_X = 4


class Case(NamedTuple):
    name: str
    script: str
    shim_args: tuple  # the shimmed launch's interpreter arguments before the script
    shim_env: dict    # added to the shimmed launch's environment
    target: str       # "ratio:1.05" or "added_ms:25"


CASES = (
    Case("FUSION_SHIM=1 python hello.py", "hello.py", (), {"FUSION_SHIM": "1"}, "ratio:1.05"),
    Case("FUSION_SHIM=1 python app.py", "app.py", (), {"FUSION_SHIM": "1"}, "added_ms:25"),
    Case("python -m fusion_shim app.py", "app.py", ("-m", "fusion_shim"), {}, "added_ms:25"),
)
PROGRAM_CASE = Case("python -m fusion_shim program.py (0.3 s, auto)", "program.py", ("-m", "fusion_shim"), {},
                    "ratio:1.05")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.pop("PYTHONPATH", None)  # fusion_shim found the way a user's python finds it
    return env


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process run to its end."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def paired(case: Case, python: str, cwd: str, pairs: int) -> dict:
    """The case's plain and shimmed launches, ``pairs`` times each, alternating which goes first."""
    plain_env, shim_env = clean_env(), {**clean_env(), **case.shim_env}
    plain_argv, shim_argv = [python, case.script], [python, *case.shim_args, case.script]
    timed(plain_argv, plain_env, cwd), timed(shim_argv, shim_env, cwd)  # warm the page cache and .pyc
    plain, shim = [], []
    pairs *= HELLO_PAIRS_X if case.script == "hello.py" else 1
    for i in range(pairs):
        first, second = ((plain_argv, plain_env, plain), (shim_argv, shim_env, shim))[:: 1 if i % 2 == 0 else -1]
        for argv, env, out in (first, second):
            out.append(timed(argv, env, cwd))
    return summarise(case, plain, shim)


def summarise(case: Case, plain: list, shim: list) -> dict:
    med = statistics.median
    plain_wall, shim_wall = med([w for w, _ in plain]), med([w for w, _ in shim])
    ratio = shim_wall / plain_wall
    added_ms = med([(s[0] - p[0]) * 1e3 for p, s in zip(plain, shim)])
    kind, bound = case.target.split(":")
    ok = ratio <= float(bound) if kind == "ratio" else added_ms <= float(bound)
    return {"case": case.name, "pairs": len(plain), "plain_ms": plain_wall * 1e3, "shim_ms": shim_wall * 1e3,
            "ratio": ratio, "added_ms": added_ms,
            "plain_cpu_ms": med([c for _, c in plain]) * 1e3, "shim_cpu_ms": med([c for _, c in shim]) * 1e3,
            "target": case.target, "met": ok}


def _write_scripts(d: str) -> None:
    for name, text in (("hello.py", HELLO), ("app.py", APP), ("program.py", PROGRAM)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def measure(python: str, pairs: int, program: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="fs-bench-start-") as d:
        _write_scripts(d)
        cases = CASES + ((PROGRAM_CASE,) if program else ())
        return [paired(case, python, d, pairs) for case in cases]


def instructions(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """User-space instructions of one process under ``valgrind --tool=callgrind``: a count that the
    machine's load does not move (D116). BLAS on one thread and a fixed hash seed, on both sides."""
    env = {**env, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env, cwd=cwd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True).stderr
    return int(next(ln for ln in out.splitlines() if "Collected :" in ln).split()[-1])


def count(python: str, program: bool) -> list[dict]:
    """Each case's two launches once each, in instructions (needs valgrind)."""
    with tempfile.TemporaryDirectory(prefix="fs-bench-start-") as d:
        _write_scripts(d)
        rows = []
        for case in CASES + ((PROGRAM_CASE,) if program else ()):
            plain_env, shim_env = clean_env(), {**clean_env(), **case.shim_env}
            instructions([python, case.script], plain_env, d)  # the page cache and .pyc, as paired() does
            plain = instructions([python, case.script], plain_env, d)
            shim = instructions([python, *case.shim_args, case.script], shim_env, d)
            rows.append({"case": case.name, "plain": plain, "shim": shim, "ratio": shim / plain})
        return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'case':48} {'plain ms':>9} {'shim ms':>9} {'ratio':>6} {'added ms':>9} {'cpu plain':>9} "
             f"{'cpu shim':>9}  target"]
    for r in rows:
        lines.append(f"{r['case']:48} {r['plain_ms']:9.1f} {r['shim_ms']:9.1f} {r['ratio']:6.3f} {r['added_ms']:+9.1f} "
                     f"{r['plain_cpu_ms']:9.1f} {r['shim_cpu_ms']:9.1f}  {r['target']} "
                     f"{'met' if r['met'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--no-program", action="store_true", help="skip the 0.3 s program")
    parser.add_argument("--instructions", action="store_true",
                        help="count each launch's instructions under valgrind instead of timing pairs")
    opts = parser.parse_args(argv)
    if opts.instructions:
        print(f"instructions (callgrind), one run each; {opts.python}")
        for r in count(opts.python, not opts.no_program):
            print(f"{r['case']:48} plain {r['plain'] / 1e6:9.1f} M  shim {r['shim'] / 1e6:9.1f} M  "
                  f"added {(r['shim'] - r['plain']) / 1e6:+7.1f} M  ratio {r['ratio']:.3f}")
        return 0
    rows = measure(opts.python, opts.pairs, not opts.no_program)
    print(f"{opts.pairs} pairs, medians; {opts.python}")
    print(format_rows(rows))
    return 0 if all(r["met"] for r in rows) else 1


def test_startup_against_plain_python(benchmark):
    """The same measurement under pytest-benchmark: one round, the table printed (``-s``), reported
    rather than asserted (a loaded machine moves whole-process times). ``FS_BENCH_PYTHON``: the
    interpreter to measure (default: this one)."""
    python = os.environ.get("FS_BENCH_PYTHON", sys.executable)
    rows = benchmark.pedantic(measure, args=(python, 15, True), rounds=1, iterations=1)
    benchmark.extra_info["cases"] = rows
    print("\n" + format_rows(rows))


if __name__ == "__main__":
    sys.exit(main())

"""Record the programs the decision matrix replays (benchmarks/bench_decision_matrix.py).

    python benchmarks/recordings/record.py [NAME ...]

Each program runs once under ``--policy remote --device cpu --verify all``: every call above its floor
goes to the embedded CPU worker and is also computed here, so each record has its measured local time
(what every replay strategy needs; OMP_WAIT_POLICY=PASSIVE, so that the worker's idle
threads do not spin on the cores those local times are taken on) and the report has the worker's
self-benchmark and link (what the ``cpu-worker``/``loopback`` replay needs). A check runs on the
program's thread once the worker has answered, so the worker is idle while it is timed
(``worker_idle.py`` measures that). Sizes are cut down to keep each recording small and quick;
only the fields the replay reads are kept (``KEEP``), and at most ``PER_SITE`` records a site.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROGRAMS = {
    **{f"workload-{w}": ["benchmarks/recordings/_workload.py", w] for w in
       ("matmul_large", "small_calls", "chain_reuse", "fft_heavy", "decompositions", "mix")},
    "example-power_chain": ["examples/power_chain.py", "512"],
    "example-fft_filter": ["examples/fft_filter.py", "512"],
    "example-lstsq_fit": ["examples/lstsq_fit.py", "384"],
    "example-mlp_numpy": ["examples/mlp_numpy.py", "512"],
    "example-pca_spectral": ["examples/pca_spectral.py", "384"],
}
KEEP = ("op", "family", "site", "kind", "cdtype", "flops", "bytes_in", "bytes_out", "inputs", "results", "shapes",
        "dtypes", "start_s", "wall_s", "phases", "local_measured_s", "predicted_local_s", "bytes_sent", "shm_sent",
        "bytes_received", "shm_received")
PER_SITE = 100  # records kept per call site; the replay scales each site by its calls over these (D238)
TOP = ("schema", "argv", "policy", "wall_s", "worker", "ops", "sites", "sample", "records_dropped")


def command(name: str, report: str) -> list[str]:
    """The recording run of ``name``, its report to ``report`` (run it in ``ROOT`` with ``ENV``)."""
    return [sys.executable, "-m", "fusion_shim", "--policy", "remote", "--device", "cpu", "--verify", "all",
            "--quiet", "--report", report, *PROGRAMS[name]]


ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def record(name: str) -> str:
    out = os.path.join(HERE, f"{name}.json")
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "run.json")
        subprocess.run(command(name, raw), cwd=ROOT, check=True, timeout=600, stdout=subprocess.DEVNULL, env=ENV)
        with open(raw) as f:
            rep = json.load(f)
    small = {k: rep.get(k) for k in TOP}
    kept: dict = {}
    small["records"] = []
    for r in rep.get("records") or []:
        key = (r.get("site"), r.get("op"))
        kept[key] = kept.get(key, 0) + 1
        if kept[key] <= PER_SITE:
            small["records"].append({k: r[k] for k in KEEP if k in r})
    dropped = len(rep.get("records") or []) - len(small["records"])
    small["sample"] = {**(rep.get("sample") or {}), "kept": len(small["records"]),
                       "dropped": (rep.get("sample") or {}).get("dropped", 0) + dropped}
    with open(out, "w") as f:
        json.dump(small, f, separators=(",", ":"), default=str)
    return out


if __name__ == "__main__":
    for name in sys.argv[1:] or PROGRAMS:
        path = record(name)
        print(f"{name}: {os.path.getsize(path) / 1e3:.0f} kB")

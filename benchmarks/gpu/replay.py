"""The replay against reality on the lent GPU (benchmarks/gpu/run.sh's ``replay`` step): runs
recorded here under ``--policy remote`` and ``--policy auto`` against one warm same-host worker on
``--device``, each report replayed with ``fusion-shim replay --device MODEL --link loopback``, its
own policy's SIMULATED wall against the wall the run measured (docs/replay.md, "Validation").

    python benchmarks/gpu/replay.py --device cuda:0 --out replay.json [--budget 150] [--quick]

MODEL is this GPU's entry of the replay's device table, picked from ``nvidia-smi --query-gpu=name``
(``model_for``), or ``--model``; with ``--device cpu`` it is ``cpu-worker`` (the CPU dry run: the
same comparison as benchmarks/bench_replay_validation.py, whose functions run each step here).
The link is ``loopback``: the replay's same-host link, fitted to the recorded run's own calls.
The target (within 20%) is reported per row, never asserted. ``--budget`` seconds in all: a run
is given what is left of it, and the JSON is rewritten after each row (a cut run keeps its rows).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = {False: "power_chain:1536,fft_filter:1024", True: "power_chain:256,fft_filter:256"}
# nvidia-smi's name -> the replay's device table (fusion_shim/replay/hardware.py), first match wins
MODELS = ((r"H200", "h200"), (r"H100.*PCIe", "h100-pcie"), (r"H100", "h100-sxm"), (r"A100", "a100"),
          (r"\bL4\b", "l4"), (r"5090", "rtx5090"))


def model_for(gpu_name: str) -> str | None:
    """The replay's device model for a GPU as nvidia-smi names it; None where the table has none."""
    return next((model for pattern, model in MODELS if re.search(pattern, gpu_name, re.IGNORECASE)), None)


def gpu_name() -> str:
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout.strip().splitlines()[0].strip()


def _write(out: Path, res: dict) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, out)  # whole: run.sh's limit may stop this between two rows


def _drain(proc: subprocess.Popen, tail: collections.deque) -> None:
    # the worker's stderr is a pipe: read to its end, or a chatty worker blocks on a full pipe
    for line in proc.stderr:
        tail.append(line)


def compare(device: str, model: str, link: str, workloads: list[tuple[str, str]], rounds: int,
            budget: float, out: Path, gpu: str | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_replay_validation as rv  # here: run.sh's summary imports table() without pytest or torch

    deadline = time.monotonic() + budget
    work = Path(tempfile.mkdtemp(prefix="fs-gpu-replay-", dir="/tmp"))
    res: dict = {"device": device, "gpu": gpu, "model": model, "link": link, "rounds": rounds, "budget_s": budget,
                 "bound": rv.BOUND, "label": "SIMULATED predicted against measured", "rows": [], "errors": []}
    left = lambda: deadline - time.monotonic()  # noqa: E731
    url = f"ipc://{work}/w.sock"
    proc = rv._worker(url, device, parent_pid=os.getpid())  # gone with this script, even if killed
    tail: collections.deque = collections.deque(maxlen=40)
    threading.Thread(target=_drain, args=(proc, tail), daemon=True).start()
    try:
        example, arg = workloads[0]
        t = time.monotonic()
        rv._run(url, "remote", work / "warm.json", example, arg, timeout=max(left(), 1))  # warm-up, calibration
        res["warm_s"] = round(time.monotonic() - t, 2)
        for example, arg in workloads:
            for i in range(rounds):
                for policy in ("remote", "auto"):
                    if left() < 2:
                        res["errors"].append(f"{example} {arg} {policy} round {i}: budget spent")
                        continue
                    report = work / f"{example}-{policy}-{i}.json"
                    try:
                        measured = rv._run(url, policy, report, example, arg, timeout=max(left(), 1))
                        predicted = rv._replayed(report, policy, model, link, timeout=max(left(), 1))
                    except (AssertionError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
                        res["errors"].append(f"{example} {arg} {policy} round {i}: {type(exc).__name__}: "
                                             f"{str(exc)[-800:]}")
                        continue
                    ratio = predicted / measured
                    res["rows"].append({"workload": f"{example} {arg}", "policy": policy, "round": i,
                                        "measured_s": measured, "predicted_s": predicted, "ratio": ratio,
                                        "within_bound": abs(ratio - 1) <= rv.BOUND})
                    _write(out, res)
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        res["errors"].append(f"warm-up: {type(exc).__name__}: {str(exc)[-800:]}")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        res["worker_log_tail"] = "".join(tail)[-2000:]
        _write(out, res)
    return res


def table(res: dict) -> str:
    lines = [f"replay vs measured: model {res['model']}{' (' + res['gpu'] + ')' if res.get('gpu') else ''}, "
             f"link {res['link']}, worker {res['device']}; predicted is SIMULATED; target within "
             f"{res['bound']:.0%}",
             f"{'workload':20s} {'policy':6s} {'predicted s':>11s} {'measured s':>10s} {'ratio':>6s}"]
    for r in res["rows"]:
        lines.append(f"{r['workload']:20s} {r['policy']:6s} {r['predicted_s']:11.3f} {r['measured_s']:10.3f} "
                     f"{r['ratio']:6.2f}{'' if r['within_bound'] else '  OFF'}")
    lines += [f"  not run: {e[:300]}" for e in res["errors"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0", help="the worker's device")
    parser.add_argument("--model", help="the replay's device (default: this GPU's, or cpu-worker for --device cpu)")
    parser.add_argument("--link", default="loopback")
    parser.add_argument("--workloads", help="example:arg,... (examples/; default two, smaller with --quick)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the whole comparison")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run.sh's limit: the worker is stopped
    gpu = None
    model = opts.model
    if model is None and opts.device.startswith("cuda"):
        try:
            gpu = gpu_name()
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            print(f"no GPU name from nvidia-smi ({type(exc).__name__}: {exc}); give --model", file=sys.stderr)
            return 3
        model = model_for(gpu)
        if model is None:
            print(f"no replay model for GPU {gpu!r}; known: {', '.join(m for _, m in MODELS)} (or --model)",
                  file=sys.stderr)
            return 3
    model = model or "cpu-worker"
    workloads = [tuple(w.split(":", 1)) for w in (opts.workloads or WORKLOADS[opts.quick]).split(",") if w]
    out = Path(opts.out)
    res = compare(opts.device, model, opts.link, workloads, opts.rounds, opts.budget, out, gpu)
    print(table(res))
    return 0 if res["rows"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# The prepared GPU run (issue 9): one script for the GPU machine, and the same script as a CI dry run.
#
#   OUT=/some/dir bash benchmarks/gpu/run.sh                      # on the GPU machine: cuda:0, full size
#   OUT=/tmp/dry  bash benchmarks/gpu/run.sh --device cpu --quick # CI (tests/benchmarks/test_gpu_script.py), < 60 s
#
# Steps, each with its own time limit so that the whole run ends inside 8 minutes, each recorded with
# its exit status whether it passed, failed or timed out (a failed step never stops the others):
#   env        python, torch, CUDA device, numba, numpy, CPU count
#   deps       pyzmq from the carried wheels in .whl/ when python cannot import zmq (benchmarks/gpu/README.md)
#   install    the project on PYTHONPATH (a checkout, no build needed)
#   native     python setup.py build_ext --inplace, where native/ exists (issue 3); a failure is recorded
#   fidelity   tests/worker/test_gpu_fidelity.py: TF32 off, float64 in float64 (CPU and CUDA workers)
#   workloads  benchmarks/gpu/workloads.py: power, matmul_chain, fft, decomp under local/remote/auto
#   shm        benchmarks/bench_shm.py: the same-host 64 MiB round trip vs memcpy (full runs only)
#   replay     benchmarks/gpu/replay.py: power_chain and fft_filter recorded under remote and auto (worker on
#              --device), each replayed on this GPU's model over the loopback link against its measured wall
#              (cpu-worker with --device cpu); at most 150 s, and never the diff step's last 60 s
#   diff       tests/catalog/test_differential.py with the worker on --device: every catalog row, the numba
#              rows on the GPU through numba-cuda (the simulator only with --device cpu); last, with
#              the time that is left (at least 60 s; its progress is in run.log if it is cut short)
# Writes to $OUT (at most 8 files): results.json (everything, machine-readable), summary.txt,
# workloads.json, replay.json, run.log, worker.log.
set -uo pipefail

DEVICE="cuda:0"
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --device=*) DEVICE="${1#*=}"; shift ;;
    --quick) QUICK=1; shift ;;
    *) echo "usage: OUT=dir $0 [--device cuda:0|cpu] [--quick]" >&2; exit 2 ;;
  esac
done
: "${OUT:?set OUT to the folder for the results}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
mkdir -p "$OUT"
# The GPU machine's Python (torch cu130, numba-cuda) unless PYTHON says otherwise.
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
WORK="$(mktemp -d /tmp/fusion-shim-gpu-run-XXXXXX)"
STEPS="$WORK/steps.tsv"
: > "$STEPS"
LOG="$OUT/run.log"
: > "$LOG"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
for v in $(env | grep -o '^FUSION_SHIM[A-Z_]*' || true); do unset "$v"; done
case "$DEVICE" in cuda*) export NUMBA_ENABLE_CUDASIM=0 ;; *) export NUMBA_ENABLE_CUDASIM=1 ;; esac

# step NAME LIMIT_S CMD...: run one step, its output into run.log, its status into steps.tsv;
# STEP_LIMIT_SCALE (default 1) multiplies every limit: the CPU dry run on a busy machine sets it
step() {
  local name="$1" limit="$(( $2 * ${STEP_LIMIT_SCALE:-1} ))"; shift 2
  local t=$(date +%s)
  echo "=== $name (limit ${limit}s): $*" >> "$LOG"
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$STEPS"
  echo "=== $name: exit $rc after $(( $(date +%s) - t ))s" >> "$LOG"
  return 0
}

# -- deps: pyzmq travels as a wheel (the GPU machine has no registry); see benchmarks/gpu/README.md
if ! "$PYTHON" -c "import zmq" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    step deps 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    printf 'deps\t%s\t0\n' "missing: no zmq and no .whl/" >> "$STEPS"
  fi
else
  printf 'deps\t0\t0\n' >> "$STEPS"
fi
# -- install: the checkout itself on PYTHONPATH (no build isolation, no network)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
step install 60 "$PYTHON" -c "import fusion_shim, fusion_shim.client.runtime, fusion_shim.worker; print(fusion_shim.__file__)"
# -- native: issue 3's C extension, where it exists; a failure is recorded and the run goes on
if [ -d native ]; then
  step native 180 "$PYTHON" setup.py build_ext --inplace
else
  printf 'native\tabsent\t0\n' >> "$STEPS"
fi
# -- env
step env 60 "$PYTHON" - "$WORK/env.json" "$DEVICE" <<'EOF'
import json, os, platform, sys
out, device = sys.argv[1], sys.argv[2]
env = {"python": platform.python_version(), "executable": sys.executable, "cpus": os.cpu_count(),
       "machine": platform.node(), "device_asked": device}
for mod in ("numpy", "torch", "numba", "zmq", "msgpack", "xxhash", "wrapt"):
    try:
        env[mod] = __import__(mod).__version__
    except Exception as exc:
        env[mod] = f"missing: {type(exc).__name__}: {exc}"
try:
    import torch
    env["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count,
                      "capability": f"{p.major}.{p.minor}", "cuda": torch.version.cuda}
except Exception as exc:
    env["cuda_available"] = f"error: {exc}"
print(json.dumps(env, indent=1))
json.dump(env, open(out, "w"))
EOF
# -- fidelity, workloads, the shm lane, then the differential suite with the time that is left
# (the workloads are the headline figures: they go first; the suite stops itself at 50 failures)
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= -W "ignore::DeprecationWarning")
left() { local l=$(( 470 - ($(date +%s) - T0) )); [ "$l" -lt 60 ] && l=60; echo "$l"; }
if [ "$QUICK" = 1 ]; then
  step fidelity 60 "${PYTEST[@]}" tests/worker/test_gpu_fidelity.py --junitxml="$WORK/fidelity.xml"
  step workloads 60 "$PYTHON" benchmarks/gpu/workloads.py --device "$DEVICE" --quick --timeout "$(( 30 * ${STEP_LIMIT_SCALE:-1} ))" --out "$OUT/workloads.json"
  step replay 90 "$PYTHON" benchmarks/gpu/replay.py --device "$DEVICE" --quick --budget "$(( 75 * ${STEP_LIMIT_SCALE:-1} ))" --out "$OUT/replay.json"
  export FUSION_DIFF_DEVICE="$DEVICE"
  step diff 60 "${PYTEST[@]}" tests/catalog/test_differential.py --junitxml="$WORK/diff.xml" \
    -k "matmul-2d-float64-C or solve-2d-float64-C or fft-1d-complex128-C or bincount-weights-int64-C or convolve-full-float64-C or interp-2d_x-float64-C"
  unset FUSION_DIFF_DEVICE
else
  step fidelity 120 "${PYTEST[@]}" tests/worker/test_gpu_fidelity.py --junitxml="$WORK/fidelity.xml"
  step workloads 200 "$PYTHON" benchmarks/gpu/workloads.py --device "$DEVICE" --timeout 90 --out "$OUT/workloads.json"
  step shm 60 "${PYTEST[@]}" benchmarks/bench_shm.py --benchmark-only -s --benchmark-json="$WORK/shm.json"
  # the replay's limit: 150 s at most, and what leaves the diff step its 60 s; it stops itself 15 s early
  rl=$(( 470 - ($(date +%s) - T0) - 60 )); [ "$rl" -gt 150 ] && rl=150
  if [ "$rl" -ge 45 ]; then
    step replay "$rl" "$PYTHON" benchmarks/gpu/replay.py --device "$DEVICE" --budget "$(( (rl - 15) * ${STEP_LIMIT_SCALE:-1} ))" --out "$OUT/replay.json"
  else
    printf 'replay\t%s\t0\n' "skipped: ${rl}s left before the diff step's 60 s" >> "$STEPS"
  fi
  export FUSION_DIFF_DEVICE="$DEVICE"
  step diff "$(left)" "${PYTEST[@]}" tests/catalog/test_differential.py --junitxml="$WORK/diff.xml" --maxfail=50
  unset FUSION_DIFF_DEVICE
fi
# -- results.json and summary.txt from what the steps left
"$PYTHON" - "$WORK" "$OUT" "$DEVICE" "$QUICK" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, os, re, sys
import xml.etree.ElementTree as ET
work, out, device, quick, total = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])

def junit(path):
    if not os.path.exists(path):
        return {"ran": False}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    agg = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    agg["passed"] = agg["tests"] - agg["failures"] - agg["errors"] - agg["skipped"]
    agg["time_s"] = round(sum(float(s.get("time", 0)) for s in suites), 2)
    bad = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    agg["failed_tests"] = bad[:50]
    agg["ran"] = True
    return agg

steps = {}
for line in open(os.path.join(work, "steps.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    steps[name] = {"exit": int(rc) if re.fullmatch(r"-?\d+", rc) else rc, "seconds": int(secs)}
    if steps[name]["exit"] in (124, 137):
        steps[name]["timed_out"] = True
res = {"schema": "fusion_shim.gpu_run/1", "device": device, "quick": quick, "total_s": total, "steps": steps,
       "env": json.load(open(os.path.join(work, "env.json"))) if os.path.exists(os.path.join(work, "env.json")) else None,
       "fidelity": junit(os.path.join(work, "fidelity.xml")), "differential": junit(os.path.join(work, "diff.xml"))}
shm = os.path.join(work, "shm.json")
if os.path.exists(shm):
    b = json.load(open(shm))["benchmarks"]
    res["shm"] = b[0]["extra_info"] if b else None
wl = os.path.join(out, "workloads.json")
res["workloads"] = json.load(open(wl)) if os.path.exists(wl) else None
if res["workloads"]:
    log = res["workloads"].pop("worker_log_tail", "")
    open(os.path.join(out, "worker.log"), "w").write(log)
rp = os.path.join(out, "replay.json")
res["replay"] = json.load(open(rp)) if os.path.exists(rp) else None
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)

lines = [f"fusion_shim GPU run: device {device}{' (quick dry run)' if quick else ''}, {total} s in all"]
env = res["env"] or {}
lines.append(f"python {env.get('python')}, numpy {env.get('numpy')}, torch {env.get('torch')}, numba {env.get('numba')}, "
             f"{env.get('cpus')} CPUs, GPU {(env.get('gpu') or {}).get('name', 'none')}")
lines.append("steps: " + ", ".join(f"{k} {'ok' if v['exit'] == 0 else v['exit']} ({v['seconds']}s)" for k, v in steps.items()))
for key in ("fidelity", "differential"):
    j = res[key]
    if j.get("ran"):
        lines.append(f"{key}: {j['passed']} passed, {j['failures'] + j['errors']} failed, {j['skipped']} skipped "
                     f"({j['time_s']} s)" + (f"; first failures: {j['failed_tests'][:5]}" if j["failed_tests"] else ""))
    else:
        lines.append(f"{key}: did not run")
if res.get("shm"):
    s = res["shm"]
    lines.append(f"shm: 64 MiB round trip {1e3 * s['shm_round_trip_s']:.2f} ms = {100 * s['shm_vs_memcpy']:.0f}% of memcpy "
                 f"({s['memcpy_GBps']:.1f} GB/s); socket lane {1e3 * s['socket_round_trip_s']:.1f} ms")
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "gpu"))
if res["workloads"]:
    from workloads import table
    lines.append(table(res["workloads"]))
else:
    lines.append("workloads: did not run")
if res["replay"]:
    from replay import table as replay_table
    try:
        lines.append(replay_table(res["replay"]))
    except (KeyError, TypeError) as exc:  # a run cut while writing: the JSON is in results.json
        lines.append(f"replay: no table ({type(exc).__name__}: {exc})")
else:
    lines.append("replay: did not run")
text = "\n".join(lines)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
print(text)
EOF
rm -rf "$WORK"

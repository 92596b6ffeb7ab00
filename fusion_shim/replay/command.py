"""``fusion-shim replay run.json --device NAME --link NAME``: the SIMULATED comparison, as a table or JSON."""
from __future__ import annotations

import json
import sys
from typing import Any

from . import hardware
from .simulate import STRATEGIES, compare

USAGE = """\
usage: fusion-shim replay run.json --device NAME --link NAME [--device-file F.toml] [--link-file F.toml]
                          [--cold] [--json]
  devices: """ + ", ".join([*hardware.DEVICES, "cpu-worker"]) + """
  links:   """ + ", ".join([*hardware.LINKS, "loopback"]) + """
Every figure it prints is SIMULATED (models and their sources: docs/replay.md)."""
NAMES = {"auto": "auto (the planner)", "local": "all-local", "remote": "all-remote", "oracle": "oracle"}


def main(argv: list[str]) -> int:
    opts: dict[str, Any] = {"device": None, "link": None, "device-file": None, "link-file": None}
    flags, path = set(), None
    it = iter(argv)
    for arg in it:
        key = arg[2:] if arg.startswith("--") else None
        if arg in ("-h", "--help"):
            print(USAGE)
            return 0
        if key in ("json", "cold"):
            flags.add(key)
        elif key in opts:
            opts[key] = next(it, None)
            if opts[key] is None:
                return _bad(f"{arg} needs a value")
        elif path is None and not arg.startswith("-"):
            path = arg
        else:
            return _bad(f"unexpected argument {arg}")
    if path is None or not opts["device"] or not opts["link"]:
        return _bad("a report, --device and --link are required")
    try:
        with open(path) as f:
            report = json.load(f)
        dev = hardware.device(opts["device"], report, opts["device-file"])
        link = hardware.link(opts["link"], report, opts["link-file"])
        result = compare(report, dev, link, cold="cold" in flags)
    except (OSError, ValueError) as exc:
        print(f"fusion-shim replay: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1, default=str) if "json" in flags else format_comparison(result))
    return 0


def _bad(why: str) -> int:
    print(f"fusion-shim replay: {why}\n{USAGE}", file=sys.stderr)
    return 2


def _ms(s: float) -> str:
    return f"{s * 1e3:10.3f} ms"


def _mb(n: float) -> str:
    return f"{n / 1e6:.3g} MB"


def _bytes(moved: dict[str, Any], strategy: str, way: str) -> str:
    return _mb(moved[strategy][way]) if strategy in moved else "-"  # the oracle is a bound: no bytes of its own


def format_comparison(r: dict[str, Any]) -> str:
    lines = [f"SIMULATED replay of {' '.join(r.get('program') or ['?'])} (recorded under policy "
             f"{r.get('recorded_policy')}) on {r['device']} over {r['link']}",
             f"SIMULATED totals ({r['calls']:.0f} calls; the program's own time between them: {r['other_s'] * 1e3:.3f} ms)",
             f"  {'strategy':<20} {'intercepted':>13} {'program wall':>13} {'calls moved':>12} {'bytes up':>10} "
             f"{'bytes down':>10}"]
    for k in STRATEGIES:
        lines.append(f"  {NAMES[k]:<20} {_ms(r['totals_s'][k])} {_ms(r['wall_s'][k])} {r['moved'][k]:>12.0f} "
                     f"{_bytes(r['bytes'], k, 'up'):>10} {_bytes(r['bytes'], k, 'down'):>10}   SIMULATED")
    best = min(r["totals_s"]["local"], r["totals_s"]["remote"])
    if best > 0 and r["totals_s"]["oracle"] > 0:
        lines.append(f"  auto / min(all-local, all-remote) = {r['totals_s']['auto'] / best:.3f}; "
                     f"auto / oracle = {r['totals_s']['auto'] / r['totals_s']['oracle']:.3f}   SIMULATED")
    if r.get("band_s"):
        band = r["band_s"]
        lines.append("  noise band (lowest - highest of the noisy replays): " + "; ".join(
            f"{NAMES[k]} {band[k][0] * 1e3:.3f} - {band[k][1] * 1e3:.3f} ms" for k in STRATEGIES if k in band)
            + "   SIMULATED")
    lines.append("SIMULATED per call site (intercepted ms; calls the planner / the oracle would move)")
    for name, s in sorted(r["sites"].items(), key=lambda kv: -kv[1]["local"])[:20]:
        lines.append(f"  {name[:60]:<60} {s['calls']:>6.0f} calls  local {s['local'] * 1e3:.3f}  remote "
                     f"{s['remote'] * 1e3:.3f}  auto {s['auto'] * 1e3:.3f}  oracle {s['oracle'] * 1e3:.3f}  "
                     f"moved {s['auto_worker']:.0f}/{s['oracle_worker']:.0f}   SIMULATED")
    if r.get("break_even"):
        lines.append("SIMULATED break-even per op: the worker wins from this input size up")
        for key, b in r["break_even"].items():
            at = (f"{_mb(b['bytes_in'])} in, {b['flops']:.3g} flops" if b["bytes_in"] is not None else "never")
            lines.append(f"  {key:<40} {at}{' (' + b['note'] + ')' if b['note'] else ''}   SIMULATED")
    sample = r["sample"]
    if sample.get("dropped") or sample.get("scaled_sites"):
        lines.append(f"sample: {sample.get('kept', sample.get('records'))} calls kept, {sample.get('dropped', 0)} "
                     "dropped past the per-site cap: each site's figures scaled by its calls / its kept calls")
    if sample.get("unpriced"):
        lines.append(f"{sample['unpriced']} recorded calls had no local time to price: left out")
    lines.append("assumptions (SIMULATED figures):")
    lines += [f"  - {a}" for a in r["assumptions"]]
    lines.append(f"  - sources: {r['device_source']}; {r['link_source']}")
    return "\n".join(lines)

"""Re-price a saved run under another link or device: ``fusion-shim report run.json --what-if ...``.

Everything here is an ESTIMATE, and is printed as one. For each recorded call that the worker could
have run, the local time is what was measured (a local run, or a check's recompute) or else what the
planner predicted; the remote time under the new profile is one round trip, the call's bytes at the
new bandwidth, and its device time (the worker's kernel time where it ran there, else the local time)
divided by the new device's speed-up. The best place per call is summed and compared with all-local.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KEYS = {"bandwidth": "bytes/s each way", "rtt": "seconds per round trip", "speedup": "device time divisor"}


@dataclass(frozen=True)
class LinkProfile:
    bandwidth: float = 2e9
    rtt: float = 200e-6
    speedup: float = 1.0

    @classmethod
    def parse(cls, text: str) -> "LinkProfile":
        """``bandwidth=1.25e8,rtt=0.01,speedup=20`` (any subset)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, raw = part.partition("=")
            if key not in KEYS:
                raise ValueError(f"unknown what-if key {key!r}; valid: " + ", ".join(f"{k} ({v})" for k, v in KEYS.items()))
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} is not a number") from None
            if not values[key] > 0:
                raise ValueError(f"{key} must be > 0")
        return cls(**values)


def _bytes(r: dict) -> float:
    if r["bytes_sent"] or r["bytes_received"]:  # buffers through shared memory move on another link too
        return r["bytes_sent"] + r["bytes_received"] + r.get("shm_sent", 0) + r.get("shm_received", 0)
    itemsize = {"1": 1, "2": 2, "4": 4, "8": 8, "16": 16}
    inputs = sum(math.prod(s) * itemsize.get(d.lstrip("<>|=")[1:], 8) for s, d in zip(r["shapes"], r["dtypes"]))
    return 2 * inputs  # never sent: assume the result is as large as the inputs


def reprice(report: dict[str, Any], profile: LinkProfile) -> dict[str, Any]:
    local_total = best_total = actual_total = 0.0
    moved = priced = 0
    for r in report["records"]:
        if r["kind"] not in ("worker", "local"):
            continue
        local = r["phases"].get("local") or r.get("local_measured_s") or r.get("predicted_local_s")
        if not local:
            continue
        device = r["phases"].get("kernel") or local
        remote = profile.rtt + _bytes(r) / profile.bandwidth + device / profile.speedup
        priced += 1
        local_total += local
        best_total += min(local, remote)
        moved += remote < local
        actual_total += r["wall_s"]
    return {"estimate": True, "profile": profile.__dict__, "calls_priced": priced, "calls_offloaded": moved,
            "all_local_s": local_total, "best_placement_s": best_total, "recorded_s": actual_total}


def format_whatif(result: dict[str, Any]) -> str:
    p = result["profile"]
    saved = result["all_local_s"] - result["best_placement_s"]
    return (f"what-if (ESTIMATE, not measured): bandwidth {p['bandwidth']:.3g} B/s, round trip {p['rtt'] * 1e3:.3g} ms, "
            f"device speed-up x{p['speedup']:.3g}\n"
            f"  {result['calls_priced']} calls priced; {result['calls_offloaded']} would go to the worker\n"
            f"  all-local {result['all_local_s'] * 1e3:.1f} ms, best placement {result['best_placement_s'] * 1e3:.1f} ms "
            f"(saves {saved * 1e3:.1f} ms), as recorded {result['recorded_s'] * 1e3:.1f} ms")

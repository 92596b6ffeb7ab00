"""A Chrome trace event file of the run, for https://ui.perfetto.dev or chrome://tracing.

Tracks: one per program thread (pid = the program), a ``link`` track for the two directions of each
transfer, and the worker's ``device`` track (pid = the worker; with a pool, one per pool worker, named
with its node and device, and the pool's events as instants on the program's track). Each call is a slice named after its
op on its thread's track, with its phases nested inside it, ending where the call ended; time the
shim spent deciding comes first, unnamed. A check's local recompute is a slice of its own right
after the call. The worker reports durations, not timestamps, and the round trip is split evenly
between the two directions: slices on the link and device tracks are placed by that estimate, and
say so in their args.
"""
from __future__ import annotations

import json
import os
from typing import Any

LINK_TID = 1_000_000_001
DEVICE_TID = 1


def _slice(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args: dict | None = None) -> dict:
    ev = {"name": name, "cat": cat, "ph": "X", "ts": ts * 1e6, "dur": max(dur, 0.0) * 1e6, "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def build_trace(report: dict[str, Any]) -> dict[str, Any]:
    pid = report["pid"]
    worker = report.get("worker") or {}
    wpid = (worker.get("info") or {}).get("pid") or pid + 1_000_000
    pool = (report.get("pool") or {}).get("workers") or []
    pool_pids = [w.get("pid") or pid + 1_000_001 + i for i, w in enumerate(pool)]
    events: list[dict] = [_meta("process_name", pid, 0, f"program (pid {pid})"),
                          _meta("thread_name", pid, LINK_TID, "link (estimated placement)"),
                          *_pool_tracks(report, pool, pool_pids)]
    threads = set()
    device_used = False
    for r in report["records"]:
        tid = r.get("thread") or 0
        threads.add(tid)
        start, wall, ph = r["start_s"], r["wall_s"], r["phases"]
        args = {"site": r["site"], "kind": r["kind"], "reason": r["reason"], "shapes": r["shapes"],
                "dtypes": r["dtypes"], "bytes_sent": r["bytes_sent"], "bytes_received": r["bytes_received"]}
        if r.get("verify"):
            args["verify"] = r["verify"]
        events.append(_slice(r["op"], r["kind"], start, wall, pid, tid, args))
        order = ["wait_ready", "encode", "send", "transfer", "decode"] if r["kind"] == "worker" else ["local"]
        on_worker = sum(ph.get(p, 0.0) for p in ("h2d", "kernel", "d2h"))
        # the worker's time sits inside the wait, even where sending used up the measured round trip
        spans = [(p, ph.get(p, 0.0) + (on_worker if p == "transfer" else 0.0)) for p in order
                 if ph.get(p) or (p == "transfer" and on_worker and r["kind"] == "worker")]
        t = start + max(wall - sum(d for _, d in spans), 0.0)  # deciding and preparing come first
        for name, dur in spans:
            label = "waiting for the worker" if name == "transfer" else name
            events.append(_slice(label, "phase", t, dur, pid, tid))
            if name == "transfer":
                half = ph.get("transfer", 0.0) / 2
                est = {"placement": "estimated: round trip split evenly between directions"}
                events.append(_slice("upload", "transfer", t, half, pid, LINK_TID,
                                     {**est, "bytes": r["bytes_sent"]}))
                w = t + half
                on = pool_pids[r["worker"]] if pool and r.get("worker") is not None else wpid
                for wp in ("h2d", "kernel", "d2h"):
                    if ph.get(wp):
                        events.append(_slice(f"{wp} {r['op']}", "device", w, ph[wp], on, DEVICE_TID, est))
                        w += ph[wp]
                        device_used = True
                events.append(_slice("download", "transfer", w, half, pid, LINK_TID,
                                     {**est, "bytes": r["bytes_received"]}))
            t += dur
        if ph.get("verify"):
            events.append(_slice(f"check {r['op']} (kept apart)", "verify", start + wall, ph["verify"], pid, tid,
                                 {"verify": r.get("verify")}))
    for tid in sorted(threads):
        events.append(_meta("thread_name", pid, tid, f"thread {tid}"))
    if device_used and not pool:
        events.append(_meta("process_name", wpid, 0, f"fusion_shim worker (pid {wpid}, "
                                                      f"{(worker.get('info') or {}).get('device', '?')})"))
        events.append(_meta("thread_name", wpid, DEVICE_TID, "device"))
    events.sort(key=lambda e: (e["pid"], e["tid"], e.get("ts", -1), -e.get("dur", 0)))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schema": "fusion_shim.trace/1", "report_schema": report["schema"]}}


def _pool_tracks(report: dict[str, Any], pool: list[dict], pids: list[int]) -> list[dict]:
    """Each pool worker's device track, named; the pool's events as instants on the program's track."""
    out = []
    for w, wpid in zip(pool, pids):
        device = f"{w['device']}, Ray GPU EMULATED" if w.get("gpu_emulated") else w.get("device")
        out += [_meta("process_name", wpid, 0, f"pool worker {w['name']} on {w['node']} ({device}, pid {wpid})"),
                _meta("thread_name", wpid, DEVICE_TID, "device")]
    for e in report.get("events", []) if pool else []:
        if e["what"].startswith("pool"):
            out.append({"name": e["what"], "cat": "pool", "ph": "i", "s": "p", "ts": e["t_s"] * 1e6,
                        "pid": report["pid"], "tid": 0})
    return out


def write_trace(report: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(build_trace(report), f)
    os.replace(tmp, path)

"""The end-of-run report: a table on stderr, and JSON with ``--report PATH``.

JSON schema ``fusion_shim.report/1`` (a map):

- ``schema``: the string ``"fusion_shim.report/1"``; ``pid``; ``argv``; ``policy``; ``wall_s``
  (seconds from install to exit);
- ``worker``: ``url``, ``embedded`` (bool), ``state``, ``ready_after_s`` (null if it never was),
  ``info`` (the worker's ``ready`` reply: pid, device, torch version, self-benchmark in GFLOP/s);
- ``ops``: per op name: ``family``, ``calls`` (recorded calls), ``worker``, ``local`` (decided
  local), ``unsupported`` (arguments the row cannot offload), ``fallback`` (meant for the worker,
  computed here after a fault or while it was not ready), ``below_floor`` (kept local by the size
  floor, counted only), ``bytes_sent``, ``bytes_received``, ``wall_s``, ``phases`` (seconds per
  phase: wait_ready, encode, transfer, h2d, kernel, d2h, decode, local), ``reasons`` (text -> count);
- ``operators``: ``intercepted`` (bool: whether ``a @ b``, ``a @= b`` and ``a.dot(b)`` on ndarrays go
  through the shim; their ops are ``numpy.ndarray.__matmul__``, ``__imatmul__``, ``dot``), ``why``
  (the reason they are not: no C extension, ``FUSION_SHIM_NATIVE=0``, policy local, or an unexpected
  NumPy), ``fast_path`` (``"C"`` or ``"wrapt"``: where the floor check of wrapped functions runs);
- ``events``: worker lifecycle, ``{"t_s", "what"}``;
- ``records``: one map per recorded call (see :class:`fusion_shim.ledger.Record`), at most
  ``ledger.MAX_RECORDS``; ``records_dropped`` counts the rest.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from ..ledger import PHASES

SCHEMA = "fusion_shim.report/1"


def build(rt: Any) -> dict[str, Any]:
    snap = rt.ledger.snapshot()
    link = rt.link
    return {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "policy": rt.config.policy,
        "wall_s": rt.ledger.now(),
        "operators": dict(rt.operators),
        "worker": None if link is None else {
            "url": link.url, "embedded": link.embedded, "state": link.state,
            "ready_after_s": link.ready_after_s, "restarts": link.restarts, "info": link.info,
        },
        **snap,
    }


def write_json(report: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}MB" if n else "-"


def _ms(s: float | None) -> str:
    if not s:
        return "-"
    return f"{s * 1e3:.1f}ms" if s < 10 else f"{s:.1f}s"


def format_table(report: dict[str, Any]) -> str:
    lines = []
    w = report.get("worker")
    if w is None:
        where = "no worker"
    else:
        info = w.get("info") or {}
        ready = (f"ready after {w['ready_after_s']:.2f}s" if w.get("ready_after_s") is not None
                 else f"never ready ({w.get('state')})")
        where = f"worker {w['url']} ({info.get('device', '?')}, {ready})"
    lines.append(f"fusion_shim report · pid {report['pid']} · policy {report['policy']} · {where} · "
                 f"wall {report['wall_s']:.2f}s")
    operators = report.get("operators") or {}
    if operators and not operators.get("intercepted") and operators.get("why") != "policy local":
        lines.append(f"  operators @, @=, .dot: not intercepted ({operators.get('why')})")
    ops = report["ops"]
    if not ops:
        lines.append("  no intercepted calls")
        return "\n".join(lines)
    phases = [p for p in PHASES if any(o["phases"].get(p) for o in ops.values())]
    head = ["op", "calls", "worker", "local", "unsup", "fallbk", "<floor", "sent", "recv", *phases]
    rows = []
    totals: dict[str, float] = {}
    for name, o in ops.items():
        rows.append([name.removeprefix("numpy."), str(o["calls"]), str(o["worker"]), str(o["local"]),
                     str(o["unsupported"]), str(o["fallback"]), str(o.get("below_floor", 0)),
                     _mb(o["bytes_sent"]), _mb(o["bytes_received"]), *(_ms(o["phases"].get(p)) for p in phases)])
        for p in phases:
            totals[p] = totals.get(p, 0.0) + o["phases"].get(p, 0.0)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  " + "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
    lines.append(fmt(head))
    lines.extend(fmt(r) for r in rows)
    worker_s = sum(totals.get(p, 0.0) for p in ("encode", "transfer", "h2d", "kernel", "d2h", "decode"))
    lines.append(f"  time in intercepted calls: on the worker path {_ms(worker_s)}, computed here "
                 f"{_ms(totals.get('local'))}, waiting for a cold worker {_ms(totals.get('wait_ready'))}")
    reasons = [(n, r, c) for n, o in ops.items() for r, c in o["reasons"].items()]
    if reasons:
        lines.append("  ran here instead of on the worker:")
        for name, reason, count in sorted(reasons, key=lambda x: -x[2])[:12]:
            lines.append(f"    {name.removeprefix('numpy.')} x{count}: {reason}")
    for ev in report["events"]:
        lines.append(f"  [{ev['t_s']:7.2f}s] {ev['what']}")
    return "\n".join(lines)


def at_exit(rt: Any, stream: TextIO | None = None) -> None:
    report = build(rt)
    if rt.config.report:
        write_json(report, rt.config.report)
    operators = report["operators"]
    # a program that only uses `@` must still learn that it was not intercepted (issue 3)
    unexpected = not operators["intercepted"] and operators["why"] not in ("policy local", "FUSION_SHIM_NATIVE=0")
    if not rt.config.quiet and (report["ops"] or rt.config.report or unexpected):
        print(format_table(report), file=stream or sys.stderr)


def render(path: str) -> str:
    with open(path) as f:
        report = json.load(f)
    if report.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} file (schema {report.get('schema')!r})")
    return format_table(report)


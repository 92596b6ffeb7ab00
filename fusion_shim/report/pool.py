"""The report's pool section: each worker of a pool on Ray (its node, device, calls, bytes, resident
data, restarts) and the lines the table shows for it. Read from the links the run made."""
from __future__ import annotations

from typing import Any, Sequence


def pool_section(url: str | None, links: Sequence[Any]) -> dict[str, Any] | None:
    """None for a run without a pool; else the pool's address and one entry per worker."""
    if not url:
        return None
    workers = []
    for link in links:
        info = link.pool or {}
        workers.append({
            # the device the worker said when ready; Ray's word for it only before that
            "name": info.get("name"), "node": info.get("node"), "device": link.info.get("device") or info.get("device"),
            "ray_gpus": info.get("ray_gpus"), "gpu_emulated": bool(info.get("gpu_emulated")),
            "url": link.url, "state": link.state, "pid": info.get("pid"), "restarts": link.restarts,
            "calls": link.calls, "calls_since_restart": link.calls_since_restart,
            "bytes_sent": link.bytes_sent, "bytes_received": link.bytes_received,
            "resident_bytes": link.mirror.nbytes,
        })
    return {"url": url, "workers": workers}


def pool_lines(section: dict[str, Any] | None, events: Sequence[dict] = ()) -> list[str]:
    """One line per pool worker under the table; a pool not used: the one line that says why."""
    if not section:
        return []
    if not section["workers"]:
        why = [e["what"] for e in events if e["what"].startswith(f"pool {section['url']} not used")]
        return [f"  {why[0] if why else 'pool ' + section['url'] + ': not used'}"]
    lines = [f"  pool {section['url']}:"]
    for w in section["workers"]:
        device = f"{w['device']}, Ray GPU {','.join(w['ray_gpus'] or [])} EMULATED" if w["gpu_emulated"] else w["device"]
        restarted = (f", restarted {w['restarts']}x by Ray ({w['calls_since_restart']} calls since)"
                     if w["restarts"] else "")
        lines.append(f"    {w['name']} on {w['node']} ({device}): {w['calls']} calls, "
                     f"{w['bytes_sent'] / 1e6:.1f} MB sent, {w['bytes_received'] / 1e6:.1f} MB received, "
                     f"{w['resident_bytes'] / 1e6:.1f} MB resident, {w['state']}{restarted}")
    return lines

"""The report's pool section: each worker of a pool on Ray (its node, device, calls, bytes, resident
data, restarts) and the lines the table shows for it. Read from the links the run made."""
from __future__ import annotations

from typing import Any, Sequence


def pool_section(url: str | None, links: Sequence[Any], pool: Any = None, opening: Any = None
                 ) -> dict[str, Any] | None:
    """None for a run without a pool; else the pool's address, one entry per worker, ``opening``
    (D302, under auto: why the pool was not opened, or on what evidence it was) and ``ray``: D300, the
    seconds Ray cost, all in helper processes (``probe_s``: the check without the token; ``total_s``:
    the drivers' whole lives, of which ``import_s``, ``connect_s``, ``join_s``; the rest is their
    interpreters' start and exit; ``helpers``: how many drivers ran), empty where Ray was never asked."""
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
    return {"url": url, "workers": workers, "opening": opening() if callable(opening) else None,
            "ray": dict(getattr(pool, "ray", None) or {})}


def pool_lines(section: dict[str, Any] | None, events: Sequence[dict] = ()) -> list[str]:
    """One line per pool worker under the table; a pool not used: the one line that says why."""
    if not section:
        return []
    ray = ray_line(section.get("ray") or {})
    if section.get("opening") and not section["workers"]:
        return [f"  pool {section['url']} {section['opening']}"] + ray
    if not section["workers"]:
        why = [e["what"] for e in events if e["what"].startswith(f"pool {section['url']} not used")]
        return [f"  {why[0] if why else 'pool ' + section['url'] + ': not used'}"] + ray
    lines = [f"  pool {section['url']}:"] + ([f"    {section['opening']}"] if section.get("opening") else []) + ray
    for w in section["workers"]:
        device = f"{w['device']}, Ray GPU {','.join(w['ray_gpus'] or [])} EMULATED" if w["gpu_emulated"] else w["device"]
        restarted = (f", restarted {w['restarts']}x by Ray ({w['calls_since_restart']} calls since)"
                     if w["restarts"] else "")
        lines.append(f"    {w['name']} on {w['node']} ({device}): {w['calls']} calls, "
                     f"{w['bytes_sent'] / 1e6:.1f} MB sent, {w['bytes_received'] / 1e6:.1f} MB received, "
                     f"{w['resident_bytes'] / 1e6:.1f} MB resident, {w['state']}{restarted}")
    return lines


def ray_line(ray: dict[str, float]) -> list[str]:
    """D300: what Ray cost, in one line; none where no helper ran."""
    total = ray.get("total_s", 0.0) + ray.get("probe_s", 0.0)
    if not total:
        return []
    parts = [f"token probe {ray.get('probe_s', 0.0):.2f} s"]
    if ray.get("helpers"):
        steps = [f"{k.removesuffix('_s')} {ray[k]:.2f} s" for k in ("import_s", "connect_s", "join_s") if k in ray]
        rest = ray["total_s"] - sum(ray.get(k, 0.0) for k in ("import_s", "connect_s", "join_s"))
        parts.append(f"{int(ray['helpers'])} driver(s) {ray['total_s']:.2f} s: {', '.join(steps + [''])}"
                     f"interpreter start and exit {max(rest, 0.0):.2f} s")
    return [f"    Ray: {total:.2f} s, all in helper processes, Ray never loaded here ({'; '.join(parts)})"]

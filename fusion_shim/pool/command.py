"""``fusion-shim pool up|status|down``: the pool's commands, each a call into :mod:`.manage`, each
failing in one line on stderr (no cluster, a cluster that serves anyone, no Ray)."""
from __future__ import annotations

import argparse
import sys
import time

from . import DEFAULT_NAME

PROG = "fusion-shim pool"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="A pool of fusion_shim workers on a Ray cluster.")
    sub = p.add_subparsers(dest="action", required=True)
    for action, text in (("up", "start the pool's workers (none if a pool of that name is up)"),
                         ("status", "a table of the pool's workers"), ("down", "stop and remove the pool")):
        a = sub.add_parser(action, help=text)
        a.add_argument("--ray", default="auto", metavar="ADDRESS",
                       help="the cluster's address (HOST:PORT; default auto: the cluster this host is in)")
        a.add_argument("--name", default=DEFAULT_NAME, help=f"the pool's name (default {DEFAULT_NAME})")
        if action == "up":
            a.add_argument("--workers", type=int, required=True, metavar="N", help="how many workers")
            a.add_argument("--device", default="auto", help="auto, cpu or cuda (a GPU per worker)")
            a.add_argument("--memory-budget", default=None,
                           help="bytes each resident store may hold (2G, 512M); default: a quarter of the host's "
                                "RAM (at most 8G) split among the pool's workers on it, or half of each one's GPU")
            a.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                           help="how long the cluster has to find room for the workers (default 120)")
            a.add_argument("--allow-code", action="store_true",
                           help="run stages (functions clients send, docs/stages.md) for the pool's clients")
            a.add_argument("--insecure", action="store_true",
                           help="use a cluster without token authentication (anyone who reaches it joins the pool)")
    return p


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr)


def main(argv: list[str]) -> int:
    p = parser()
    opts = p.parse_args(argv)
    from ..config import ConfigError, _device
    from ..worker.command import size

    try:
        import ray  # noqa: F401
    except ImportError:
        _say("Ray is not installed: pip install 'fusion-shim[ray]'")
        return 2
    from .cluster import check

    device = budget = None
    if opts.action == "up":
        try:
            device = _device("--device", opts.device)
            budget = None if opts.memory_budget is None else size(opts.memory_budget)
        except (ConfigError, ValueError) as exc:
            p.error(str(exc))
        if opts.workers < 1:
            p.error("--workers must be >= 1")
        if opts.wait is not None and not opts.wait >= 0:
            p.error("--wait must be >= 0")
    # D210: only `up` gives keys to the cluster; status and down work on any cluster, with the warning
    why, warning = check(opts.ray, insecure=getattr(opts, "insecure", False) or opts.action != "up")
    if why is not None:
        _say(why)
        return 2
    if warning is not None:
        _say(f"warning: {warning}")
    try:
        return _run(opts, device, budget)
    except KeyboardInterrupt:  # D267: what up had placed is removed on the way out
        _say(f"{opts.action} interrupted" + (": nothing left placed" if opts.action == "up" else ""))
        return 130
    except Exception as exc:  # Ray's failures in one line, not its traceback
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        _say(f"{opts.action} failed: {type(exc).__name__}: {text}")
        return 1


def _run(opts: argparse.Namespace, device: str | None, budget: int | None) -> int:
    from . import manage

    if opts.action == "status":
        print(manage.table(manage.status(opts.ray, opts.name)))
        return 0
    if opts.action == "down":
        stopped = manage.down(opts.ray, opts.name)
        print(f"pool {opts.name}: {len(stopped)} workers stopped" + "".join(f"\n  {s}" for s in stopped))
        return 0
    t = time.monotonic()
    wait = manage.WAIT_S if opts.wait is None else opts.wait
    rows, made = manage.up(opts.ray, opts.workers, device, budget, opts.name, wait=wait, allow_code=opts.allow_code,
                           say=lambda text: print(f"pool {opts.name}: {text}", flush=True))
    verb = f"up in {time.monotonic() - t:.1f}s" if made else "was up already: nothing made"
    if rows and not made and any(bool(r.get("allow_code")) != opts.allow_code for r in rows):
        verb += " (its workers' --allow-code differs: pool down first to change it)"
    print(f"pool {opts.name} {verb}, {len(rows)} workers")
    print(manage.table(rows))
    return 0

"""``fusion-shim pool up|status|down``: the pool's commands, each a call into :mod:`.manage`."""
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
        a.add_argument("--ray", required=True, metavar="ADDRESS", help="the cluster's address (HOST:PORT, or auto)")
        a.add_argument("--name", default=DEFAULT_NAME, help=f"the pool's name (default {DEFAULT_NAME})")
        if action == "up":
            a.add_argument("--workers", type=int, required=True, metavar="N", help="how many workers")
            a.add_argument("--device", default="auto", help="auto, cpu or cuda (a GPU per worker)")
            a.add_argument("--memory-budget", default=None, help="bytes each resident store may hold (2G, 512M)")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    opts = p.parse_args(argv)
    from ..config import ConfigError, _device
    from ..worker.command import size

    try:
        import ray  # noqa: F401
    except ImportError:
        print(f"{PROG}: Ray is not installed: pip install 'fusion-shim[ray]'", file=sys.stderr)
        return 2
    from . import manage

    if opts.action == "status":
        print(manage.table(manage.status(opts.ray, opts.name)))
        return 0
    if opts.action == "down":
        print(f"pool {opts.name}: {manage.down(opts.ray, opts.name)} workers stopped")
        return 0
    try:
        device = _device("--device", opts.device)
        budget = None if opts.memory_budget is None else size(opts.memory_budget)
    except (ConfigError, ValueError) as exc:
        p.error(str(exc))
    if opts.workers < 1:
        p.error("--workers must be >= 1")
    t = time.monotonic()
    rows, made = manage.up(opts.ray, opts.workers, device, budget, opts.name)
    verb = f"up in {time.monotonic() - t:.1f}s" if made else "was up already: nothing made"
    print(f"pool {opts.name} {verb}, {len(rows)} workers")
    print(manage.table(rows))
    return 0

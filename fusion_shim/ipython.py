"""IPython: ``%load_ext fusion_shim``, then a ``%%fusion_shim [options]`` cell runs through the shim
and prints the same summary for that cell's calls, its header with the cell's own wall time.

Options: ``--policy``, ``--worker``, ``--verify``, ``--timeout``, ``--device``, ``--strict`` as on the
command line. After the cell the shim it installed is uninstalled (D287), every patched function
and operator restored exactly, and a shim that was in place before the cell is put back as it was;
``--stay`` keeps the cell's shim installed for later cells. A shim already in place with the cell's
settings is used, and left in place.
"""
from __future__ import annotations

import argparse
import shlex
import time
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%fusion_shim", add_help=False)
    for name in ("--policy", "--worker", "--verify", "--timeout", "--device"):
        p.add_argument(name)
    p.add_argument("--strict", action="store_true", default=None)
    p.add_argument("--stay", action="store_true", help="keep the shim installed after the cell")
    return p


@magics_class
class FusionShimMagics(Magics):
    @cell_magic
    def fusion_shim(self, line: str, cell: str) -> Any:
        from .intercept import install, installed_settings

        opts = vars(_parser().parse_args(shlex.split(line)))
        stay = opts.pop("stay")
        settings = {k: v for k, v in opts.items() if v is not None}
        before = installed_settings()
        ours = before is None or any(str(getattr(before[0], k)) != str(v) for k, v in settings.items())
        if ours:
            install(quiet=True, **settings)
        try:
            self._run_and_report(cell)
        finally:
            if ours and not stay:
                _restore(before)
        return None  # run_cell has shown any error; the summary is printed either way

    def _run_and_report(self, cell: str) -> None:
        from .intercept import active
        from .ledger import Ledger
        from .reporting import build, format_table

        import numpy  # noqa: F401  (the shim wraps NumPy when it is imported)

        rt = active()
        start = len(rt.ledger.records)
        below = _below_floor(rt.ledger)
        started = time.perf_counter()
        self.shell.run_cell(cell)
        cell_ledger = Ledger()  # this cell's share: its records, its size-floor counts, its wall time
        cell_ledger.started = started
        for rec in rt.ledger.records[start:]:
            cell_ledger.add(rec)
        for name, n in _below_floor(rt.ledger).items():
            cell_ledger.fast_path[name][0] = n - below.get(name, 0)
        print(format_table(build(rt, cell_ledger)))


def _restore(before: Any) -> None:
    """D287: the cell's shim uninstalled (what it patched put back exactly), then the one in place
    before the cell, if any, installed again with its own settings."""
    from .intercept import install, uninstall

    uninstall()
    if before is not None:
        config, export_env = before
        install(config, export_env=export_env)


def _below_floor(ledger: Any) -> dict[str, int]:
    """Calls kept here by the size floor so far, by op: the Python fast path's and the C one's."""
    counts = {k: c[0] for k, c in ledger.fast_path.items()}
    for read, _ in ledger.counters:
        for name, n in read().items():
            counts[name] = counts.get(name, 0) + n
    return counts


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(FusionShimMagics)

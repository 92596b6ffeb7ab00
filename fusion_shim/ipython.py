"""IPython: ``%load_ext fusion_shim``, then a ``%%fusion_shim [options]`` cell runs through the shim
and prints the same summary for that cell's calls.

Options: ``--policy``, ``--worker``, ``--verify``, ``--timeout``, ``--strict`` as on the command line.
The shim stays installed after the cell (for the next ones); a cell with other settings reinstalls it.
"""
from __future__ import annotations

import argparse
import shlex
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%fusion_shim", add_help=False)
    for name in ("--policy", "--worker", "--verify", "--timeout", "--device"):
        p.add_argument(name)
    p.add_argument("--strict", action="store_true", default=None)
    return p


@magics_class
class FusionShimMagics(Magics):
    @cell_magic
    def fusion_shim(self, line: str, cell: str) -> Any:
        from .intercept import active, install
        from .ledger import Ledger
        from .report import build, format_table

        opts = vars(_parser().parse_args(shlex.split(line)))
        settings = {k: v for k, v in opts.items() if v is not None}
        rt = active()
        if rt is None or any(str(getattr(rt.config, k)) != str(v) for k, v in settings.items()):
            rt = install(quiet=True, **settings)
        import numpy  # noqa: F401  (the shim wraps NumPy when it is imported)

        rt = active()
        start = len(rt.ledger.records)
        below = _below_floor(rt.ledger)
        self.shell.run_cell(cell)
        cell_ledger = Ledger()  # this cell's share: its records and its size-floor counts
        cell_ledger.started = rt.ledger.started
        for rec in rt.ledger.records[start:]:
            cell_ledger.add(rec)
        for name, n in _below_floor(rt.ledger).items():
            cell_ledger.fast_path[name][0] = n - below.get(name, 0)
        print(format_table(build(rt, cell_ledger)))
        return None  # run_cell has shown any error; the summary is printed either way


def _below_floor(ledger: Any) -> dict[str, int]:
    """Calls kept here by the size floor so far, by op: the Python fast path's and the C one's."""
    counts = {k: c[0] for k, c in ledger.fast_path.items()}
    for read, _ in ledger.counters:
        for name, n in read().items():
            counts[name] = counts.get(name, 0) + n
    return counts


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(FusionShimMagics)

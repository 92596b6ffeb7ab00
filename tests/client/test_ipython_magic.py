"""``%%fusion_shim`` in IPython's own shell (D287): the header's wall time is the cell's, and the
shim the cell installed is gone after it, NumPy restored exactly, unless ``--stay``."""
from __future__ import annotations

import re

import numpy as np
import pytest

import fusion_shim

pytest.importorskip("IPython")
pytestmark = pytest.mark.usefixtures("no_shim_after")

CELL = "import numpy as np\nx = np.dot(np.ones((4, 4)), np.ones((4, 4)))\n"


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "fusion_shim")
    return sh


def _cell(shell, capsys, line: str) -> str:
    capsys.readouterr()
    shell.run_cell_magic("fusion_shim", line, CELL)
    return capsys.readouterr().out


def test_the_header_shows_the_cells_own_wall_time(shell, capsys):
    rt = fusion_shim.install(policy="local", quiet=True)
    rt.ledger.started -= 1000.0  # a shim installed long before the cell
    out = _cell(shell, capsys, "--policy local")
    wall = float(re.search(r"wall (\d+\.\d+)s", out).group(1))
    assert wall < 100.0, out
    assert re.search(r"\bdot\s+1\b", out), out


def test_the_cells_shim_is_uninstalled_after_it_and_numpy_restored(shell, capsys):
    from fusion_shim.intercept import native

    dot, matmul, entries = np.dot, np.matmul, native._native.entries() if native.available() else None
    _cell(shell, capsys, "--policy local")
    assert fusion_shim.active() is None
    assert np.dot is dot and np.matmul is matmul
    assert entries is None or native._native.entries() == entries
    assert shell.user_ns["x"][0, 0] == 4.0


def test_stay_keeps_the_cells_shim_for_later_cells(shell, capsys):
    _cell(shell, capsys, "--policy local --stay")
    rt = fusion_shim.active()
    assert rt is not None and rt.config.policy == "local"
    _cell(shell, capsys, "--policy local")  # the same settings: that shim is used, and left in place
    assert fusion_shim.active() is rt


def test_a_shim_in_place_before_the_cell_is_put_back_with_its_settings(shell, capsys):
    before = fusion_shim.install(policy="local", quiet=True, timeout=7.0)
    _cell(shell, capsys, "--policy local --timeout 9")
    after = fusion_shim.active()
    assert after is not None and after is not before and after.config == before.config

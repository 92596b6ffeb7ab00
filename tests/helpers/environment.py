"""The environment the suite runs in, set up once, on import, by ``tests/conftest.py``.

Tests never inherit a user's shim settings; what was set is kept in ``ENV_AT_START`` for the few
tests that must honour it (``FUSION_SHIM_NATIVE=0``: a build without the C extension). Nor do
they read or write the user's calibration cache or keys: one fresh directory per session, inherited by
the programs the tests launch and removed at the end. The numba.cuda kernels run under numba's
CUDA simulator unless the differential suite targets a real GPU (``FUSION_DIFF_DEVICE=cuda``) or
the caller chose (``NUMBA_ENABLE_CUDASIM=0``); set before anything imports numba, and inherited
by the worker processes the tests start.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/helpers/ is two below it

ENV_AT_START = {k: v for k, v in os.environ.items() if k.startswith("FUSION_SHIM")}
NATIVE_OFF = ENV_AT_START.get("FUSION_SHIM_NATIVE", "").strip().lower() in ("0", "false", "no", "off")
for _k in ENV_AT_START:
    del os.environ[_k]

# one directory for the whole run: pytest-xdist's workers inherit the controller's (set before they start)
_INHERITED = os.environ.get("FUSION_TEST_CACHE_DIR") if os.environ.get("PYTEST_XDIST_WORKER") else None
CACHE_DIR = _INHERITED or tempfile.mkdtemp(prefix="fusion-shim-test-cache-")
os.environ["FUSION_TEST_CACHE_DIR"] = os.environ["XDG_CACHE_HOME"] = CACHE_DIR
os.environ["XDG_CONFIG_HOME"] = os.path.join(CACHE_DIR, "config")  # this user's keys (a loopback tcp worker's)
os.environ.setdefault("NUMBA_ENABLE_CUDASIM",
                      "0" if os.environ.get("FUSION_DIFF_DEVICE", "cpu") != "cpu" else "1")


def remove_cache_dir() -> None:
    """At the end of the run, by the process that made it (a worker's session ends while others run)."""
    if not _INHERITED:
        shutil.rmtree(CACHE_DIR, ignore_errors=True)

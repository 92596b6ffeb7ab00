"""Shared fixtures. ``shim`` runs the shim against an in-process worker (``inproc://``: a worker
thread in this process, no socket), forced remote, so every supported call goes to the worker."""
from __future__ import annotations

import itertools
import os
import sys
import tempfile

import pytest

import fusion_shim

_ids = itertools.count()
# Tests never inherit a user's shim settings; what was set is kept here for the few tests that
# must honour it (FUSION_SHIM_NATIVE=0: a build without the C extension, issue 3).
ENV_AT_START = {k: v for k, v in os.environ.items() if k.startswith("FUSION_SHIM")}
for _k in ENV_AT_START:
    del os.environ[_k]
# ...nor read or write the user's calibration cache (issue 5): one fresh directory per session,
# inherited by the programs the tests launch
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fusion-shim-test-cache-")
# The numba.cuda kernels (issue 9) run under numba's CUDA SIMULATOR in tests, unless the differential
# suite targets a real GPU (FUSION_DIFF_DEVICE=cuda) or the caller chose (NUMBA_ENABLE_CUDASIM=0).
# Set before anything imports numba; worker processes the tests start inherit it.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0" if os.environ.get("FUSION_DIFF_DEVICE", "cpu") != "cpu" else "1")


@pytest.fixture(scope="session")
def inproc_worker():
    from fusion_shim.worker import serve_in_thread

    url = f"inproc://fusion-shim-tests-{os.getpid()}"
    thread, stop = serve_in_thread(url, device="cpu")
    yield url
    stop.set()
    thread.join(5)


@pytest.fixture
def shim(inproc_worker):
    """The shim installed with policy remote against the in-process worker, ready."""
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, timeout=30.0)
    assert rt.link.wait_ready(60), f"in-process worker never became ready: {rt.ledger.events}"
    yield rt
    fusion_shim.uninstall()


def last_record(rt):
    assert rt.ledger.records, "no call was recorded"
    return rt.ledger.records[-1]


@pytest.fixture
def python():
    return sys.executable

"""Shared fixtures. ``shim`` runs the shim against an in-process worker (``inproc://``: a worker
thread in this process, no socket), forced remote, so every supported call goes to the worker."""
from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import environment  # first: it clears the shim's settings before anything reads them
import fusion_shim


def pytest_sessionfinish(session, exitstatus):
    environment.remove_cache_dir()


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


@pytest.fixture
def python():
    return sys.executable

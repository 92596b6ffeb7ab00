"""Shared fixtures. ``shim`` runs the shim against an in-process worker (``inproc://``: a worker
thread in this process, no socket), forced remote, so every supported call goes to the worker.
Files that want it installed once per module, or with other options, make their own ``shim``
with :func:`tests.helpers.shims.shim_fixture`."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from tests.helpers import environment  # first: it clears the shim's settings before anything reads them
import fusion_shim
from tests.helpers.shims import shim_fixture
from tests.helpers.workers import thread_worker


def pytest_sessionfinish(session, exitstatus):
    environment.remove_cache_dir()


@pytest.fixture(scope="session")
def inproc_worker():
    with thread_worker("tests") as (url, _):
        yield url


shim = shim_fixture()


@pytest.fixture
def no_shim_after():
    """No shim installed when the test starts, none left when it ends (files that install their own
    use it for every test: ``pytestmark = pytest.mark.usefixtures("no_shim_after")``)."""
    fusion_shim.uninstall()
    yield
    fusion_shim.uninstall()


@pytest.fixture
def sock_dir():
    """A short directory for ipc:// sockets (a unix socket path is limited to ~100 bytes), removed
    after the test."""
    path = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def python():
    return sys.executable


def pytest_configure(config):
    """Under pytest-xdist every test process has its own BLAS and torch threads: each held to one,
    so that two processes on two cores do not each spin two (set before the workers start)."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")

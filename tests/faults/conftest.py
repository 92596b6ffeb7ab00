"""The fault tests' workers: subprocesses started by a test, killed at its end."""
from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.helpers.faults import Workers


@pytest.fixture
def workers(sock_dir):
    w = Workers(sock_dir)
    yield w
    w.close()


@pytest.fixture(scope="module")
def live_worker():
    """One healthy worker for the tests that leave it alive."""
    directory = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
    w = Workers(directory)
    proc, url = w.start("live")
    yield proc, url
    w.close()
    shutil.rmtree(directory, ignore_errors=True)

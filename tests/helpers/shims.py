"""Installing the shim for a test, and reading what it recorded."""
from __future__ import annotations

import contextlib

import pytest

import fusion_shim

# How long a test waits for a worker to become ready: an event, so a healthy run never waits it out.
# A worker's start-up self-benchmark is taken again while other processes hold its CPUs: an
# in-process CPU worker took 114 s to be ready at a load average of 9 on 2 cores (3 s idle).
READY_S = 600.0
CALL_TIMEOUT_S = 30.0  # a remote call's deadline in the shims the fixtures install


def install(worker: str, *, ready_s: float = READY_S, **options):
    """``fusion_shim.install`` with policy remote (unless ``options`` say otherwise), quiet, against
    ``worker``; returns the runtime once the worker is ready (fails after ``ready_s``). The hello
    waits ``ready_s`` too (``ready_timeout``): its default 120 s was outlived by a warming worker."""
    rt = fusion_shim.install(**{"policy": "remote", "worker": worker, "quiet": True, "ready_timeout": ready_s,
                                **options})
    if not rt.link.wait_ready(ready_s):
        events = list(rt.ledger.events)
        fusion_shim.uninstall()
        raise AssertionError(f"worker {worker} never became ready in {ready_s} s: {events}")
    return rt


@contextlib.contextmanager
def installed(worker: str, **options):
    """:func:`install`, uninstalled on exit."""
    rt = install(worker, **options)
    try:
        yield rt
    finally:
        fusion_shim.uninstall()


def shim_fixture(worker: str = "inproc_worker", scope: str = "function", **options):
    """A fixture: the shim installed by :func:`install` against the worker URL that the fixture named
    ``worker`` gives, ``timeout`` CALL_TIMEOUT_S unless ``options`` say otherwise; uninstalled after
    the test (``scope`` "module": after the module; an install calibrates, 0.1-0.8 s)."""
    options = {"timeout": CALL_TIMEOUT_S, **options}

    @pytest.fixture(scope=scope)
    def shim(request):
        rt = install(request.getfixturevalue(worker), **options)
        yield rt
        fusion_shim.uninstall()

    return shim


def last_record(rt):
    assert rt.ledger.records, "no call was recorded"
    return rt.ledger.records[-1]


def start_fresh(shim) -> None:
    """A test starts with this module's shim still installed, its worker ready and an empty ledger."""
    assert fusion_shim.active() is shim, "another install replaced this module's shim"
    assert shim.link.wait_ready(READY_S), f"worker not ready: {shim.ledger.events[-3:]}"
    shim.ledger.clear()

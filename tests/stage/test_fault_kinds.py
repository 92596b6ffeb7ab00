"""D335: a stage's fault is named as a call's is, by ``client.call.fault_kind``: the worker's error
reply to a stage is a ``WorkerFault`` with its kind and exception's name; a fault of the link is the
same kind whichever path met it. The faults made end to end are in test_stages.py."""
from __future__ import annotations

import pytest

from fusion_shim import transport
from fusion_shim.client import remote as call_remote
from fusion_shim.client.call import fault_kind
from fusion_shim.ledger import Record
from fusion_shim.stages import remote

STAGE_FAULTS = [
    (remote.Failed("worker: StageTimeout: the stage ran past its 5 s", "kernel_error", "StageTimeout"), "timeout"),
    (remote.Failed("worker: StageCrashed: signal 11", "kernel_error", "StageCrashed"), "worker_fault"),
    (remote.Failed("worker: WorkerBusy: full", "busy", "WorkerBusy"), "busy"),
    (remote.Failed("worker: MemoryError: no room", "out_of_memory", "MemoryError"), "out_of_memory"),
    (remote.Failed("worker: CodeMissing: no module", "code_missing", "CodeMissing"), "worker_fault"),
    (transport.Unauthenticated("no keys", "no keys", "fusion-shim keys"), "refused"),
    (transport.Refused("handshake failed"), "refused"),
]


@pytest.mark.parametrize("exc,kind", STAGE_FAULTS, ids=[f"{type(e).__name__}-{k}" for e, k in STAGE_FAULTS])
def test_a_stage_fault_has_the_kind_a_call_fault_has(exc, kind):
    assert fault_kind(exc) == kind


def test_a_stage_error_reply_is_a_worker_fault_that_leaves_the_link_up():
    fail = remote.Failed("worker: StageCrashed: signal 11", "kernel_error", "StageCrashed")
    assert isinstance(fail, call_remote.WorkerFault) and isinstance(fail, transport.TransportError)
    assert (fail.kind, fail.exc) == ("kernel_error", "StageCrashed")


def test_a_stage_the_worker_answered_with_an_error_is_recorded_as_a_call_would_be():
    from fusion_shim.client.call import fell_back, strict_error

    rec = fell_back(Record("stage m:f", "stage", site="app.py:3"),
                    remote.Failed("worker: StageTimeout: the stage ran past its 5 s", "kernel_error", "StageTimeout"))
    assert (rec.kind, rec.fallback) == ("fallback", "timeout")
    assert rec.reason == "Failed: worker: StageTimeout: the stage ran past its 5 s"
    err = strict_error(rec, "would run here")
    assert err.kind == "timeout"
    assert str(err) == "timeout: stage m:f at app.py:3 would run here: Failed: worker: StageTimeout: the stage ran past its 5 s"

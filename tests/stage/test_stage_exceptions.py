"""A stage's exception run on the worker (docs/stages.md, D216): the program sees the stage's own
frames, and the report records what was raised, as for a stage run here."""
from __future__ import annotations

import traceback

import numpy as np
import pytest

from fusion_shim.reporting import build
from fusion_shim.reporting.stages import stage_lines
from tests.helpers.shims import install
from tests.stage import stagefns

M = "tests.stage.stagefns"


def _raise_from_stage(rt):
    with pytest.raises(ValueError, match=r"^deep trouble: \(2, 3\)$") as got:
        stagefns.fails_deep(np.zeros((2, 3)))
    rec = [r for r in rt.ledger.records if r.op == f"stage {M}:fails_deep"][-1]
    return got.value, rec


def test_a_stage_exception_from_the_worker_carries_the_stages_own_frames(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:fails_deep",))
    exc, rec = _raise_from_stage(rt)
    assert rec.kind == "worker"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "in fails_deep" in text and "in _deeper" in text and "stagefns.py" in text, text
    assert 'raise ValueError(f"deep trouble: {a.shape}")' in text, text
    assert "run_job" not in text  # the stage process's own frame is not the stage's
    assert not hasattr(exc, "_fusion_shim_stage_traceback")  # the program's exception as the stage raised it


def test_the_report_records_what_a_stage_raised_on_the_worker(code_worker):
    rt = install(code_worker[0], stages=(f"{M}:fails_deep",))
    _, rec = _raise_from_stage(rt)
    assert rec.raised == "ValueError"
    built = build(rt)
    assert [r["raised"] for r in built["records"] if r["op"] == f"stage {M}:fails_deep"] == ["ValueError"]
    assert built["stages"][f"{M}:fails_deep"]["raised"] == {"ValueError": 1}
    assert "      raised: ValueError x1" in stage_lines(built["stages"])


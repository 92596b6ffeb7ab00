"""A forked child computes where its parent does (D201): forked while the embedded worker is still
starting (a multiprocessing pool made at the program's start), the child waits for that worker
itself and offloads the same call the parent offloads, so both get the same bits; the child's report
says so. (Forked once the worker is ready: tests/faults/test_lifecycle.py.)"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers.faults import PY, clean_env

pytestmark = pytest.mark.usefixtures("no_shim_after")

APP = """\
import json, multiprocessing, os
import numpy as np
import fusion_shim

def child(_):
    rt = fusion_shim.active()
    got = np.fft.rfft(np.ones(100))
    rec = rt.ledger.records[-1]
    return got.tobytes().hex(), rec.kind, rec.reason, [e for e in rt.ledger.events if "forked" in str(e)]

rt = fusion_shim.install(policy="remote", device="cpu", quiet=True, ready_timeout=600)
assert not rt.link.ready.is_set()  # forked while the worker starts
with multiprocessing.get_context("fork").Pool(1) as pool:
    bits, kind, reason, events = pool.map(child, [0])[0]
parent = np.fft.rfft(np.ones(100))
print(json.dumps({"same_bits": bits == parent.tobytes().hex(), "child_kind": kind, "child_reason": reason,
                  "parent_kind": rt.ledger.records[-1].kind, "child_events": [str(e) for e in events]}))
"""


def test_a_child_forked_while_the_worker_starts_offloads_as_its_parent_does(tmp_path):
    prog = tmp_path / "fork_pool.py"
    prog.write_text(APP)
    r = subprocess.run([PY, str(prog)], capture_output=True, text=True, timeout=900, env=clean_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["parent_kind"] == "worker", out
    assert out["child_kind"] == "worker", out
    assert out["same_bits"], out
    assert any("calls go where the parent's go" in e for e in out["child_events"]), out

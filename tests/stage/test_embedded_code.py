"""The embedded worker runs its own program's stages, ``@fusion_shim.stage`` alone enough, and no other
process's; a worker that allows code makes its stage host only when a stage comes (D177)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from fusion_shim.protocol import messages, wire
from tests.helpers.environment import ROOT
from tests.stage.conftest import NumpyBackend, _matmul

WHERE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import fusion_shim

    @fusion_shim.stage
    def where(pid, a):
        return ("here" if os.getpid() == pid else "worker"), float(a.sum())

    print(*where(os.getpid(), np.arange(4.0)))
""")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_a_program_marking_its_stage_only_with_the_decorator_runs_it_on_its_embedded_worker(tmp_path):
    script, report = tmp_path / "where.py", tmp_path / "run.json"
    script.write_text(WHERE)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=_env())
    assert plain.returncode == 0 and plain.stdout == "here 6.0\n", plain.stderr
    shim = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "remote", "--quiet", "--report",
                           str(report), str(script)], capture_output=True, text=True, timeout=600, env=_env())
    assert shim.returncode == 0, shim.stderr
    assert shim.stdout == "worker 6.0\n"
    row = json.loads(report.read_text())["stages"]["__main__:where"]
    assert row["calls"] == row["worker"] == 1


OTHER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import fusion_shim
    from tests.stage import stagefns

    rt = fusion_shim.install(policy="remote", worker=sys.argv[1], quiet=True, ready_timeout=600,
                             stages=("tests.stage.stagefns:where",))
    assert rt.link.wait_ready(600)
    print(stagefns.where(os.getpid()))
    rec = [r for r in rt.ledger.records if r.op.startswith("stage ")][-1]
    print(rec.kind, rec.reason)
""")


def test_another_process_of_the_same_user_cannot_run_code_on_a_programs_embedded_worker(tmp_path):
    from tests.helpers.shims import install

    import fusion_shim

    rt = install(None, policy="remote")  # the embedded worker, started by this process
    try:
        other = subprocess.run([sys.executable, "-c", OTHER, rt.link.url], capture_output=True, text=True,
                               timeout=600, env=_env(), cwd=ROOT)
    finally:
        fusion_shim.uninstall()
    assert other.returncode == 0, other.stderr
    where, record = other.stdout.splitlines()
    assert where == "here"
    assert record.startswith("fallback") and "only for the program that started it" in record


def test_a_worker_that_allows_code_makes_its_stage_host_at_the_first_stage_request():
    from fusion_shim.worker.server import Worker

    worker = Worker(backend=NumpyBackend(), kernels={"matmul": _matmul}, max_bytes=1 << 30, allow_code="any")
    call = wire.encode(messages.call_header(1, "matmul", {}, [None], [("f8", (2, 2))]), [np.eye(2), np.eye(2)])
    stage = wire.encode(messages.stage_header(2, None, {}, 10.0), [np.zeros(4, np.uint8)])
    assert worker.stage_host([b"id", *call]) is None and worker.stages is None
    assert not wire.may_be_stage(call[0]) and wire.may_be_stage(stage[0])
    host = worker.stage_host([b"id", *stage])
    assert host is not None and worker.stages is host
    host.close()
    plain = Worker(backend=NumpyBackend(), kernels={"matmul": _matmul}, max_bytes=1 << 30)
    assert plain.stage_host([b"id", *stage]) is None  # it refuses stages on the call path instead

"""A stage waits for its cold worker and guards against re-entry as the call path does (D336): the
wait is ``client.call.wait_cold`` and kept as the record's ``wait_ready`` phase; a stage running
here makes the stages it calls plain through the runtime's guard (its ``stages`` level), while its
NumPy calls are still intercepted."""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import numpy as np

import fusion_shim
from fusion_shim.client.call import wait_cold
from fusion_shim.config import Config
from tests.helpers.shims import READY_S
from tests.stage import stagefns
from tests.stage.conftest import stage_worker

M = "tests.stage.stagefns"


class Cold:
    """A link that becomes ready ``after`` seconds into its wait."""

    def __init__(self, state: str = "starting", after: float = 0.05):
        self.state, self.after, self.waited = state, after, 0
        self.ready = threading.Event()

    def wait_ready(self, timeout: float, while_starting: bool = False) -> bool:
        self.waited += 1
        time.sleep(self.after)
        self.ready.set()
        return True


def test_under_policy_remote_a_cold_first_worker_is_waited_for_and_the_wait_kept():
    link, phases = Cold(), {}
    wait_cold(Config(policy="remote"), [link], phases)
    assert link.waited == 1 and phases["wait_ready"] >= 0.05


def test_a_faulted_worker_another_ready_one_or_policy_auto_is_not_waited_for():
    ready = SimpleNamespace(state="ready", ready=threading.Event())
    ready.ready.set()
    for config, links in [(Config(policy="remote"), [Cold("down")]),
                          (Config(policy="remote"), [Cold(), ready]),
                          (Config(policy="auto"), [Cold()])]:
        phases: dict = {}
        wait_cold(config, links, phases)
        assert links[0].waited == 0 and phases == {}


def test_a_stage_called_while_its_worker_starts_waits_for_it_and_its_record_shows_the_wait(tmp_path):
    url = f"ipc://{tmp_path}/late.sock"
    rt = fusion_shim.install(policy="remote", worker=url, quiet=True, ready_timeout=READY_S,
                             stages=(f"{M}:where",))
    late: list = []
    starter = threading.Timer(0.3, lambda: late.append(stage_worker(url)))
    starter.start()
    try:
        assert stagefns.where(os.getpid()) == "worker"
        rec = [r for r in rt.ledger.records if r.op == f"stage {M}:where"][-1]
        assert rec.kind == "worker" and rec.phases["wait_ready"] > 0, rec
    finally:
        fusion_shim.uninstall()
        starter.join(READY_S)
        for _, thread, stop in late:
            stop.set()
            thread.join(10)


def test_a_stage_running_here_intercepts_its_numpy_calls_but_not_the_stages_it_calls(code_worker):
    """Inside a stage run here the shim's guard is not ``busy`` (its NumPy calls stay intercepted, to be
    priced) and its ``stages`` level is up (a stage it calls runs plain, unrecorded)."""
    from tests.helpers.shims import install

    rng = np.random.default_rng(4)
    A, X = rng.standard_normal((200, 200)), rng.standard_normal((200, 3))
    want = stagefns.guarded_outer(A, X)
    stagefns.GUARD_SEEN.clear()
    rt = install(code_worker[0], policy="auto", min_flops=0, stages=(f"{M}:guarded_outer", f"{M}:guarded_inner"))
    np.testing.assert_array_equal(stagefns.guarded_outer(A, X), want)
    recs = [r for r in rt.ledger.records if r.op.startswith("stage ")]
    assert [(r.op, r.kind) for r in recs] == [(f"stage {M}:guarded_outer", "local")], recs  # auto: run here first
    assert f"stage {M}:guarded_inner" not in [r.op for r in rt.ledger.records]
    assert stagefns.GUARD_SEEN == [(False, 1)]
    assert getattr(rt.guard, "stages", 0) == 0
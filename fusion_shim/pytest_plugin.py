"""pytest: ``pytest --fusion-shim=auto|remote|local`` runs a suite through the shim.

Off unless ``--fusion-shim`` is given: loading the plugin imports nothing of the shim. When on, each
test process installs the shim once for its session, with the settings of the ``[tool.fusion_shim]``
table found from pytest's rootdir upward and of the ``FUSION_SHIM_*`` variables, under the flags
(``--fusion-shim-verify F``); the shim's own table and ``--report`` at exit are off, since the
plugin reports. At the end of the session it prints one summary and, with ``--fusion-shim-report
PATH``, writes one JSON (schema ``fusion_shim.pytest/1``):

- ``policy``; ``summary``: the session's totals (:func:`tally`);
- ``tests``: one map per test: ``nodeid``, ``outcome``, ``process`` (the xdist worker, or
  ``main``), and its share of the calls (:func:`tally` of what the shim recorded while it ran);
- ``processes``: each test process's full report (schema ``fusion_shim.report/1``).

Under pytest-xdist each worker process installs its own shim and hands its report to the
controller, which merges them. With pytest-benchmark, each benchmark's ``extra_info["fusion_shim"]``
holds the tally of its test's call phase (every round), so saved runs carry it.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import pytest

OUTPUT_KEY = "fusion_shim"  # xdist's workeroutput entry: a worker's report, as JSON text
SCHEMA = "fusion_shim.pytest/1"
COUNTS = ("worker", "local", "unsupported", "fallback", "below_floor", "verified", "mismatches")
BYTES = ("bytes_sent", "bytes_received", "shm_sent", "shm_received")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("fusion_shim", "fusion_shim: run the suite through the shim")
    group.addoption("--fusion-shim", dest="fusion_shim", default=None, metavar="POLICY",
                    help="install the shim for the session with this policy: auto, remote or local")
    group.addoption("--fusion-shim-verify", dest="fusion_shim_verify", default=None, metavar="FRACTION",
                    help="also compute that share of the worker's answers here and compare them (or all)")
    group.addoption("--fusion-shim-report", dest="fusion_shim_report", default=None, metavar="PATH",
                    help="write the session's report (per-test records, each process's report) as JSON")


def pytest_configure(config: Any) -> None:
    policy = config.getoption("fusion_shim")
    if policy is None:
        return
    from .config import Config, ConfigError, find_project

    try:
        settings = Config.load(project=find_project(str(config.rootpath)), policy=policy,
                               verify=config.getoption("fusion_shim_verify"))
    except ConfigError as exc:
        raise pytest.UsageError(f"--fusion-shim: {exc}") from None
    config.pluginmanager.register(ShimSession(config, settings.replace(quiet=True, report=None, trace=None)),
                                  "fusion_shim_session")


def tally(ops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Calls by where they ran, bytes moved and seconds by place, summed over ``ops`` (a ledger's
    per-op aggregates, or their difference over one test)."""
    from .reporting import WORKER_PHASES

    out: dict[str, Any] = {k: sum(o.get(k, 0) for o in ops.values()) for k in ("calls", *COUNTS, *BYTES)}
    phases: dict[str, float] = {}
    for o in ops.values():
        for p, s in o.get("phases", {}).items():
            phases[p] = phases.get(p, 0.0) + s
    out["time_s"] = {"worker": sum(phases.get(p, 0.0) for p in WORKER_PHASES), "here": phases.get("local", 0.0),
                     "waiting_for_worker": phases.get("wait_ready", 0.0), "checking": phases.get("verify", 0.0)}
    out["offloaded_ops"] = {name: o["worker"] for name, o in sorted(ops.items()) if o.get("worker")}
    return out


def merge(tallies: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(t[k] for t in tallies) for k in ("calls", *COUNTS, *BYTES)}
    out["time_s"] = {k: sum(t["time_s"][k] for t in tallies) for k in tallies[0]["time_s"]} if tallies else {}
    offloaded: dict[str, int] = {}
    for t in tallies:
        for name, n in t["offloaded_ops"].items():
            offloaded[name] = offloaded.get(name, 0) + n
    out["offloaded_ops"] = dict(sorted(offloaded.items()))
    return out


class ShimSession:
    """The shim installed for one test process, its per-test shares, and the session's report."""

    def __init__(self, config: Any, settings: Any):
        self.config = config
        self.settings = settings
        self.process = getattr(config, "workerinput", {}).get("workerid", "main")
        self.tests: list[dict[str, Any]] = []
        self.outcomes: dict[str, str] = {}
        self.from_workers: list[dict[str, Any]] = []
        self.installed = False

    def _controller(self) -> bool:
        """The xdist controller runs no test: its workers report."""
        return self.config.pluginmanager.has_plugin("dsession")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: Any) -> None:
        if not self._controller():
            import fusion_shim

            fusion_shim.install(self.settings)
            self.installed = True

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any):
        before = _ops_now()
        yield
        share = tally(_difference(_ops_now(), before))
        self.tests.append({"nodeid": item.nodeid, "outcome": self.outcomes.pop(item.nodeid, "passed"),
                           "process": self.process, **share})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: Any):
        before = _ops_now()
        yield
        bench = getattr(item, "funcargs", {}).get("benchmark")
        if bench is not None and hasattr(bench, "extra_info"):
            bench.extra_info["fusion_shim"] = {"policy": self.settings.policy,
                                               **tally(_difference(_ops_now(), before))}

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and report.passed:
            return
        if hasattr(report, "wasxfail"):
            outcome = "xpassed" if report.passed else "xfailed"
        else:
            outcome = "error" if report.failed and report.when != "call" else report.outcome
        if self.outcomes.get(report.nodeid) in (None, "passed"):
            self.outcomes[report.nodeid] = outcome

    @pytest.hookimpl(optionalhook=True)  # an xdist hook
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        import json

        text = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if text:
            self.from_workers.append(json.loads(text))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any) -> None:
        processes = self.from_workers
        if self.installed:
            processes = [self._own_report()]
            if hasattr(self.config, "workerinput"):
                import json

                self.config.workeroutput[OUTPUT_KEY] = json.dumps(processes[0], default=str)
                return
        self.session_report = _session_report(self.settings.policy, processes)
        path = self.config.getoption("fusion_shim_report")
        if path:
            from .reporting import write_json

            write_json(self.session_report, path)

    def _own_report(self) -> dict[str, Any]:
        import fusion_shim

        report = None
        try:
            report = fusion_shim.report(format="json")
        except Exception as exc:  # as at a program's exit: a report that fails must not fail the session
            print(f"fusion_shim: report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            fusion_shim.uninstall()
            self.installed = False
        report = report or {"ops": {}, "worker": None, "pid": os.getpid()}
        report["tests"] = self.tests
        return report

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        report = getattr(self, "session_report", None)
        if report is None:
            return
        s = report["summary"]
        tr = terminalreporter
        tr.section("fusion_shim")
        tr.write_line(f"policy {report['policy']}, {len(report['processes'])} test process(es), "
                      f"{len(report['tests'])} tests; calls: {s['worker']} on the worker, {s['local']} here by "
                      f"decision, {s['fallback']} fallbacks, {s['unsupported']} unsupported, "
                      f"{s['below_floor']} below the floor")
        moved = sum(s[k] for k in BYTES) / 1e6
        t = s["time_s"]
        tr.write_line(f"moved {moved:.1f} MB; time on the worker path {t['worker']:.2f} s, here "
                      f"{t['here']:.2f} s, waiting for the worker {t['waiting_for_worker']:.2f} s")
        for proc in report["processes"]:
            w = proc.get("worker") or {}
            tr.write_line(f"  pid {proc.get('pid')}: worker {w.get('url')} {w.get('state')}, "
                          f"device {(w.get('info') or {}).get('device', '-')}")
        path = self.config.getoption("fusion_shim_report")
        if path:
            tr.write_line(f"report written to {path}")


def _session_report(policy: str, processes: list[dict[str, Any]]) -> dict[str, Any]:
    tests = [t for p in processes for t in p.get("tests", [])]
    return {"schema": SCHEMA, "policy": policy, "summary": merge([tally(p.get("ops", {})) for p in processes]),
            "tests": tests, "processes": processes}


def _ops_now() -> dict[str, dict[str, Any]]:
    """The running shim's per-op aggregates now, below-floor counts included ({} before NumPy)."""
    from .intercept import active

    rt = active()
    if rt is None:
        return {}
    return rt.ledger.snapshot_ops()


def _difference(after: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, a in after.items():
        b = before.get(name, {})
        d = {k: a.get(k, 0) - b.get(k, 0) for k in ("calls", *COUNTS, *BYTES)}
        d["phases"] = {p: s - b.get("phases", {}).get(p, 0.0) for p, s in a.get("phases", {}).items()}
        if any(d[k] for k in ("calls", "below_floor")):
            out[name] = d
    return out

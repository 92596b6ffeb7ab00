"""Start-up: under ``FUSION_SHIM=1`` a process that never imports NumPy loads the package's
``__init__``, nothing else of the shim (D121); one that imports NumPy loads what
interception needs, and the planner, the call path, the worker links and the report load when first
needed, each one's time a line of the report's start-up. Interception holds wherever and whenever
NumPy is imported: late, inside a function, in a subprocess, in a forked or spawned child.

Programs run in subprocesses with a clean environment (no ``FUSION_SHIM*`` inherited) and no GPU
visible, so that under ``auto`` the embedded worker is deferred and nothing is started.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import fusion_shim
from fusion_shim import _hooks

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fusion_shim.__file__)))
TIMEOUT = 300
# what a process that imports NumPy under the shim loads only on first need, or never
LATER = ("zmq", "msgpack", "xxhash", "asyncio", "importlib.metadata", "threading", "dataclasses",
         "fusion_shim.plan.planner",
         "fusion_shim.plan.calibrate", "fusion_shim.reporting", "fusion_shim.client.link", "fusion_shim.client.call",
         "fusion_shim.transport", "fusion_shim.protocol", "fusion_shim.catalog.base", "fusion_shim.catalog.linalg")
# ... and what one that never imports NumPy must not load either
NEVER_WITHOUT_NUMPY = ("numpy", "wrapt", "fusion_shim._hooks", "fusion_shim.config", "fusion_shim.intercept",
                       "fusion_shim.client",
                       "fusion_shim.plan", "fusion_shim.ledger", "fusion_shim.catalog", *LATER)
MODULES_AT_EXIT = """\
    import atexit, json, sys
    atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules))))
"""
MODULES_NOW = """\
    print("MODULES " + json.dumps(sorted(sys.modules)))  # before the exit, where the report loads
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    # the install's fusion_shim.pth runs it, and it imports the package this test imported (a
    # checkout's, where another copy is installed), found first on the path
    env["PYTHONPATH"] = ROOT
    env["CUDA_VISIBLE_DEVICES"] = "-1"  # no GPU: the embedded worker under auto is deferred
    env.update(extra)
    return env


def run(tmp_path, source: str, *args: str, env: dict[str, str] | None = None,
        launcher: tuple = ()) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(source))
    return subprocess.run([PY, *launcher, str(prog), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT, env=clean_env(FUSION_SHIM="1") if env is None else env)


def modules_printed(r: subprocess.CompletedProcess) -> set[str]:
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def loaded(modules: set[str], names: tuple) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture(scope="module", autouse=True)
def pth_installed():
    """These tests need the install's fusion_shim.pth (``pip install .`` and ``pip install -e .`` both
    put it in site-packages)."""
    r = subprocess.run([PY, "-c", "import sys; print('fusion_shim' in sys.modules)"], capture_output=True,
                       text=True, timeout=TIMEOUT, env=clean_env(FUSION_SHIM="1"))
    assert r.stdout.strip() == "True", "no fusion_shim.pth in this interpreter's site-packages: reinstall the package"


# -- a process that never imports NumPy ----------------------------------------------------------

def test_a_process_that_never_imports_numpy_loads_only_the_package_init(tmp_path):
    source = MODULES_AT_EXIT + "    import json, os\n    print(json.dumps({'x': 1}))\n"
    shimmed = modules_printed(run(tmp_path, source))
    plain = modules_printed(run(tmp_path, source, env=clean_env()))
    assert shimmed - plain == {"fusion_shim"}
    assert loaded(shimmed, NEVER_WITHOUT_NUMPY) == []


def test_settings_given_at_start_are_checked_there_without_loading_zmq(tmp_path):
    """A variable is checked at start (an invalid one fails before the program runs): that loads the
    Config, and no more, even for a worker URL."""
    env = clean_env(FUSION_SHIM="1", FUSION_SHIM_POLICY="local", FUSION_SHIM_WORKER="ipc:///nowhere/w.sock")
    shimmed = modules_printed(run(tmp_path, MODULES_AT_EXIT, env=env))
    assert "fusion_shim.config" in shimmed
    assert loaded(shimmed, tuple(n for n in NEVER_WITHOUT_NUMPY if n != "fusion_shim.config")) == []


# -- a process that imports NumPy ----------------------------------------------------------------

@pytest.mark.parametrize("policy", ["auto", "local"])
def test_importing_numpy_loads_interception_and_nothing_it_does_not_need(tmp_path, policy):
    r = run(tmp_path, """\
        import json, sys
        import numpy as np, fusion_shim
        rt = fusion_shim.active()
        print(json.dumps({"active": rt is not None, "wrapped": hasattr(np.linalg.solve, "__wrapped__"),
                          "startup": sorted(rt.ledger.startup)}))
    """ + MODULES_NOW, env=clean_env(FUSION_SHIM="1", FUSION_SHIM_POLICY=policy, FUSION_SHIM_QUIET="1"))
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("{")))
    assert out["active"] and out["wrapped"]
    assert "interception" in out["startup"] and "bootstrap" in out["startup"]
    mods = modules_printed(r)
    assert loaded(mods, LATER) == []
    assert loaded(mods, ("wrapt",)) == ["wrapt._wrappers", "wrapt.exceptions"]  # its C types, not its package
    assert "numpy.fft" not in mods  # NumPy loads it on first use; its rows are wrapped then


# what importing NumPy under the shim loads beyond what plain `import numpy` does: interception alone
AT_NUMPY = {"fusion_shim", "fusion_shim._hooks", "fusion_shim._native", "fusion_shim.config",
            "fusion_shim.intercept", "fusion_shim.intercept.native", "fusion_shim.intercept.wrappers",
            "fusion_shim.client", "fusion_shim.client.runtime", "fusion_shim.client.starts",
            "fusion_shim.client.embedded", "fusion_shim.client.rundir", "fusion_shim.procinfo", "fusion_shim.ledger",
            "fusion_shim.plan",
            "fusion_shim.plan.cells", "fusion_shim.plan.cpuwins", "fusion_shim.plan.margins", "fusion_shim.catalog",
            "fusion_shim.catalog.rows", "fusion_shim.catalog.spec",  # the rules load with the call path (D116)
            "fusion_shim._ext",  # only for a source checkout beside an install: its extensions are there
            "wrapt._wrappers", "wrapt.exceptions",  # wrapt's C types (D112)
            "__future__", "atexit", "gc"}  # the stdlib's, where NumPy loads none


def test_importing_numpy_loads_these_modules_beyond_plain_numpy_and_no_others(tmp_path):
    source = """\
        import json, sys
        before = set(sys.modules)
        import numpy
        print("MODULES " + json.dumps(sorted(set(sys.modules) - before)))
    """
    shimmed = modules_printed(run(tmp_path, source))
    plain = modules_printed(run(tmp_path, source, env=clean_env()))
    assert shimmed - plain - {"fusion_shim", "fusion_shim._hooks"} <= AT_NUMPY, sorted(shimmed - plain - AT_NUMPY)
    assert {"fusion_shim.intercept", "fusion_shim.client.runtime", "wrapt._wrappers"} <= shimmed


def test_a_program_that_counts_no_call_exits_without_loading_the_report_and_one_that_does_prints_it(tmp_path):
    quiet_run = run(tmp_path, MODULES_AT_EXIT + "    import numpy\n")
    assert "fusion_shim.reporting" not in modules_printed(quiet_run) and quiet_run.stderr == ""
    busy = run(tmp_path, MODULES_AT_EXIT + "    import numpy as np\n    np.linalg.inv(np.eye(3))\n")
    assert "fusion_shim.reporting" in modules_printed(busy)
    assert "fusion_shim report" in busy.stderr and "linalg.inv" in busy.stderr


def test_numpy_imported_late_inside_a_function_is_intercepted(tmp_path):
    out = last_json(run(tmp_path, """\
        import json, sys, email.message, urllib.parse

        def late():
            import numpy as np
            import fusion_shim
            np.linalg.svd(np.eye(200) + 1.0)  # no worker ready: one comparison, counted
            rep = fusion_shim.report(format="json")
            return {"active": fusion_shim.active() is not None, "svd": rep["ops"]["numpy.linalg.svd"]["below_floor"],
                    "fft": hasattr(np.fft.fft, "__wrapped__"), "worker": rep["worker"]["state"]}

        print(json.dumps(late()))
    """))
    assert out == {"active": True, "svd": 1, "fft": True, "worker": "deferred"}


CHILDREN = """\
    import json, os, subprocess, sys
    import multiprocessing as mp

    def probe():
        import numpy as np  # late: the parent never imports NumPy
        import fusion_shim
        np.linalg.svd(np.eye(200) + 1.0)
        rt = fusion_shim.active()
        return {"pid": os.getpid(), "active": rt is not None, "wrapped": hasattr(np.linalg.svd, "__wrapped__"),
                "svd": (fusion_shim.report(format="json") or {"ops": {}})["ops"].get("numpy.linalg.svd", {}).get("below_floor")}

    def mp_child(q):
        q.put(probe())

    if __name__ == "__main__":
        out = {}
        here = os.path.dirname(os.path.abspath(__file__))
        code = f"import json, sys; sys.path.insert(0, {here!r}); import kids; print(json.dumps(kids.probe()))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out["subprocess"] = json.loads(r.stdout.splitlines()[-1])
        for method in ("fork", "spawn"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=mp_child, args=(q,))
            p.start()
            out[method] = q.get(timeout=300)
            p.join(30)
            out[method]["exitcode"] = p.exitcode
        out["parent_numpy"] = "numpy" in sys.modules
        print(json.dumps(out))
"""


def test_children_that_import_numpy_late_are_intercepted(tmp_path):
    prog = tmp_path / "kids.py"
    prog.write_text(textwrap.dedent(CHILDREN))
    r = subprocess.run([PY, str(prog)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                       env=clean_env(FUSION_SHIM="1", FUSION_SHIM_QUIET="1"))
    out = last_json(r)
    assert out.pop("parent_numpy") is False
    for who, seen in out.items():
        assert seen["active"] and seen["wrapped"] and seen["svd"] == 1, (who, seen)
        assert seen["pid"] != os.getpid()
    assert out["fork"]["exitcode"] == out["spawn"]["exitcode"] == 0


# -- the report, and the exit ----------------------------------------------------------------------

def test_the_report_shows_the_shims_start_up_on_its_own_line(tmp_path):
    """Under remote with a worker that never answers: the links are made at NumPy's import, the
    planner with them, the call path on the first call above its floor; each is a start-up line."""
    report = tmp_path / "run.json"
    r = run(tmp_path, """\
        import numpy as np
        np.matmul(np.ones((300, 300)), np.ones((300, 300)))
    """, launcher=("-m", "fusion_shim", "--policy", "remote", "--worker", "ipc:///nonexistent-fusion-shim.sock",
                   "--ready-timeout", "1", "--report", str(report)), env=clean_env())
    assert r.returncode == 0, r.stderr
    startup = json.loads(report.read_text())["startup"]
    assert {"launcher", "interception", "planner", "worker links", "call path"} <= set(startup), startup
    assert all(0 < s < 60 for s in startup.values()), startup
    line = next(ln for ln in r.stderr.splitlines() if "shim start-up:" in ln)
    assert "at start" in line and "on first need: " in line and "call path" in line and len(line) <= 100
    full = subprocess.run([sys.executable, "-m", "fusion_shim", "report", str(report), "--full"], capture_output=True,
                          text=True, timeout=300, env=clean_env(), check=True).stdout
    line = next(ln for ln in full.splitlines() if "shim start-up:" in ln)
    assert "launcher" in line and "interception" in line and "on first need: " in line and "call path" in line


def test_ctrl_c_after_numpy_still_exits_by_sigint_with_the_report(tmp_path):
    """The report loads at exit: nothing it imports may run exec() on source text, which would make
    CPython forget the unhandled KeyboardInterrupt and exit with status 1."""
    r = run(tmp_path, """\
        import numpy as np
        np.linalg.svd(np.eye(200) + 1.0)
        raise KeyboardInterrupt
    """)
    assert r.returncode == -signal.SIGINT, r.stderr
    assert "KeyboardInterrupt" in r.stderr and "shim start-up:" in r.stderr  # the table was printed


# -- wrapt without its package ---------------------------------------------------------------------

@pytest.mark.parametrize("native", ["1", "0"])
def test_wrapt_imported_after_the_shim_sees_the_same_types(tmp_path, native):
    out = last_json(run(tmp_path, """\
        import json, sys
        import numpy as np
        import wrapt, wrapt.exceptions  # the program's own, after the shim's
        print(json.dumps({
            "proxy": isinstance(np.linalg.solve, wrapt.BaseObjectProxy),
            "function_wrapper": isinstance(np.linalg.multi_dot, wrapt.FunctionWrapper),
            "same": wrapt.FunctionWrapper is sys.modules["wrapt._wrappers"].FunctionWrapper,
            "exceptions": wrapt.exceptions.WrapperNotInitializedError.__module__,
            "matmul_python_path": isinstance(np.matmul, wrapt.FunctionWrapper)}))
    """, env=clean_env(FUSION_SHIM="1", FUSION_SHIM_NATIVE=native, FUSION_SHIM_QUIET="1")))
    assert out["proxy"] and out["function_wrapper"] and out["same"]
    assert out["exceptions"] == "wrapt.exceptions"
    assert out["matmul_python_path"] is (native == "0")


# -- the hooks themselves, in this process ----------------------------------------------------------

def _module(tmp_path, monkeypatch, name: str, body: str = "X = 1\n") -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_hook_runs_right_after_its_module_is_imported_and_the_module_keeps_its_loader(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "fs_hooked_mod")
    seen = []
    _hooks.when_imported("fs_hooked_mod", lambda m: seen.append((m.__name__, m.X, type(m.__loader__).__name__)))
    assert seen == []
    import fs_hooked_mod  # noqa: F401

    assert seen == [("fs_hooked_mod", 1, "SourceFileLoader")]
    assert fs_hooked_mod.__spec__.loader is fs_hooked_mod.__loader__
    assert "fs_hooked_mod" not in _hooks._pending  # a hook runs once
    _hooks.when_imported("fs_hooked_mod", lambda m: seen.append("now"))  # already imported: at once
    assert seen[-1] == "now"


def test_a_forgotten_hook_never_runs_and_a_failing_one_does_not_fail_the_import(tmp_path, monkeypatch, capfd):
    _module(tmp_path, monkeypatch, "fs_forgotten_mod")
    _module(tmp_path, monkeypatch, "fs_failing_mod")
    seen = []
    hook = seen.append
    _hooks.when_imported("fs_forgotten_mod", hook)
    _hooks.forget("fs_forgotten_mod", hook)
    import fs_forgotten_mod  # noqa: F401

    assert seen == []

    def boom(module):
        raise RuntimeError("boom")

    _hooks.when_imported("fs_failing_mod", boom)
    import fs_failing_mod

    assert fs_failing_mod.X == 1
    assert "hook on fs_failing_mod failed: RuntimeError: boom" in capfd.readouterr().err


def test_uninstall_forgets_the_hooks_of_modules_never_imported(no_shim_after):
    later = ("scipy.linalg", "scipy.fft")
    fusion_shim.install(policy="local", quiet=True)
    assert all(name in _hooks._pending or name in sys.modules for name in later)
    fusion_shim.uninstall()
    assert not any(name in _hooks._pending for name in ("numpy", "numpy.fft", *later))

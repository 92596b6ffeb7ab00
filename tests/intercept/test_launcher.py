"""The launcher is invisible: under ``python -m fusion_shim app.py args`` (and ``-m pkg.mod``) a
program sees what plain ``python`` gives it; ``FUSION_SHIM=1`` reaches child processes; settings
are checked at start; ``--report`` writes a report that ``fusion_shim report`` renders; and
``install``/``uninstall`` put every patched attribute back exactly.

Programs run in subprocesses with a clean environment (no ``FUSION_SHIM*`` variables inherited).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import wrapt

import fusion_shim
from fusion_shim.catalog import CATALOG

PY = sys.executable
# wrapt's C proxy, the base of the shim's (wrapt 2's ObjectProxy is a Python subclass of it)
PROXY = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
TIMEOUT = 300  # per subprocess: a hang fails the test instead of the suite; a busy machine does not


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.pop("PYTHONPATH", None)  # the programs must find fusion_shim the way a user's python does
    env.update(extra)
    return env


def run(args: list[str], cwd, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *args], cwd=cwd, env=clean_env() if env is None else env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def shim(args: list[str], cwd, env=None) -> subprocess.CompletedProcess:
    return run(["-m", "fusion_shim", "--quiet", *args], cwd, env)


def write(path, source: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def _same_as_plain(args, cwd, code):
    """``args`` run plainly and through the launcher: same exit status (``code``), same output;
    returns both runs and what the probe printed first."""
    plain = run(args, cwd)
    shimmed = shim(args, cwd)
    assert plain.returncode == code, plain.stderr
    assert shimmed.returncode == plain.returncode, shimmed.stderr
    assert shimmed.stdout == plain.stdout
    return plain, shimmed, json.loads(shimmed.stdout.splitlines()[0])



def traceback_block(stderr: str) -> str:
    """From the first "Traceback" line on, without the frames runpy adds under ``python -m``."""
    start = stderr.find("Traceback (most recent call last):")
    assert start >= 0, f"no traceback in stderr:\n{stderr}"
    lines = stderr[start:].splitlines()
    return "\n".join(line for line in lines if '"<frozen runpy>"' not in line)


# A program that reports what it sees, then does what its first argument says.
PROBE = """\
    import json, os, sys

    def what_i_see():
        main = sys.modules["__main__"]
        return {
            "argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
            "package": __package__, "spec": getattr(__spec__, "name", None),
            "main_is_me": main.__dict__ is globals(), "cwd": os.getcwd(),
        }

    def inner(kind):
        if kind == "raise":
            raise ValueError("boom " + sys.argv[-1])
        if kind == "chain":
            try:
                {}["missing"]
            except KeyError as exc:
                raise RuntimeError("wrapped") from exc
        if kind == "keyboard":
            raise KeyboardInterrupt

    def outer(kind):
        inner(kind)

    print(json.dumps(what_i_see()))
    print("to stderr", file=sys.stderr)
    kind = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if kind == "exit3":
        sys.exit(3)
    if kind == "exitmsg":
        sys.exit("goodbye message")
    outer(kind)
    print("done")
"""


@pytest.fixture
def app(tmp_path):
    return write(tmp_path / "proj" / "app.py", PROBE)


# -- what the program sees ----------------------------------------------------------------------

@pytest.mark.parametrize("invocation", ["relative", "absolute", "symlink"])
@pytest.mark.parametrize("kind,code", [("ok", 0), ("exit3", 3), ("exitmsg", 1), ("raise", 1), ("chain", 1)])
def test_script_sees_what_plain_python_gives(tmp_path, app, invocation, kind, code):
    if invocation == "relative":
        script, cwd = "proj/app.py", tmp_path
    elif invocation == "absolute":
        script, cwd = str(app), "/"
    else:
        link = tmp_path / "elsewhere" / "link.py"
        link.parent.mkdir()
        link.symlink_to(app)
        script, cwd = "elsewhere/link.py", tmp_path
    # arguments that look like the launcher's own options belong to the program
    plain, shimmed, seen = _same_as_plain([script, kind, "--policy", "-m", "x y"], cwd, code)
    assert seen["name"] == "__main__" and seen["main_is_me"]
    assert seen["argv"] == [script, kind, "--policy", "-m", "x y"]
    assert seen["path0"] == str(app.parent)  # the script's real directory, as plain python gives
    # with --quiet and no NumPy call the shim adds nothing: stderr is byte for byte plain python's
    assert shimmed.stderr == plain.stderr
    if kind in ("raise", "chain"):
        tb = traceback_block(shimmed.stderr)
        assert "fusion_shim" not in tb
        assert tb == traceback_block(plain.stderr)
    if kind == "exitmsg":
        assert "goodbye message" in shimmed.stderr


def test_keyboard_interrupt_exits_like_plain_python(tmp_path, app):
    plain = run([str(app), "keyboard"], tmp_path)
    shimmed = shim([str(app), "keyboard"], tmp_path)
    assert plain.returncode == -2  # python re-raises SIGINT on itself after the traceback
    assert shimmed.returncode == plain.returncode
    assert traceback_block(shimmed.stderr) == traceback_block(plain.stderr)
    assert "fusion_shim" not in shimmed.stderr


@pytest.mark.parametrize("waiting", ["in a call", "for a warming worker"])
def test_ctrl_c_inside_a_remote_call_shows_the_programs_frames_only(tmp_path, sock_dir, waiting):
    """Interrupted while a worker holds its call (ZeroMQ's poll), or while it waits for a worker that
    never says ready (a threading wait): the traceback ends at the program's line, without the frames
    the shim was waiting in."""
    import zmq

    from fusion_shim.protocol import messages
    from fusion_shim.transport import Channel

    url = f"ipc://{sock_dir}/w.sock"
    silent = worker = None
    if waiting == "in a call":
        worker = subprocess.Popen([PY, "-m", "fusion_shim.worker.testing", "--bind", url, "--device", "cpu",
                                   "--delay", "60"], stderr=subprocess.DEVNULL, env=clean_env())
        chan = Channel(url)  # warm before the program starts: its call then waits in the worker's delay
        assert chan.request(messages.hello(1), time.monotonic() + 600).header["t"] == "ready"
        chan.close()
    else:
        silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the hello, never answers it
        silent.bind(url)
    prog = write(tmp_path / "slow.py", """\
        import numpy as np
        a = np.ones((300, 300))
        print("go", flush=True)
        b = np.matmul(a, a)
    """)
    proc = None
    try:
        # SIGINT as a terminal gives it: a run started in the background ignores it, and so would this child
        proc = subprocess.Popen([PY, "-m", "fusion_shim", "--quiet", "--policy", "remote", "--worker", url,
                                 "--ready-timeout", "600", str(prog)], cwd=tmp_path, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout.readline().strip() == "go"
        time.sleep(3.0)  # well inside the wait
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if worker is not None:
            worker.kill()
            worker.wait()
        if silent is not None:
            silent.close(0)
    assert proc.returncode == -2, err
    assert "KeyboardInterrupt" in err and 'slow.py", line 4' in err, err
    assert "zmq" not in err and "threading.py" not in err and "fusion_shim/" not in err, err


def test_traceback_through_an_intercepted_numpy_call(tmp_path):
    """An error NumPy raises inside a wrapped function shows NumPy's frames, not the shim's."""
    prog = write(tmp_path / "np_err.py", """\
        import numpy as np

        def solve_it(a):
            return np.linalg.solve(a, np.ones(a.shape[0]))

        np.matmul(np.ones((2, 3)), np.ones((3, 2)))
        solve_it(np.zeros((4, 4)))
    """)
    plain = run([str(prog)], tmp_path)
    shimmed = shim(["--policy", "local", str(prog)], tmp_path)
    assert plain.returncode == shimmed.returncode == 1
    assert "LinAlgError: Singular matrix" in plain.stderr
    assert traceback_block(shimmed.stderr) == traceback_block(plain.stderr)


@pytest.mark.parametrize("target", ["pkg.tool", "pkg"])
@pytest.mark.parametrize("kind,code", [("ok", 0), ("exit3", 3), ("raise", 1)])
def test_dash_m_module_sees_what_plain_python_gives(tmp_path, target, kind, code):
    write(tmp_path / "pkg" / "__init__.py", "INIT = True\n")
    write(tmp_path / "pkg" / "tool.py", PROBE)
    write(tmp_path / "pkg" / "__main__.py", PROBE)
    plain, shimmed, seen = _same_as_plain(["-m", target, kind, "arg two"], tmp_path, code)
    assert seen["name"] == "__main__" and seen["package"] == "pkg"
    assert seen["path0"] == str(tmp_path)
    if kind == "raise":
        tb = traceback_block(shimmed.stderr)
        assert "fusion_shim" not in tb
        assert tb == traceback_block(plain.stderr)
    else:
        assert shimmed.stderr == plain.stderr


def test_missing_script_and_module(tmp_path):
    plain = run(["nope.py"], tmp_path)
    shimmed = shim(["nope.py"], tmp_path)
    assert shimmed.returncode == plain.returncode == 2
    assert "can't open file" in shimmed.stderr and "nope.py" in shimmed.stderr
    plain = run(["-m", "no_such_module_xyz"], tmp_path)
    shimmed = shim(["-m", "no_such_module_xyz"], tmp_path)
    assert shimmed.returncode == plain.returncode == 1
    assert "No module named no_such_module_xyz" in shimmed.stderr


# -- settings are checked at start --------------------------------------------------------------

def test_invalid_policy_flag_fails_at_start(tmp_path, app):
    r = run(["-m", "fusion_shim", "--policy", "fast", str(app)], tmp_path)
    assert r.returncode == 2
    assert "auto, local, remote" in r.stderr
    assert "to stderr" not in r.stderr and r.stdout == ""  # the program never ran


@pytest.mark.parametrize("flag", [["--timeout", "0"], ["--timeout", "soon"], ["--device", "tpu"],
                                  ["--worker", "http://x"], ["--frobnicate"], ["--quiet=maybe"]])
def test_other_invalid_flags_fail_at_start(tmp_path, app, flag):
    r = run(["-m", "fusion_shim", *flag, str(app)], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.startswith("fusion_shim: ")


def test_help_after_options_and_flags_with_values(tmp_path, app):
    for argv in (["--policy", "auto", "--help"], ["--quiet", "-h"]):
        r = run(["-m", "fusion_shim", *argv, str(app)], tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("usage: python -m fusion_shim"), r.stderr
    small = write(tmp_path / "small.py", "import numpy as np\nnp.matmul(np.ones((2, 2)), np.ones((2, 2)))\n")
    shown = run(["-m", "fusion_shim", "--quiet=0", "--strict=0", str(small)], tmp_path)
    assert shown.returncode == 0 and "fusion_shim report" in shown.stderr, shown.stderr
    quiet = run(["-m", "fusion_shim", "--quiet=1", "--strict=0", str(small)], tmp_path)
    assert quiet.returncode == 0 and "fusion_shim report" not in quiet.stderr, quiet.stderr


def test_a_bad_what_if_fails_before_the_table(tmp_path):
    saved = tmp_path / "r.json"
    saved.write_text("{}")
    r = run(["-m", "fusion_shim", "report", str(saved), "--what-if", "foo=1"], tmp_path)
    assert r.returncode == 1 and "unknown what-if key 'foo'" in r.stderr and r.stdout == "", (r.stdout, r.stderr)


def test_invalid_policy_variable_fails_at_start(tmp_path, app):
    r = run([str(app)], tmp_path, clean_env(FUSION_SHIM="1", FUSION_SHIM_POLICY="fast"))
    assert r.returncode == 2, r.stderr
    assert "FUSION_SHIM_POLICY" in r.stderr and "auto, local, remote" in r.stderr
    assert "Fatal Python error" not in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    # the launcher reads the same variables
    r = run(["-m", "fusion_shim", str(app)], tmp_path, clean_env(FUSION_SHIM_POLICY="fast"))
    assert r.returncode == 2 and "auto, local, remote" in r.stderr


def test_unknown_variable_is_refused(tmp_path, app):
    r = run([str(app)], tmp_path, clean_env(FUSION_SHIM="1", FUSION_SHIM_FOO="1"))
    assert r.returncode == 2, r.stderr
    assert "FUSION_SHIM_FOO" in r.stderr and "FUSION_SHIM_POLICY" in r.stderr  # lists the valid ones
    assert r.stdout == ""
    r = run(["-m", "fusion_shim", str(app)], tmp_path, clean_env(FUSION_SHIM_FOO="1"))
    assert r.returncode == 2 and "FUSION_SHIM_FOO" in r.stderr


def test_fusion_shim_zero_or_unset_means_off(tmp_path):
    prog = write(tmp_path / "off.py", """\
        import sys, numpy, fusion_shim
        print(fusion_shim.active() is None)
    """)
    for value in (None, "0", ""):
        env = clean_env() if value is None else clean_env(FUSION_SHIM=value)
        r = run([str(prog)], tmp_path, env)
        assert r.returncode == 0 and r.stdout.strip() == "True", (value, r.stderr)


# -- interception reaches children ----------------------------------------------------------------

KIDS = """\
    import json, os, subprocess, sys
    import multiprocessing as mp
    import numpy as np

    def probe():
        import fusion_shim, wrapt
        rt = fusion_shim.active()
        # until a worker is ready every call is below the floor; under auto the embedded worker runs at
        # idle priority (D20) and on CPUs other work keeps busy it may never be: both are checked
        ready = rt is not None and rt.link is not None and rt.link.wait_ready(20)
        before = (fusion_shim.report(format="json") or {"ops": {}})["ops"].get("numpy.linalg.svd", {})
        # svd has the lowest floor the planner derives (26 n^3 flops on n^2 inputs, issue 5)
        big = np.eye(200) + 1.0              # 320 kB: above svd's floor on any plausible worker, recorded
        small = np.ones((3, 3))              # below it: counted only
        np.linalg.svd(big)
        np.linalg.svd(small)
        after = (fusion_shim.report(format="json") or {"ops": {}})["ops"].get("numpy.linalg.svd", {})
        delta = lambda k: after.get(k, 0) - before.get(k, 0)
        return {"pid": os.getpid(), "active": rt is not None,
                "policy": None if rt is None else rt.config.policy,
                "wrapped": isinstance(np.matmul, getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)),
                "calls": delta("calls"), "below_floor": delta("below_floor") + delta("no_worker"), "ready": ready,
                "worker": os.environ.get("FUSION_SHIM_WORKER")}

    def mp_child(q):
        q.put(probe())

    if __name__ == "__main__":
        out = {"parent": probe()}
        here = os.path.dirname(os.path.abspath(__file__))
        code = f"import json, sys; sys.path.insert(0, {here!r}); import kids; print(json.dumps(kids.probe()))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out["subprocess"] = json.loads(r.stdout.splitlines()[-1])
        for method in ("spawn", "fork"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=mp_child, args=(q,))
            p.start()
            out[method] = q.get(timeout=300)
            p.join(30)
            out[method]["exitcode"] = p.exitcode
        print(json.dumps(out))
"""


@pytest.mark.parametrize("launch", ["FUSION_SHIM=1", "python -m fusion_shim"])
def test_children_are_intercepted(tmp_path, launch):
    prog = write(tmp_path / "kids.py", KIDS)
    # DEVICE=cpu: on a host without a GPU the embedded worker is otherwise deferred (issue 5)
    if launch == "FUSION_SHIM=1":
        r = run([str(prog)], tmp_path, clean_env(FUSION_SHIM="1", FUSION_SHIM_QUIET="1", FUSION_SHIM_DEVICE="cpu"))
    else:
        r = shim([str(prog)], tmp_path, clean_env(FUSION_SHIM_DEVICE="cpu"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    parent_worker = out["parent"]["worker"]
    for who in ("parent", "subprocess", "spawn", "fork"):
        seen = out[who]
        assert seen["active"] and seen["wrapped"] and seen["policy"] == "auto", (who, seen)
        if not seen["ready"] or who == "fork":
            # both intercepted: with no worker ready both kept here by a floor comparison (counted
            # below the floor or before a worker was ready; one may come meanwhile); in a fork, the
            # floors are the parent's, as its own svd taught them
            assert seen["calls"] + seen["below_floor"] == 2 and seen["below_floor"] >= 1, (who, seen)
        else:
            assert seen["calls"] == 1, (who, seen)        # the big call was recorded...
            assert seen["below_floor"] == 1, (who, seen)  # ...and the small one counted
        if who != "parent":
            assert seen["pid"] != out["parent"]["pid"]
            # children reuse the parent's embedded worker instead of starting their own
            assert parent_worker and seen["worker"] == parent_worker, (who, seen)
    assert out["spawn"]["exitcode"] == out["fork"]["exitcode"] == 0


def test_children_inherit_launcher_settings(tmp_path):
    prog = write(tmp_path / "child_policy.py", """\
        import subprocess, sys
        code = "import numpy, fusion_shim; rt = fusion_shim.active(); print(rt.config.policy, rt.config.timeout)"
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
    """)
    r = shim(["--policy", "local", "--timeout", "7", str(prog)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "local 7.0"


# -- the report ---------------------------------------------------------------------------------

def test_report_json_and_render(tmp_path):
    prog = write(tmp_path / "mm.py", """\
        import numpy as np
        a = np.ones((600, 600))  # 5.8 MB in: above the size floor the planner derives (issue 5)
        print(float(np.matmul(a, a).sum()))
        np.dot(np.ones(3), np.ones(3))
    """)
    out = tmp_path / "run.json"
    r = run(["-m", "fusion_shim", "--policy", "auto", "--worker", "ipc:///nonexistent-fusion-shim.sock",
             "--ready-timeout", "1", "--report", str(out), str(prog), "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(600.0 ** 3)
    assert "fusion_shim report" in r.stderr  # not --quiet: the table is printed at exit
    rep = json.loads(out.read_text())
    assert rep["schema"] == "fusion_shim.report/1"
    assert rep["argv"] == [str(prog), "x"]
    assert rep["policy"] == "auto"
    # no worker ever ready: nothing could leave, so every call cost one comparison, counted as
    # made with no worker ready, not as below a floor (D281)
    assert rep["ops"]["numpy.matmul"]["calls"] == 0 and rep["ops"]["numpy.matmul"]["no_worker"] == 1
    assert rep["ops"]["numpy.dot"]["no_worker"] == 1
    assert rep["ops"]["numpy.matmul"]["below_floor"] == rep["ops"]["numpy.dot"]["below_floor"] == 0
    assert rep["records"] == []
    assert rep["worker"]["url"] == "ipc:///nonexistent-fusion-shim.sock"
    rendered = run(["-m", "fusion_shim", "report", str(out)], tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "fusion_shim report" in rendered.stdout and "matmul" in rendered.stdout
    assert "never ready" in rendered.stdout and "no-wkr" in rendered.stdout and "<floor" not in rendered.stdout
    assert "for the worker to warm" not in rendered.stdout  # no worker ever was
    # a recorded call is attributed to the script's own line (under remote, the worker that never
    # answers is waited for and the call falls back here, recorded)
    r = run(["-m", "fusion_shim", "--policy", "remote", "--worker", "ipc:///nonexistent-fusion-shim.sock",
             "--ready-timeout", "1", "--quiet", "--report", str(out), str(prog), "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["records"][0]["op"] == "numpy.matmul" and rep["records"][0]["site"].endswith("mm.py:3")
    # a file that is not a report is refused, with a message
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "other"}')
    refused = run(["-m", "fusion_shim", "report", str(bad)], tmp_path)
    assert refused.returncode == 1 and "fusion_shim.report/1" in refused.stderr


def test_report_with_quiet_writes_json_but_prints_nothing(tmp_path):
    prog = write(tmp_path / "q.py", "import numpy as np\nnp.matmul(np.ones((200, 200)), np.ones((200, 200)))\n")
    out = tmp_path / "q.json"
    r = run(["-m", "fusion_shim", "--quiet", "--policy", "local", "--report", str(out), str(prog)], tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(out.read_text())["schema"] == "fusion_shim.report/1"


# -- install / uninstall in this process --------------------------------------------------------

PATCH_POINTS = sorted({spec.module for spec in CATALOG})


def _snapshot() -> dict[str, dict]:
    import importlib

    return {name: dict(vars(importlib.import_module(name))) for name in PATCH_POINTS}


def test_install_uninstall_restore_exactly(no_shim_after):
    paths = ["matmul", "dot", "einsum", "tensordot", "linalg.solve", "linalg.inv", "linalg.svd",
             "linalg.qr", "fft.fft", "fft.ifft2", "fft.rfft"]
    lookup = lambda path: getattr(np.fft if path.startswith("fft.") else np.linalg if path.startswith("linalg.")
                                  else np, path.rpartition(".")[2])
    named = {path: lookup(path) for path in paths}
    before = _snapshot()
    assert not any(isinstance(v, PROXY) for mod in before.values() for v in mod.values())

    rt = fusion_shim.install(policy="local", quiet=True)
    assert fusion_shim.active() is rt
    wrapped = {spec.name: getattr(sys.modules[spec.module], spec.attr) for spec in CATALOG}
    for spec in CATALOG:
        current = wrapped[spec.name]
        # the C fast path's proxy; rows whose arrays come in a list (multi_dot, lu_solve) keep wrapt's
        # Python path, whose floor check looks inside it (issue 4)
        assert isinstance(current, wrapt.FunctionWrapper if spec.nested else PROXY), spec.name
        assert current.__wrapped__ is before[spec.module][spec.attr], spec.name
    assert all(lookup(path) is not original for path, original in named.items())

    # install() again with no settings is idempotent: same runtime, same wrappers, no double wrap
    assert fusion_shim.install() is rt
    for spec in CATALOG:
        assert getattr(sys.modules[spec.module], spec.attr) is wrapped[spec.name], spec.name
        assert wrapped[spec.name].__wrapped__ is before[spec.module][spec.attr]

    # install() with settings replaces the runtime: still one layer over the original
    rt2 = fusion_shim.install(policy="local", quiet=True, timeout=5.0)
    assert rt2 is not rt and rt2.config.timeout == 5.0
    for spec in CATALOG:
        assert getattr(sys.modules[spec.module], spec.attr).__wrapped__ is before[spec.module][spec.attr]

    fusion_shim.uninstall()
    assert fusion_shim.active() is None
    after = _snapshot()
    for module, attrs in before.items():
        for attr, value in attrs.items():
            assert after[module].get(attr) is value, f"{module}.{attr} not restored"
        extra = {k for k, v in after[module].items() if k not in attrs and isinstance(v, PROXY)}
        assert not extra, f"left behind in {module}: {extra}"
    for path, original in named.items():
        assert lookup(path) is original, path
    fusion_shim.uninstall()  # a second uninstall is harmless
    assert np.matmul is named["matmul"]


def test_a_kept_wrapper_passes_through_after_uninstall(no_shim_after):
    fusion_shim.install(policy="local", quiet=True)
    kept = np.linalg.solve
    fusion_shim.uninstall()
    a = np.array([[2.0, 1.0], [1.0, 3.0]])
    np.testing.assert_array_equal(kept(a, np.ones(2)), np.linalg.solve(a, np.ones(2)))
    assert fusion_shim.report(format="json") is None


def test_report_callable_repeatedly(no_shim_after):
    """``fusion_shim.report`` stays the function after the report's modules (``fusion_shim.reporting``) load."""
    fusion_shim.install(policy="local", quiet=True)
    first, second = fusion_shim.report(format="json"), fusion_shim.report(format="json")
    assert first["schema"] == second["schema"] == "fusion_shim.report/1"
    from fusion_shim.reporting import render  # noqa: F401  (importing the subpackage must not shadow it)

    assert callable(fusion_shim.report) and fusion_shim.report(format="json")["policy"] == "local"


def test_children_of_a_deferred_parent_wait_for_its_worker_instead_of_starting_their_own(tmp_path):
    """No GPU (hidden here): the parent defers its embedded CPU worker (issue 5) but tells its children
    where that worker will listen, so that none of them ever starts one of its own."""
    prog = write(tmp_path / "deferred.py", """\
        import json, subprocess, sys
        import numpy, fusion_shim
        rt = fusion_shim.active()
        code = ("import json, numpy, fusion_shim; l = fusion_shim.active().link; "
                "print(json.dumps([l.url, l.embedded, l.proc is None]))")
        kid = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        print(json.dumps({"state": rt.link.state, "url": rt.link.url, "kid": kid}))
    """)
    r = shim([str(prog)], tmp_path, clean_env(CUDA_VISIBLE_DEVICES="-1"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["state"] == "deferred" and out["url"].startswith("ipc://")
    assert out["kid"] == [out["url"], False, True]  # the parent's future worker; no process of its own


def test_policy_local_prints_what_would_have_been_considered(tmp_path):
    """Under --policy local every intercepted call (C fast path and wrapt's alike) is counted and
    the report printed: the calls auto or remote would have considered."""
    prog = write(tmp_path / "loc.py", """\
        import numpy as np
        a = np.ones((300, 300))
        for _ in range(5):
            np.matmul(a, a)
        np.linalg.solve(a + 300 * np.eye(300), a)
        np.linalg.multi_dot([a, a, a])
    """)
    here = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}  # a checkout's tree
    r = run(["-m", "fusion_shim", "--policy", "local", "--report", str(tmp_path / "r.json"), str(prog)], tmp_path,
            clean_env(**here))
    assert r.returncode == 0, r.stderr
    ops = json.loads((tmp_path / "r.json").read_text())["ops"]
    counted = {name: o["calls"] + o["below_floor"] for name, o in ops.items()}
    assert counted == {"numpy.matmul": 5, "numpy.linalg.solve": 1, "numpy.linalg.multi_dot": 1}, ops
    assert all(o["worker"] == 0 for o in ops.values())
    assert "fusion_shim report" in r.stderr and "offloaded 0 of 7 calls (policy local" in r.stderr, r.stderr
    assert "no intercepted calls" not in r.stderr
    line = next(l for l in r.stderr.splitlines() if l.strip().startswith("matmul"))
    assert line.split()[1] == "5", line


@pytest.mark.parametrize("launch", ["-m", "FUSION_SHIM=1"])
def test_the_collector_is_paused_only_while_the_shim_starts(tmp_path, launch):
    """D119: no cyclic collection while the launcher and the install run; the program finds the
    collector as it left it, on or off, before and after its `import numpy`."""
    prog = tmp_path / "app.py"
    prog.write_text(textwrap.dedent("""
        import gc, sys
        first = gc.isenabled()
        if sys.argv[1:] == ["off"]:
            gc.disable()
        import numpy as np
        import fusion_shim
        np.matmul(np.ones((2, 2)), np.ones((2, 2)))
        print(first, gc.isenabled(), fusion_shim.active() is not None)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    argv = [PY, "-m", "fusion_shim", "--quiet", str(prog)] if launch == "-m" else [PY, str(prog)]
    if launch != "-m":
        env.update(FUSION_SHIM="1", FUSION_SHIM_QUIET="1")
    got = [subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=300, env=env, check=True).stdout
           for extra in ([], ["off"])]
    assert got == ["True True True\n", "True False True\n"]

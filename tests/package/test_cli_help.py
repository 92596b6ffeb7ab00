"""Every subcommand's --help works, exits 0, and names the command as the user typed it."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(sys.executable), "fusion-shim")


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("sub", ["worker", "keys", "report", "calibrate", "config", "pool", "pool up",
                                 "pool status", "pool down"])
def test_each_subcommand_help_exits_0_and_names_itself(sub):
    out = _run(SCRIPT, *sub.split(), "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: fusion-shim {sub}"), out.stdout[:200]


def test_the_console_script_names_itself_and_python_m_names_python_m():
    script = _run(SCRIPT, "--help")
    assert script.returncode == 0 and script.stdout.startswith("usage: fusion-shim [options]"), script.stdout[:200]
    module = _run(sys.executable, "-m", "fusion_shim", "--help")
    assert module.returncode == 0 and module.stdout.startswith("usage: python -m fusion_shim [options]")


def test_calibrate_refuses_an_argument_in_one_usage_error():
    out = _run(SCRIPT, "calibrate", "now")
    assert out.returncode == 2 and "unexpected argument now" in out.stderr

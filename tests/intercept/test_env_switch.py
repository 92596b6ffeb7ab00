"""``FUSION_SHIM`` is read as every boolean setting (D186): ``1/true/yes/on`` turn the shim on,
``0/false/no/off`` or empty leave it off, any other value stops the interpreter at start."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TIMEOUT = 120
PROBE = "import sys; print(any(type(h).__name__ == '_AtNumpy' for h in sys.meta_path))"  # the .pth's hook


def run(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.pop("PYTHONPATH", None)
    if value is not None:
        env["FUSION_SHIM"] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", "Yes", " on "])
def test_a_true_value_turns_the_shim_on(value):
    got = run(value)
    assert (got.returncode, got.stdout, got.stderr) == (0, "True\n", "")


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off", "FALSE", "Off", " no "])
def test_a_false_value_or_none_leaves_the_shim_off(value):
    got = run(value)
    assert (got.returncode, got.stdout, got.stderr) == (0, "False\n", "")


@pytest.mark.parametrize("value", ["2", "enable", "disabled", "of", "-1", "y"])
def test_any_other_value_stops_at_start_listing_the_valid_ones(value):
    got = run(value)
    assert got.returncode == 2
    assert got.stdout == ""  # nothing of the program ran
    assert got.stderr == (f"fusion_shim: FUSION_SHIM={value!r} is not a boolean; "
                          "valid: 1, 0, true, false, yes, no, on, off\n")


def test_the_pth_line_loads_nothing_when_the_variable_is_unset_or_plainly_off():
    probe = "import sys; print('fusion_shim' in sys.modules)"
    for value in (None, "0", "", "false", "no", "off"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
        if value is not None:
            env["FUSION_SHIM"] = value
        got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert got.stdout == "False\n", (value, got.stderr)

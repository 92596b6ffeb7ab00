"""A report file that cannot be written loses nothing else: the table still reaches stderr (even
under ``quiet``), the file is named with its path and reason, the trace is still written, and the
program's exit status is its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys

TIMEOUT = 300
APP = "import numpy as np\nprint(float((np.ones((64, 64)) @ np.ones((64, 64))).sum()))\n"


def run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "local", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_a_report_path_in_a_missing_directory_still_gives_the_table_the_trace_and_the_reason(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    missing = tmp_path / "nodir" / "r.json"
    got = run(["--report", str(missing), "--trace", str(tmp_path / "t.json"), "app.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "262144.0\n"
    assert "fusion_shim report" in got.stderr  # the table's title
    assert f"fusion_shim: report not written to {missing}: No such file or directory" in got.stderr.splitlines()
    assert "report failed" not in got.stderr
    assert json.loads((tmp_path / "t.json").read_text())  # the trace, written where it could be
    assert not missing.parent.exists()


def test_an_unwritable_report_from_the_settings_is_shown_even_under_quiet(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "pyproject.toml").write_text('[tool.fusion_shim]\nreport = "runs/last.json"\nquiet = true\n')
    got = run(["app.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert "fusion_shim report" in got.stderr
    last = got.stderr.splitlines()[-1]
    assert last.startswith("fusion_shim: report not written to ") and last.endswith(
        f"runs{os.sep}last.json: No such file or directory"), last


def test_a_trace_that_cannot_be_written_is_named_and_the_report_file_is_still_written(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    got = run(["--quiet", "--report", "r.json", "--trace", str(tmp_path / "none" / "t.json"), "app.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads((tmp_path / "r.json").read_text())["policy"] == "local"
    assert got.stderr.splitlines()[-1] == (f"fusion_shim: trace not written to {tmp_path / 'none' / 't.json'}: "
                                            "No such file or directory")
    assert sorted(os.listdir(tmp_path)) == ["app.py", "r.json"]  # no temporary left behind

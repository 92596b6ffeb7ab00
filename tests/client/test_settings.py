"""Settings in ``pyproject.toml``: the ``[tool.fusion_shim]`` table found from the program's directory
upward, checked as the variables are, below the environment and the flags; ``fusion-shim config``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusion_shim
from fusion_shim import cli
from fusion_shim.config import Config, ConfigError, find_project

PACKAGE_ROOT = str(Path(fusion_shim.__file__).resolve().parents[1])  # this tree's package, for the children
TIMEOUT = 300


def write_project(where: Path, table: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "pyproject.toml"
    path.write_text("[project]\nname = 'app'\n\n[tool.fusion_shim]\n" + textwrap.dedent(table))
    return path


def load(start: Path, env: dict | None = None, **flags):
    return Config.load_with_sources(env or {}, project=find_project(str(start)), **flags)


# -- precedence: defaults < pyproject < environment < flags ---------------------------------------

def test_a_setting_in_pyproject_overrides_the_default(tmp_path):
    path = write_project(tmp_path, 'policy = "remote"\ntimeout = 5\nstrict = true\n')
    config, sources = load(tmp_path)
    assert (config.policy, config.timeout, config.strict) == ("remote", 5.0, True)
    assert sources["policy"] == f"{path} [tool.fusion_shim]"
    assert config.device == "auto" and "device" not in sources


def test_the_environment_overrides_pyproject(tmp_path):
    write_project(tmp_path, 'policy = "remote"\ntimeout = 5\n')
    config, sources = load(tmp_path, {"FUSION_SHIM_POLICY": "local"})
    assert config.policy == "local" and sources["policy"] == "environment FUSION_SHIM_POLICY"
    assert config.timeout == 5.0


def test_a_flag_overrides_the_environment_and_pyproject(tmp_path):
    write_project(tmp_path, 'policy = "remote"\n')
    config, sources = load(tmp_path, {"FUSION_SHIM_POLICY": "local"}, policy="auto")
    assert config.policy == "auto" and sources["policy"] == "--policy"


def test_without_a_project_the_table_is_not_read(tmp_path, monkeypatch):
    write_project(tmp_path, 'policy = "remote"\n')
    monkeypatch.chdir(tmp_path)
    assert Config.load(env={}).policy == "auto"  # fusion_shim.install() reads no pyproject


# -- the search upward ----------------------------------------------------------------------------

def test_the_nearest_pyproject_with_the_table_is_found_from_below(tmp_path):
    outer = write_project(tmp_path, 'policy = "local"\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("[tool.other]\nx = 1  # mentions fusion_shim\n")
    deep = tmp_path / "pkg" / "src" / "app"
    deep.mkdir(parents=True)
    assert find_project(str(deep)).path == str(outer)
    inner = write_project(tmp_path / "pkg" / "src", 'policy = "remote"\n')
    assert find_project(str(deep)).path == str(inner)


def test_relative_paths_are_taken_from_the_pyprojects_directory(tmp_path):
    write_project(tmp_path, 'report = "out/run.json"\ntrace = "/abs/t.json"\n')
    config, _ = load(tmp_path)
    assert config.report == str(tmp_path / "out" / "run.json") and config.trace == "/abs/t.json"


def test_workers_may_be_a_toml_list_and_dashes_name_the_same_key(tmp_path):
    write_project(tmp_path, 'workers = ["tcp://a:1", "tcp://b:2"]\nready-timeout = 0\n')
    config, _ = load(tmp_path)
    assert config.workers == ("tcp://a:1", "tcp://b:2") and config.ready_timeout == 0.0


# -- invalid values name the file and the key -----------------------------------------------------

@pytest.mark.parametrize("table, key, listed", [
    ('policy = "fast"\n', "policy", "auto, local, remote"),
    ("timeout = -1\n", "timeout", "must be > 0"),
    ('quiet = "maybe"\n', "quiet", "1, 0, true, false"),
    ('worker = "http://x"\n', "worker", "inproc://, ipc://, tcp://"),
    ("verify = [1]\n", "verify", "not a string, number or boolean"),
    ('polcy = "local"\n', "polcy", "valid: policy, worker"),
])
def test_an_invalid_value_names_the_file_and_the_key(tmp_path, table, key, listed):
    path = write_project(tmp_path, table)
    with pytest.raises(ConfigError) as err:
        load(tmp_path)
    assert f"{path}: [tool.fusion_shim] {key}" in str(err.value) and listed in str(err.value)


def test_a_pyproject_that_is_not_toml_is_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.fusion_shim]\npolicy = \n")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'pyproject.toml'}: not valid TOML"):
        find_project(str(tmp_path))


# -- fusion-shim config -------------------------------------------------------------------------

def config_lines(capsys, *argv) -> dict[str, tuple[str, str]]:
    assert cli.main(["config", *argv]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  "):
            name, value, source = line.split(None, 2)
            rows[name] = (value, source)
    return rows


def test_config_prints_each_setting_and_where_it_came_from(tmp_path, monkeypatch, capsys):
    path = write_project(tmp_path, 'policy = "remote"\ntimeout = 5\nverify = 0.1\n')
    (tmp_path / "app.py").write_text("")
    monkeypatch.setenv("FUSION_SHIM_TIMEOUT", "7")
    rows = config_lines(capsys, "--verify", "0.5", str(tmp_path / "app.py"))
    assert rows["policy"] == ("remote", f"{path} [tool.fusion_shim]")
    assert rows["timeout"] == ("7.0", "environment FUSION_SHIM_TIMEOUT")
    assert rows["verify"] == ("0.5", "--verify")
    assert rows["device"] == ("auto", "default")
    assert set(rows) == set(Config.fields())


def test_config_reads_the_working_directory_by_default_and_fails_on_a_bad_value(tmp_path, monkeypatch, capsys):
    write_project(tmp_path, 'policy = "fast"\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["config"]) == 2
    assert "[tool.fusion_shim] policy='fast' is invalid" in capsys.readouterr().err


# -- launches read it; a process that never imports NumPy does not --------------------------------

def child_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.update(PYTHONPATH=PACKAGE_ROOT, CUDA_VISIBLE_DEVICES="-1", **extra)
    return env


PROGRAM = "import numpy as np, fusion_shim\nprint(fusion_shim.active().config.policy)\n"


@pytest.mark.parametrize("launch", ["launcher", "bootstrap"])
def test_a_launched_program_gets_its_projects_settings(tmp_path, launch):
    write_project(tmp_path, 'policy = "local"\nquiet = true\nreport = "run.json"\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(PROGRAM)
    cmd = [sys.executable, *(["-m", "fusion_shim"] if launch == "launcher" else []), "src/app.py"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                       env=child_env(**({"FUSION_SHIM": "1"} if launch == "bootstrap" else {})))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["local"] and r.stderr == ""
    assert json.loads((tmp_path / "run.json").read_text())["policy"] == "local"


def test_an_invalid_pyproject_fails_at_numpys_import_and_costs_nothing_without_it(tmp_path):
    path = write_project(tmp_path, 'policy = "fast"\n')
    env = child_env(FUSION_SHIM="1")
    (tmp_path / "plain.py").write_text("import sys\nprint('fusion_shim.config' in sys.modules)\n")
    plain = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=TIMEOUT, env=env)
    assert (plain.returncode, plain.stdout.strip()) == (0, "False")
    (tmp_path / "app.py").write_text(PROGRAM)
    r = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=TIMEOUT, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert f"fusion_shim: {path}: [tool.fusion_shim] policy='fast' is invalid" in r.stderr


def test_a_flag_at_its_default_over_pyproject_reaches_the_programs_children(tmp_path):
    write_project(tmp_path, 'policy = "remote"\nquiet = true\n')
    (tmp_path / "app.py").write_text("import os\nprint(os.environ.get('FUSION_SHIM_POLICY'))\n")
    r = subprocess.run([sys.executable, "-m", "fusion_shim", "--policy", "auto", "app.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT, env=child_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto"]  # a child in another directory would not find this pyproject


@pytest.mark.parametrize("launch", ["launcher", "bootstrap"])
def test_a_module_run_with_dash_m_gets_the_working_directorys_settings(tmp_path, launch):
    write_project(tmp_path, 'policy = "local"\nquiet = true\n')
    write_project(tmp_path / "pkg", 'policy = "remote"\n')
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "app.py").write_text(PROGRAM)
    cmd = [sys.executable, *(["-m", "fusion_shim"] if launch == "launcher" else []), "-m", "pkg.app"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                       env=child_env(**({"FUSION_SHIM": "1"} if launch == "bootstrap" else {})))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["local"]


@pytest.mark.parametrize("text", ['[tool]\nfusion_shim.policy = "remote"\n', 'tool.fusion_shim.policy = "remote"\n',
                                  '[tool."fusion_shim"]\npolicy = "remote"\n'])
def test_every_toml_spelling_of_the_table_is_found(tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    assert load(tmp_path)[0].policy == "remote"


def test_a_pyproject_whose_text_cannot_hold_the_table_is_not_parsed(tmp_path):
    outer = write_project(tmp_path, 'policy = "local"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text("not = = toml, [tool.other] fusion_shim*\n")
    assert find_project(str(tmp_path / "sub")).path == str(outer)  # D115: no TOML error, no tomllib

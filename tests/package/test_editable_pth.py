"""``pip install -e .`` installs ``fusion_shim.pth`` too, so that ``FUSION_SHIM=1`` works from a
checkout: the editable wheel setuptools builds carries it beside its own ``.pth``, whose name sorts
first (its finder makes ``fusion_shim`` importable before ours runs)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

from tests.helpers.environment import ROOT


def test_the_editable_wheel_carries_the_pth(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fusion_shim", src / "fusion_shim", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "native", src / "native")
    for name in ("setup.py", "pyproject.toml", "README.md", "fusion_shim.pth"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.update(CC="false", LDSHARED="false")  # the extension is optional: not built, quicker
    code = "from setuptools import build_meta; print(build_meta.build_editable(%r))" % str(tmp_path / "dist")
    r = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = tmp_path / "dist" / r.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert z.read("fusion_shim.pth") == (ROOT / "fusion_shim.pth").read_bytes()
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    editable = [n for n in names if n.endswith(".pth") and n != "fusion_shim.pth"]
    assert editable and all(n < "fusion_shim.pth" for n in editable), names  # setuptools' runs first
    assert "fusion_shim.pth," in record  # uninstalled with the package

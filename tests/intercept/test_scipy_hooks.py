"""SciPy's rows are wrapped by post-import hooks on scipy.linalg and scipy.fft (issue 4), whether
SciPy is imported after install() or before it, and uninstall() puts back exactly the objects it
replaced. Each case runs in a fresh interpreter: in this one SciPy is long imported."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("scipy")

PRELUDE = """
import wrapt, fusion_shim
from fusion_shim.catalog import CATALOG
ROWS = [s for s in CATALOG if s.trigger != "numpy"]
PROXY = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)  # wrapt's C proxy, the shim's base

def current():
    import importlib
    return {s.name: getattr(importlib.import_module(s.module), s.attr) for s in ROWS}

def wrapped(objs):
    return {n for n, f in objs.items() if isinstance(f, (wrapt.FunctionWrapper, PROXY))}
"""


def run(body: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_scipy_imported_after_install_is_wrapped_and_restored():
    out = run("""
        import numpy
        fusion_shim.install(policy="local", quiet=True)
        import scipy.linalg, scipy.fft  # the post-import hooks fire here
        objs = current()
        assert wrapped(objs) == {s.name for s in ROWS}, sorted({s.name for s in ROWS} - wrapped(objs))
        originals = {n: f.__wrapped__ for n, f in objs.items()}
        fusion_shim.uninstall()
        after = current()
        assert all(after[n] is originals[n] for n in after), "uninstall did not restore the originals"
        fusion_shim.install(policy="local", quiet=True)  # hooks registered once: a re-install wraps again
        assert wrapped(current()) == {s.name for s in ROWS}
        fusion_shim.uninstall()
        assert all(current()[n] is originals[n] for n in originals)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_scipy_imported_before_install_is_wrapped_and_restored():
    out = run("""
        import scipy.linalg, scipy.fft
        before = current()
        assert not wrapped(before)
        fusion_shim.install(policy="local", quiet=True)
        assert wrapped(current()) == {s.name for s in ROWS}
        fusion_shim.uninstall()
        after = current()
        assert all(after[n] is before[n] for n in before), "uninstall did not restore the originals"
        print("ok")
    """)
    assert out.strip() == "ok"


def test_only_the_imported_scipy_module_is_wrapped():
    out = run("""
        fusion_shim.install(policy="local", quiet=True)
        import numpy, sys
        import scipy.fft
        linalg_loaded = "scipy.linalg" in sys.modules
        fft = sys.modules["scipy.fft"]
        fft_rows = [s for s in ROWS if s.trigger == "scipy.fft"]
        assert all(isinstance(getattr(fft, s.attr), (wrapt.FunctionWrapper, PROXY)) for s in fft_rows)
        if not linalg_loaded:  # SciPy's fft does not import its linalg today: then nothing hooks it
            assert "scipy.linalg" not in sys.modules
        import scipy.linalg  # now its hook fires
        assert wrapped(current()) == {s.name for s in ROWS}
        print("ok")
    """)
    assert out.strip() == "ok"

"""Issue 3: the optional C extension (native/_native.c -> fusion_shim._native) was built by the
install and loads; where it cannot be used (another tool's entry in ndarray's slot, no extension,
no compiler at install), the shim patches nothing of ndarray, works, and says so.

The programs that tamper with NumPy run in subprocesses, so that this process's NumPy stays clean.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusion_shim
from tests.helpers.environment import NATIVE_OFF, ROOT

needs_native = pytest.mark.skipif(NATIVE_OFF, reason="FUSION_SHIM_NATIVE=0 was set for this run")


@needs_native
def test_extension_was_built_and_loaded():
    """The install built the extension (editable: beside the sources; ``pip install .``: in the
    installed package, found from a source checkout too); skipped only under FUSION_SHIM_NATIVE=0."""
    import numpy  # noqa: F401 - the extension loads after NumPy

    from fusion_shim.intercept import native
    assert native.available(), native.LOAD_ERROR
    where = Path(native._native.__file__).parent
    assert where == ROOT / "fusion_shim" or where.parent.name in ("site-packages", "dist-packages"), where
    rt = fusion_shim.install(policy="auto", quiet=True)
    try:
        assert rt.operators == {"intercepted": True, "why": "", "fast_path": "C"}, rt.operators
        assert native._native.patched()
    finally:
        fusion_shim.uninstall()


@pytest.mark.skipif(os.name != "posix", reason="the SIGBUS-safe copy is built on POSIX only")
def test_the_segment_copy_was_built_and_loads():
    """D180: the worker's SIGBUS-safe copy, built beside ``_native`` and found the same ways."""
    from fusion_shim.transport import shm_worker

    copy = shm_worker.guarded_copy()
    assert copy is not None, "fusion_shim._segcopy was not built"
    where = Path(copy.__file__).parent
    assert where == ROOT / "fusion_shim" or where.parent.name in ("site-packages", "dist-packages"), where


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    return subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=600, env=env)


@needs_native
def test_foreign_entry_means_nothing_is_patched(tmp_path):
    """Someone else's function in ndarray's @ slot (here a ctypes callback): the shim patches
    nothing, warns once, the report says so, and module functions are still intercepted."""
    r = _run("""\
        import ctypes, json, warnings
        import numpy as np
        import fusion_shim
        from fusion_shim import _native

        BINARY = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.py_object)
        foreign = BINARY(lambda x, y: "foreign")
        # CPython 3.11 x86-64: tp_as_number at offset 96 of the type; nb_matrix_multiply is entry 34
        number = ctypes.c_void_p.from_address(id(np.ndarray) + 96).value
        slot = ctypes.c_void_p.from_address(number + 34 * ctypes.sizeof(ctypes.c_void_p))
        ours = slot.value
        assert ours == _native.entries()[0][0], "layout assumption of this test"
        slot.value = ctypes.cast(foreign, ctypes.c_void_p).value
        a = np.ones((40, 40))
        assert (a @ a) == "foreign"
        entries = _native.entries()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rt = fusion_shim.install(policy="remote", quiet=True)
            fusion_shim.install(policy="remote", quiet=True, timeout=30.0)  # a second runtime
            rt = fusion_shim.active()
        out = {"warnings": [str(w.message) for w in caught], "operators": rt.operators,
               "patched": _native.patched(), "untouched": _native.entries() == entries,
               "still_foreign": (a @ a) == "foreign"}
        rt.link.wait_ready(600)
        np.matmul(a, a)
        out["report"] = fusion_shim.report(format="json")["operators"]
        out["records"] = [(r.op, r.kind) for r in rt.ledger.records]
        fusion_shim.uninstall()
        out["after"] = _native.entries() == entries
        slot.value = ours
        out["restored_by_test"] = float((a @ a)[0, 0])
        print(json.dumps(out))
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    warned = [w for w in out["warnings"] if "not intercepted" in w]
    assert len(warned) == 1 and "slot wrapper" in warned[0], out["warnings"]
    assert out["operators"]["intercepted"] is False and "slot wrapper" in out["operators"]["why"]
    assert not out["patched"] and out["untouched"] and out["still_foreign"] and out["after"]
    assert out["report"]["intercepted"] is False
    assert out["records"] == [["numpy.matmul", "worker"]]
    assert out["restored_by_test"] == 40.0


def test_without_the_extension_the_shim_works_and_says_so(tmp_path):
    r = _run("""\
        import json, sys
        sys.modules["fusion_shim._native"] = None  # as if the build had failed: ImportError
        import numpy as np
        import fusion_shim
        rt = fusion_shim.install(policy="remote")
        rt.link.wait_ready(600)
        a = np.ones((30, 30))
        a @ a
        np.matmul(a, a)
        print(json.dumps({"operators": fusion_shim.report(format="json")["operators"],
                          "records": [(r.op, r.kind) for r in rt.ledger.records]}))
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["operators"]["intercepted"] is False and "not available" in out["operators"]["why"]
    assert out["operators"]["fast_path"] == "wrapt"
    assert out["records"] == [["numpy.matmul", "worker"]]
    assert "operators @, @=, .dot: not intercepted (the C extension" in r.stderr  # the table at exit


def test_a_failed_compile_does_not_fail_the_build(tmp_path):
    """The optional build_ext: no working compiler -> a warning, no extension, exit status 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env.update(CC="false", LDSHARED="false")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                        "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert "fusion_shim._native was not built" in r.stderr
    assert not list((tmp_path / "lib").rglob("_native*"))
    if os.name == "posix":
        assert "fusion_shim._segcopy was not built" in r.stderr and "through their fds" in r.stderr
        assert not list((tmp_path / "lib").rglob("_segcopy*"))

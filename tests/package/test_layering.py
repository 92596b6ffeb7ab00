"""The worker side stands alone: the worker, the transport and the protocol import nothing of the
client side, and the production worker offers no test-only behaviour."""
from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.environment import ROOT

PKG = ROOT / "fusion_shim"
# the client side: what a worker must never need
CLIENT = ("fusion_shim.intercept", "fusion_shim.plan", "fusion_shim.runtime", "fusion_shim.client",
          "fusion_shim.reporting", "fusion_shim.ledger", "fusion_shim.residency", "fusion_shim.linkprobe",
          "fusion_shim.ipython", "fusion_shim.verify", "wrapt")
WORKER_SIDE = ["worker", "transport", "protocol", "auth.py", "pool/actor.py"]
WORKER_MODULES = ["fusion_shim.worker.server", "fusion_shim.worker.command", "fusion_shim.worker.backend",
                  "fusion_shim.worker.bench", "fusion_shim.worker.kernels", "fusion_shim.worker.store",
                  "fusion_shim.worker.numba_kernels", "fusion_shim.transport", "fusion_shim.transport.shm_common", "fusion_shim.transport.shm_worker",
                  "fusion_shim.protocol.wire", "fusion_shim.protocol.fingerprint", "fusion_shim.auth",
                  "fusion_shim.pool.actor", "fusion_shim.worker.devicecalls", "fusion_shim.worker.stagechild"]


def _client_side(name: str) -> bool:
    return any(name == c or name.startswith(c + ".") for c in CLIENT)


def _sources() -> list[Path]:
    out: list[Path] = []
    for part in WORKER_SIDE:
        path = PKG / part
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a source file imports, at any level (function bodies too), as an absolute name."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])  # the module's package
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []  # level 1: the package itself
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]  # a submodule, maybe
    return found


def test_no_worker_side_source_names_the_client_side():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in _sources() for line, name in _imports(p)
           if _client_side(name)]
    assert bad == []


def test_importing_the_worker_side_loads_nothing_of_the_client_side():
    """What the worker's modules load, the package's ``__init__`` and a self-benchmark of the
    decompositions included (it reads the catalog)."""
    code = (
        "import importlib, json, sys\n"
        "base = set(sys.modules)\n"
        f"for m in {WORKER_MODULES!r}: importlib.import_module(m)\n"
        "from fusion_shim.worker import bench\n"
        "from fusion_shim.worker.backend import TorchBackend\n"
        "ops, failed = bench.bench_ops(TorchBackend('cpu'), 8, repeat=1)\n"
        "assert ops and not failed, failed\n"
        "print(json.dumps(sorted(set(sys.modules) - base)))\n"
    )
    env = {**os.environ, "FUSION_SHIM": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "fusion_shim.worker.server" in loaded
    assert [m for m in loaded if _client_side(m)] == []


def test_the_worker_command_offers_no_test_option():
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "worker", "--help"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "FUSION_SHIM": "0", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "--bind" in out.stdout, out.stderr[-2000:]
    assert "test" not in out.stdout.lower() and "--delay" not in out.stdout and "--corrupt" not in out.stdout


def test_the_worker_takes_no_test_parameter():
    from fusion_shim.worker import Worker, serve_in_thread

    for fn in (Worker, serve_in_thread):
        names = set(inspect.signature(fn).parameters)
        assert not {n for n in names if "test" in n or n in ("delay", "corrupt")}, names


def test_the_planner_imports_neither_zmq_nor_torch():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in sorted((PKG / "plan").rglob("*.py"))
           for line, name in _imports(p) if name.split(".")[0] in ("zmq", "torch")]
    assert bad == []


def test_the_client_side_never_imports_the_interceptor():
    """The installation drives the runtime, never the other way round (no import cycle)."""
    sources = [*sorted((PKG / "client").rglob("*.py")), *sorted((PKG / "plan").rglob("*.py")),
               *sorted((PKG / "report").rglob("*.py")), PKG / "ledger.py"]
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in sources for line, name in _imports(p)
           if name == "fusion_shim.intercept" or name.startswith("fusion_shim.intercept.")]
    assert bad == []


def test_only_the_protocol_imports_msgpack():
    """The wire's bytes are made and read in protocol/ alone: its forms, not spliced in place elsewhere."""
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(PKG.rglob("*.py")) if "protocol" not in p.parts
           for line, name in _imports(p) if name == "msgpack" or name.startswith("msgpack.")]
    assert bad == []

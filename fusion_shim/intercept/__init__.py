"""Interception: a post-import hook on ``numpy`` (:mod:`fusion_shim._hooks`) wraps every catalog row.

Rows whose ``trigger`` is another module (SciPy's: ``scipy.linalg``, ``scipy.fft``) are wrapped by
a post-import hook on that module, after NumPy's. It works whether NumPy is already imported or not.
:func:`install` is idempotent; :func:`uninstall` puts back exactly the objects it replaced, in
reverse order. A row whose catalog entry does not match the installed NumPy's signature is left
unwrapped, with a warning and a ledger event.

The per-call fast path (policy local, or inputs below the planner's byte floor for the op) is one
attribute read, one sum over the positional and keyword arrays and one comparison before NumPy's own
function is called; nothing is recorded for it but a count. With the C extension (``native.py``)
that check runs in C inside a wrapt ``ObjectProxy``; without it, in a wrapt ``FunctionWrapper``
(both wrapt's C types, loaded without the wrapt package: :mod:`.wrappers`, D112).
The same extension intercepts ``a @ b``, ``a @= b`` and ``a.dot(b)`` on ndarrays. Above the
floor, both paths call :meth:`fusion_shim.client.runtime.Runtime.dispatch`.

One :class:`_Installation` per :func:`install`: its Config, its runtime once NumPy is imported,
what it patched, and the C fast paths whose floors it publishes for the runtime. What the hook on
NumPy costs is the report's start-up line (``interception``); the runtime loads the rest on first need.
"""
from __future__ import annotations

import _thread  # D36: threading's locks are these, without loading threading
import atexit
import contextlib
import gc
import importlib
import importlib.machinery  # D123: NumPy has loaded it; importlib.util it has not
import os
import sys
import time
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .. import _hooks
from ..config import Config
from ..plan.cells import NEVER
from . import native, wrappers

if TYPE_CHECKING:  # numpy and zmq load when numpy does, not when the bootstrap installs the hook
    from ..catalog import OpSpec
    from ..client.runtime import Runtime

# Modules whose import wraps catalog rows (each row's OpSpec.trigger): named here so that install()
# need not import the catalog (and NumPy) early; a test holds this list to the catalog's triggers.
TRIGGERS = ("numpy", "scipy.linalg", "scipy.fft")
# D285: a call made from these packages' own frames (their tests' aside) is theirs, not the program's
LIBRARIES = ("numpy", "scipy")


class _Installation:
    """One install(): before NumPy is imported just its Config (nothing heavy is imported yet), then
    its runtime and everything it patched, until uninstall() puts it back."""

    def __init__(self, config: Config, export_env: bool):
        self.config = config
        self.export_env = export_env  # children of this process reuse its worker (the launcher's)
        self.runtime: "Runtime | None" = None
        self.patches: list[tuple[ModuleType, str, Any]] = []
        self.patched_triggers: set[str] = set()
        self.later: list[tuple[str, Callable]] = []  # (module, hook): rows wrapped when it is imported
        self.fast_calls: dict[str, list] = {}  # op name -> its C fast paths, which hold its floor
        self.stage_marks: Any = None  # the stages' post-import hooks (docs/stages.md), undone at uninstall

    def publish_floors(self, floor_bytes: int, floors: dict[str, int], operators: "tuple | None") -> None:
        """The runtime's planner refreshed floors: the C fast path holds the smallest, each wrapped
        function and each operator its own."""
        with _lock:  # never after uninstall published -1, nor for an installation replaced since
            if _installed is not self:
                return
            native.publish_floor(floor_bytes)
            for name, floor in floors.items():
                for fast in self.fast_calls.get(name, ()):
                    fast.floor = floor
            if operators is not None:
                native.publish_op_floors(operators)


_lock = _thread.RLock()
_installed: _Installation | None = None
_exit_hooks: list[Callable[["Runtime"], None]] = []


def active() -> "Runtime | None":
    """The running shim, once NumPy is imported and wrapped; None before that or when not installed."""
    inst = _installed
    return None if inst is None else inst.runtime


def install(config: Config | None = None, *, export_env: bool = False,
            **overrides: Any) -> "Runtime | _Installation":
    """Intercept NumPy in this process. With no arguments a second call returns the running shim;
    with a Config or settings it replaces it. ``export_env``: children reuse this process's worker."""
    global _installed
    with _lock:
        if _installed is not None:
            if config is None and not overrides:
                return _installed.runtime or _installed
            uninstall()
        if config is None:
            config = Config.load(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        inst = _installed = _Installation(config, export_env)
        for name in TRIGGERS:  # each runs now if its module is already imported, else right after it is
            _hooks.when_imported(name, _on_numpy if name == "numpy" else _on_library)
        if config.stages:
            from ..stages.mark import Marks

            inst.stage_marks = Marks(config.stages, _event)
        return inst.runtime or inst


def installed_settings() -> tuple[Config, bool] | None:
    """(Config, export_env) of the install in place, NumPy imported or not; None when none is."""
    inst = _installed
    return None if inst is None else (inst.config, inst.export_env)


def uninstall() -> None:
    """Restore every patched attribute exactly and stop the worker this process started."""
    global _installed
    with _lock:
        native.uninstall_operators()  # also publishes floor -1: kept proxies pass straight through
        inst, _installed = _installed, None
        for name in TRIGGERS:  # the undo of install's hooks, where their modules were never imported
            _hooks.forget(name, _on_numpy if name == "numpy" else _on_library)
        for name, hook in inst.later if inst is not None else ():
            _hooks.forget(name, hook)
        if inst is not None:
            for module, attr, original in reversed(inst.patches):
                setattr(module, attr, original)
            if inst.stage_marks is not None:
                inst.stage_marks.undo()
    if inst is not None and inst.runtime is not None:
        inst.runtime.shutdown()


def _event(text: str) -> None:
    rt = active()
    if rt is not None:
        rt.ledger.event(text)


def note_startup(phase: str, seconds: float) -> None:
    """Time the shim spent starting: the running shim's, else kept for the runtime NumPy's import makes."""
    rt = active()
    if rt is not None:
        rt.note_startup(phase, seconds)
    else:
        _hooks.SPENT[phase] = _hooks.SPENT.get(phase, 0.0) + seconds


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """In this thread, for the block: NumPy runs untouched, nothing is intercepted or recorded
    (reference results in tests, a worker thread inside the client process). Nests."""
    from ..client import GUARD

    was = getattr(GUARD, "busy", False)
    entered = native.available()  # loads the extension: NumPy is imported by now
    GUARD.busy = True
    if entered:
        native._native.enter()
    try:
        yield
    finally:
        if entered:
            native._native.leave()
        GUARD.busy = was


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection in the block (D119), unless the program had turned it off already."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def on_exit(hook: Callable[["Runtime"], None]) -> None:
    """Run ``hook(runtime)`` at interpreter exit, before the worker is stopped (the report uses it)."""
    _exit_hooks.append(hook)


def _report_at_exit(rt: "Runtime") -> None:
    if _nothing_to_report(rt):  # D37: the report's modules are not loaded for a table nobody sees
        return
    # imported here, at exit: nothing it loads may run exec() or eval() on source text (a
    # dataclass, a namedtuple), which makes CPython forget an unhandled Ctrl-C and exit with
    # status 1 instead of by SIGINT; config and ledger hold none (D36) and are loaded by then
    from ..reporting import at_exit

    at_exit(rt)


def _nothing_to_report(rt: "Runtime") -> bool:
    """No file to write, and no table to print: quiet, or no call counted and the operators
    intercepted (where they are not, the report says why)."""
    c = rt.config
    if c.report or c.trace:
        return False
    return c.quiet or (rt.operators["intercepted"] and not rt.ledger.snapshot_ops())


_exit_hooks.append(_report_at_exit)


@atexit.register
def _at_exit() -> None:
    rt = active()
    if rt is None:
        return
    for hook in _exit_hooks:
        try:
            hook(rt)
        except Exception as exc:  # a report that fails must not change the program's exit
            print(f"fusion_shim: report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    uninstall()


def _after_fork_in_child() -> None:
    rt = active()
    if rt is not None:
        rt.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _on_numpy(_numpy: ModuleType) -> None:
    with gc_paused():  # D119: what the install makes lives on; a collection would find nothing to free
        started = _wrap_numpy()
    if started is not None:
        started.start()


def _wrap_numpy() -> Runtime | None:
    """The runtime made and NumPy's rows wrapped; the runtime to start, or None."""
    t = time.perf_counter()
    from ..client.runtime import Runtime

    with _lock:
        inst = _installed
        if inst is None or "numpy" in inst.patched_triggers:
            return None
        if inst.runtime is None:
            inst.runtime = Runtime(inst.config, publish_floors=inst.publish_floors, export_env=inst.export_env,
                                   stage_runner=_stage_runner)
            for phase in list(_hooks.SPENT):  # the bootstrap's and the launcher's: the first runtime's only
                inst.runtime.note_startup(phase, _hooks.SPENT.pop(phase))
        rt = inst.runtime
        _patch_rows(inst, "numpy")
        for name in TRIGGERS[1:]:  # imported before NumPy's hook ran (its own hook returned early)
            if name in sys.modules:
                _patch_rows(inst, name)
        native.publish_libraries(LIBRARIES)
        # policy local: every call below an unreachable floor, counted (what the report considers)
        native.publish_floor(NEVER if rt.local_only else rt.floor_bytes)
        ok, why = native.install_operators(rt)
        rt.note_operators(ok, why, "C" if _use_c(rt) else "wrapt")
        rt.note_startup("interception", time.perf_counter() - t)
    return rt


def _stage_runner(*parts: Any) -> Any:
    """The run's stage runner, for the runtime to make (D347); its modules load with a stage's first call."""
    from ..stages.runner import Runner

    return Runner(*parts)


def _use_c(rt: "Runtime") -> bool:
    return rt.config.native and native.available()


def _on_library(module: ModuleType) -> None:
    """A trigger module other than NumPy was imported: wrap its rows. NumPy's hook has run by then
    (SciPy imports NumPy first) and created the runtime."""
    with _lock:
        inst = _installed
        if inst is None or inst.runtime is None or "numpy" not in inst.patched_triggers:
            return
        _patch_rows(inst, module.__name__)


def _patch_rows(inst: _Installation, trigger: str) -> None:
    """Wrap every row whose trigger is ``trigger``, once per install. Rows of a submodule the
    library loads on first use (NumPy 2's ``numpy.fft``) are wrapped when it is imported."""
    from ..catalog import CATALOG

    if trigger in inst.patched_triggers:
        return
    inst.patched_triggers.add(trigger)
    by_module: dict[str, list] = {}
    for spec in CATALOG:
        if spec.trigger == trigger:
            by_module.setdefault(spec.module, []).append(spec)
    for name, rows in by_module.items():
        # one that cannot be found is wrapped now: its rows' ImportError is said at install
        if name == trigger or name in sys.modules or not _findable(name):
            _wrap_rows(inst, rows)
            continue
        hook = (lambda module, rows=rows: _wrap_rows_if_installed(inst, rows))
        inst.later.append((name, hook))
        _hooks.when_imported(name, hook)


def _findable(name: str) -> bool:
    """Whether the submodule ``name`` of an imported library can be imported: searched on its
    package's path, as its import would (D123); any other case as ``importlib.util.find_spec``."""
    parent = sys.modules.get(name.rpartition(".")[0])
    path = getattr(parent, "__path__", None)
    if path is not None and importlib.machinery.PathFinder.find_spec(name, path) is not None:
        return True
    from importlib.util import find_spec

    return find_spec(name) is not None


def _wrap_rows_if_installed(inst: _Installation, rows: list) -> None:
    with _lock:  # the import may come on any thread, after an uninstall or another install
        if _installed is inst:
            _wrap_rows(inst, rows)


def _wrap_rows(inst: _Installation, rows: list) -> None:
    from ..catalog import check_names

    rt = inst.runtime
    use_c = _use_c(rt)
    fast_cells: list[tuple[str, Any]] = []
    for spec in rows:
        try:
            # D123: NumPy is still initializing here, and importing it again takes its module lock
            module = sys.modules.get(spec.module) or importlib.import_module(spec.module)
            original = getattr(module, spec.attr)
            check_names(spec, original)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            warnings.warn(f"fusion_shim: {spec.name} is not intercepted: {exc}", RuntimeWarning, stacklevel=3)
            rt.ledger.event(f"not intercepted: {spec.name}: {exc}")
            continue
        slow = _make_slow(spec, rt, original)
        if use_c and not spec.nested:  # the C floor check counts top-level ndarrays only
            proxy, fast = native.fast_proxy(original, slow)
            fast.floor = rt.floor_cell(spec.name)[0]  # its own floor; the planner's refreshes update it
            inst.fast_calls.setdefault(spec.name, []).append(fast)
            fast_cells.append((spec.name, fast))
        else:
            proxy = wrappers.load()[1](original, _make_wrapper(spec, rt, slow))  # FunctionWrapper
        setattr(module, spec.attr, proxy)
        inst.patches.append((module, spec.attr, original))
    if fast_cells:
        rt.add_counters(lambda: {name: f.below for name, f in fast_cells},
                        lambda: [setattr(f, "below", 0) for _, f in fast_cells])


def _make_slow(spec: "OpSpec", rt: "Runtime", original: Callable) -> Callable:
    """The shim's path for a call above its op's floor: the runtime's one entry. The row's
    signature is made on its first such call (D116); two threads may both make it, to one value."""
    dispatch = rt.dispatch
    sig = None

    def _slow(*args: Any, **kwargs: Any) -> Any:
        nonlocal sig
        if sig is None:
            import inspect  # NumPy has loaded it

            sig = inspect.signature(original)
        return dispatch(spec, sig, args, kwargs, original, original)

    return _slow


def _make_wrapper(spec: "OpSpec", rt: "Runtime", slow: Callable) -> Callable:
    """The fast path in Python, for a wrapt FunctionWrapper (no C extension, or FUSION_SHIM_NATIVE=0)."""
    from numpy import ndarray

    from ..client import GUARD

    below_floor = rt.ledger.fast_path[spec.name]  # a list cell: counting costs one add
    floor_cell = rt.floor_cell(spec.name)  # this op's floor, kept current by the planner
    getframe = sys._getframe

    def _intercepted(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        # D285: inside an intercepted call, in the shim's own work, or called by a library's own
        # frame: not the program's call, NumPy's function untouched and uncounted
        if getattr(GUARD, "inside", False) or getattr(GUARD, "busy", False) \
                or _library_module(getframe(1).f_globals.get("__name__")):
            return wrapped(*args, **kwargs)
        GUARD.inside = True
        try:
            return _outer(wrapped, args, kwargs)
        finally:
            GUARD.inside = False

    def _outer(wrapped: Callable, args: tuple, kwargs: dict) -> Any:
        if rt.local_only:  # policy local, or shut down: counted, computed here
            below_floor[0] += 1
            return wrapped(*args, **kwargs)
        floor = floor_cell[0]
        if floor:
            nbytes = 0
            for x in args:
                if type(x) is ndarray:
                    nbytes += x.nbytes
                elif type(x) is list or type(x) is tuple:  # multi_dot's arrays, lu_solve's (lu, piv)
                    for y in x:
                        if type(y) is ndarray:
                            nbytes += y.nbytes
            for x in kwargs.values():
                if type(x) is ndarray:
                    nbytes += x.nbytes
            if nbytes < floor:
                below_floor[0] += 1
                return wrapped(*args, **kwargs)
        return slow(*args, **kwargs)

    return _intercepted


def _library_module(name: Any) -> bool:
    """Whether module ``name`` is one of LIBRARIES or below one (as C's library_caller decides)."""
    if type(name) is not str:
        return False
    # a library's own test suite (numpy.linalg.tests) is a program that calls it
    return name.partition(".")[0] in LIBRARIES and ".tests." not in name and not name.endswith(".tests")

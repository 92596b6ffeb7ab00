"""The native loader: ``fusion_shim._native``, built from ``native/_native.c``.

Two uses, both optional and both off with ``FUSION_SHIM_NATIVE=0``:

- **operators**: trampolines in ndarray's ``@`` and ``@=`` slots and behind ``ndarray.dot``. In C,
  a call whose operands are not both exact ndarrays, or whose input bytes are under the published
  floor, goes to NumPy's original at once; the rest come to :func:`operator_callback`'s function,
  which goes through ``Runtime.dispatch`` like a catalog call (rows ``catalog.OPERATORS``) and
  computes locally through NumPy's original C entry (``_native.original``), so NumPy's semantics
  and errors are unchanged. Not installed under policy ``local``.
- **the fast path of wrapped module functions**: :func:`fast_proxy` is a C subclass of wrapt's C
  ``ObjectProxy`` (``wrapt.BaseObjectProxy``: attributes, ``isinstance(np.matmul, np.ufunc)``,
  ``__wrapped__`` all forward) called by vectorcall into its own C object, which does the floor
  check and calls NumPy's function, or the shim's Python path.

The floor is one number in C, published by :func:`publish_floor`: ``-1`` passes everything through
(policy local, or no shim installed), ``0`` sends every exact-ndarray call to the Python path
(policy remote), else the smallest of the planner's per-op floors; each FastCall and each
operator also holds its own op's floor, used where it is above that one. The runtime publishes them
again whenever the planner refreshes a floor.

Re-entrancy (D285): C raises a per-thread depth while the shim's Python path or an intercepted
call's NumPy function runs on that thread, so that the shim's own NumPy work and the calls NumPy
and SciPy make inside an intercepted call are never counted nor decided; a call whose calling
frame belongs to a library (:func:`publish_libraries`) passes through as well. The runtime's
``guard`` covers the shim's own threads (calibration) as before.
"""
from __future__ import annotations

import copyreg
import importlib
import types
import warnings
from typing import TYPE_CHECKING, Any, Callable

from . import wrappers

if TYPE_CHECKING:
    from ..client.runtime import Runtime

INTERFACE = 4  # must equal the extension's INTERFACE (native/_native.c)
_native: Any = None
LOAD_ERROR: str | None = None
_loaded = False
_warned = False


def available() -> bool:
    """Load the extension on first use (it imports NumPy's C API, so never before NumPy is)."""
    global _native, LOAD_ERROR, _loaded
    if not _loaded:
        _loaded = True
        try:
            try:
                # by name: the extension, not the package's Python, is what this module needs
                module = importlib.import_module(__package__.rpartition(".")[0] + "._native")
            except ImportError:  # a source checkout beside an install: the installed copy's
                from .. import _ext

                module = _ext.installed_copy("_native")
                if module is None:
                    raise
            if getattr(module, "INTERFACE", None) != INTERFACE:
                raise ImportError(f"{module.__file__} has interface {getattr(module, 'INTERFACE', None)}, "
                                  f"this package needs {INTERFACE}: reinstall fusion-shim")
            _native = module
        except ImportError as exc:  # not built (no compiler at install) or not loadable here
            LOAD_ERROR = f"the C extension fusion_shim._native is not available ({exc})"
    return _native is not None


def publish_floor(floor_bytes: int) -> None:
    """The floor both C paths compare with: input bytes of exact ndarrays; -1 passes everything."""
    if _native is not None:
        _native.set_floor(int(floor_bytes))


def publish_libraries(names: tuple[str, ...]) -> None:
    """D285: calls from frames of these modules (or modules below them) are the library's, not the program's."""
    if _native is not None:
        _native.set_libraries(tuple(names))


def publish_op_floors(floors: tuple[int, int, int]) -> None:
    """Each operator's own floor (``@``, ``@=``, ``.dot``), where above the published one."""
    if _native is not None:
        _native.set_op_floors(tuple(int(f) for f in floors))


def install_operators(rt: "Runtime") -> tuple[bool, str]:
    """Patch ndarray's ``@``, ``@=`` and ``.dot``; (True, "") or (False, why not)."""
    global _warned
    if not rt.config.native:
        return False, "FUSION_SHIM_NATIVE=0"
    if not available():
        return False, LOAD_ERROR or "no C extension"
    if rt.local_only:
        return False, "policy local"
    _native.set_callback(operator_callback(rt))
    _native.set_op_floors(rt.operator_floors())
    try:
        _native.install()
    except RuntimeError as exc:
        _native.set_callback(None)
        why = f"NumPy's entries are not the expected ones: {exc}"
        if not _warned:  # once per process: the report repeats it for every run
            _warned = True
            warnings.warn(f"fusion_shim: @, @= and .dot are not intercepted: {why}", RuntimeWarning, stacklevel=3)
        return False, why
    names = ("numpy.ndarray.__matmul__", "numpy.ndarray.__imatmul__", "numpy.ndarray.dot")
    rt.add_counters(lambda: dict(zip(names, _native.counts())), _native.reset_counts)
    _native.reset_counts()
    return True, ""


def uninstall_operators() -> None:
    """Put NumPy's entries back exactly; the trampolines then see no callback and pass through."""
    if _native is None:
        return
    publish_floor(-1)
    _native.set_op_floors((0, 0, 0))
    try:
        _native.uninstall()
    except RuntimeError as exc:  # someone patched over us after install: left as found
        warnings.warn(f"fusion_shim: {exc}", RuntimeWarning, stacklevel=3)
    _native.set_callback(None)


def operator_callback(rt: "Runtime") -> Callable[[Any, Any, Any, int], Any]:
    """The function the trampolines call with ``(a, b, out_or_None, kind)``: the runtime's one entry,
    computing here through NumPy's own C entry, so that NumPy's errors reach the program unchanged."""
    from ..catalog import OPERATOR_SIGNATURES, OPERATORS

    original, dispatch = _native.original, rt.dispatch
    # per kind: (row, signature, NumPy's entry, the check: none for `a @= b`, whose input is gone by then)
    table = []
    for kind, (spec, sig) in enumerate(zip(OPERATORS, OPERATOR_SIGNATURES)):
        entry = (lambda x, y, out=None, _kind=kind: original(_kind, x, y, out))
        table.append((spec, sig, entry, None if spec.name.endswith("__imatmul__") else entry))
    table = tuple(table)

    def _operator(a: Any, b: Any, out: Any, kind: int) -> Any:
        spec, sig, entry, check = table[kind]
        return dispatch(spec, sig, (a, b), {} if out is None else {"out": out}, entry, check)

    return _operator


def fast_proxy(original: Any, slow: Callable) -> tuple[Any, Any]:
    """A proxy for ``original`` whose call is the C floor check, then ``slow(*args, **kwargs)``.
    Returns (proxy, the C object, whose ``below`` counts calls kept local by the floor)."""
    fast = _native.FastCall(original, slow)
    proxy = _proxy_class(hasattr(type(original), "__get__"))(original)
    _native.set_call(proxy, fast)  # the proxy's vectorcall goes to it
    return proxy, fast


_CLASSES: dict[bool, type] = {}


def _proxy_class(binds: bool) -> type:
    """Two classes for every row, with and without ``__get__``, where a class per row cost its
    creation at NumPy's import (D116). Each is a C subclass of wrapt's ``ObjectProxy`` whose
    instances are called by vectorcall, straight into their FastCall (``set_call``)."""
    cls = _CLASSES.get(binds)
    if cls is None:
        cls = _native.proxy_type(wrappers.load()[0])  # D117: a Python __call__ costs a tuple and a lookup a call
        cls.__reduce_ex__ = _reduce_ex
        if binds:
            cls.__get__ = _bind  # e.g. np.dot as a class attribute binds, as the original does
        _CLASSES[binds] = cls
    return cls


def _reduce_ex(self: Any, protocol: int) -> Any:
    """Pickled by name, as NumPy pickles the original (``pool.map(np.linalg.inv, ...)`` works):
    ufuncs through NumPy's copyreg entry, functions as a global of their module."""
    original = self.__wrapped__
    reduce = copyreg.dispatch_table.get(type(original))
    return reduce(original) if reduce is not None else original.__qualname__


def _bind(self: Any, instance: Any, owner: Any = None) -> Any:
    return self if instance is None else types.MethodType(self, instance)

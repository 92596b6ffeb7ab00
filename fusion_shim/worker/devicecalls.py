"""A stage process's NumPy calls run on the worker's device in that process (D307): no shim, no
socket, no planner.

:meth:`DeviceCalls.install` wraps every catalog row the worker has a kernel for in a
:class:`Proxy` (wrapt's ``(wrapped, instance, args, kwargs)`` contract, without wrapt: the worker
needs nothing of the client's) and, through the package's C extension, ndarray's ``@``, ``@=`` and
``.dot``. A call the row's rule admits (:func:`fusion_shim.catalog.prepare`) runs
its kernel through the worker's backend and comes back as NumPy returns it (dtype, scalar type,
shape, memory order, ``out=``), as the client assembles a worker's reply. Everything else is
NumPy's own call, made as the program made it, so NumPy's results, warnings and errors are
unchanged: a row's refusal, a kernel's error (:class:`NotReproducible`, a singular matrix), a
result holding inf or nan where NumPy's error state asks to hear of it (D198), and a call made
from NumPy's or SciPy's own frames or from inside an intercepted call (D285). :meth:`uninstall`
puts back exactly what :meth:`install` replaced. Counts of both kinds are kept for the process.
"""
from __future__ import annotations

import collections
import copyreg
import importlib
import inspect
import sys
import threading
import types
from typing import Any, Callable

import numpy as np

from .. import _ext
from ..catalog import CATALOG, OPERATOR_SIGNATURES, OPERATORS, OpSpec, Unsupported, check_names, prepare

TRIGGERS = ("numpy", "scipy.linalg", "scipy.fft")  # the rows' trigger modules, imported at install where present
LIBRARIES = ("numpy", "scipy")  # D285: their own frames' calls are theirs, not the stage's
NATIVE_INTERFACE = 4  # the C extension's INTERFACE (native/_native.c) these calls are written for
HERE_KEYS = 512  # distinct (op, why) counted apart: a reason may name shapes, and the process lives long
_NONFINITE = ("divide", "over", "invalid")
_guard = threading.local()  # ``inside``: this thread is in an intercepted call (its NumPy passes through)


class DeviceCalls:
    """The rows and operators of this process, served by ``backend`` with ``kernels`` (the worker's)."""

    def __init__(self, backend: Any, kernels: dict[str, Callable]):
        self.backend, self.kernels = backend, kernels
        self.served: collections.Counter = collections.Counter()  # op -> calls the device answered
        self.here: collections.Counter = collections.Counter()  # (op, why) -> calls NumPy computed
        self.notes: list[str] = []  # what install could not wrap, and why
        self.patches: list[tuple[Any, str, Any]] = []
        self.native: Any = None  # the C extension, while it holds ndarray's operators
        self.installed = False

    def install(self) -> "DeviceCalls":
        """Wrap the rows and the operators; a second call does nothing."""
        if self.installed:
            return self
        self.installed = True
        for trigger in TRIGGERS:
            try:
                importlib.import_module(trigger)
            except ImportError:  # SciPy absent: its rows stay unwrapped
                continue
            for spec in CATALOG:
                if spec.trigger == trigger and spec.kernel_id in self.kernels:
                    self._wrap(spec)
        self._install_operators()
        return self

    def uninstall(self) -> None:
        """Put back exactly the objects and entries :meth:`install` replaced, in reverse order."""
        if self.native is not None:
            self.native.set_floor(-1)
            self.native.uninstall()
            self.native.set_callback(None)
            self.native = None
        for module, attr, original in reversed(self.patches):
            setattr(module, attr, original)
        self.patches.clear()
        self.installed = False

    def _wrap(self, spec: OpSpec) -> None:
        try:
            module = importlib.import_module(spec.module)
            original = getattr(module, spec.attr)
            check_names(spec, original)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            self.notes.append(f"{spec.name} is not intercepted: {exc}")
            return
        sig: list = []  # made on the first call, as the client's interceptor does (D116)
        getframe = sys._getframe

        def _intercepted(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            if getattr(_guard, "inside", False) or _library(getframe(1).f_globals.get("__name__")):
                return wrapped(*args, **kwargs)
            if not sig:
                sig.append(inspect.signature(wrapped))
            return self.call(spec, sig[0], wrapped, args, kwargs)

        setattr(module, spec.attr, Proxy(original, _intercepted))
        self.patches.append((module, spec.attr, original))

    def _install_operators(self) -> None:
        try:
            native = _ext.load("_native")
        except ImportError as exc:
            self.notes.append(f"@, @= and .dot are not intercepted: no C extension ({exc})")
            return
        if getattr(native, "INTERFACE", None) != NATIVE_INTERFACE:
            self.notes.append(f"@, @= and .dot are not intercepted: the C extension has interface "
                              f"{getattr(native, 'INTERFACE', None)}, not {NATIVE_INTERFACE}")
            return
        original = native.original
        table = []
        for kind, (spec, sig) in enumerate(zip(OPERATORS, OPERATOR_SIGNATURES)):
            served = spec.kernel_id in self.kernels
            table.append((spec, sig, served, lambda x, y, out=None, _kind=kind: original(_kind, x, y, out)))

        def _operator(a: Any, b: Any, out: Any, kind: int) -> Any:  # C has raised its depth (D285)
            spec, sig, served, entry = table[kind]
            kwargs = {} if out is None else {"out": out}
            return self.call(spec, sig, entry, (a, b), kwargs) if served else entry(a, b, **kwargs)

        native.set_callback(_operator)
        native.set_libraries(LIBRARIES)
        native.set_op_floors((0, 0, 0))
        native.set_floor(0)  # every call on exact ndarrays comes here: each admitted one goes to the device
        try:
            native.install()
        except RuntimeError as exc:
            native.set_floor(-1)
            native.set_callback(None)
            self.notes.append(f"@, @= and .dot are not intercepted: NumPy's entries are not the expected ones: {exc}")
            return
        self.native = native

    def call(self, spec: OpSpec, sig: inspect.Signature, original: Callable, args: tuple, kwargs: dict) -> Any:
        """NumPy's value for the call: the device's where it can answer, else ``original``'s."""
        native = self.native
        _guard.inside = True
        if native is not None:
            native.enter()  # the operators inside pass through as well
        try:
            got, why = self._on_device(spec, sig, args, kwargs)
            if why is None:
                self.served[spec.name] += 1
                return got
            key = (spec.name, why)
            self.here[key if key in self.here or len(self.here) < HERE_KEYS else (spec.name, "other")] += 1
            return original(*args, **kwargs)
        finally:
            if native is not None:
                native.leave()
            _guard.inside = False

    def _on_device(self, spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
        """(NumPy's value, None) from the kernel, or (None, why NumPy computes it)."""
        err = np.geterr()
        if err["under"] != "ignore":  # D198: underflow leaves no trace in a kernel's result
            return None, "np.geterr() has under set"
        try:
            prep = prepare(spec, sig, args, kwargs)
        except Unsupported as exc:
            return None, str(exc)
        try:
            sent = [_as_sent(a) for a in prep.arrays]
            arrays, _ = self.backend.run(self.kernels[spec.kernel_id], sent, prep.params, prep.layouts)
        except Exception as exc:  # NotReproducible, or an input the kernel refuses: NumPy says what it says
            return None, f"kernel: {type(exc).__name__}"
        if len(arrays) != len(prep.results) or any(
                a.dtype != dt or a.shape != _travelled(shape, lay)
                for a, (dt, shape), lay in zip(arrays, prep.results, prep.layouts)):
            return None, "kernel results differ from those the rule declared"
        if any(err[k] != "ignore" for k in _NONFINITE) and _nonfinite(arrays):
            return None, "a result holds inf or nan, which NumPy's error state reports"
        return assemble(prep, _unshared(arrays, prep.arrays)), None


class Proxy:
    """Stands for a NumPy function: called, it calls ``wrapper(wrapped, None, args, kwargs)``; every
    attribute, ``isinstance`` (``np.matmul`` stays a ``ufunc``) and pickling by name are the wrapped one's."""

    __slots__ = ("__wrapped__", "_wrapper")

    def __init__(self, wrapped: Any, wrapper: Callable):
        object.__setattr__(self, "__wrapped__", wrapped)
        object.__setattr__(self, "_wrapper", wrapper)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(self.__wrapped__, None, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    def __dir__(self) -> list:
        return dir(self.__wrapped__)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def __get__(self, instance: Any, owner: Any = None) -> Any:  # as a class attribute it binds as the original does
        if instance is None or not hasattr(type(self.__wrapped__), "__get__"):
            return self
        return types.MethodType(self, instance)

    def __reduce_ex__(self, protocol: int) -> Any:  # by name, as NumPy pickles the original
        reduce = copyreg.dispatch_table.get(type(self.__wrapped__))
        return reduce(self.__wrapped__) if reduce is not None else self.__wrapped__.__qualname__

    __class__ = property(lambda self: type(self.__wrapped__))  # type: ignore[assignment]
    __doc__ = property(lambda self: self.__wrapped__.__doc__)  # type: ignore[assignment]
    __module__ = property(lambda self: self.__wrapped__.__module__)  # type: ignore[assignment]


def assemble(prep: Any, arrays: list) -> Any:
    """NumPy's return value from the kernel's arrays, as the client builds it from a worker's reply
    (D199: NumPy's result names its dtype by char, 'q' is not 'l'; an axis-order layout comes back
    transposed to that order)."""
    arrays = [a if a.dtype.char == dt.char else a.view(dt) for a, (dt, _) in zip(arrays, prep.results)]
    return prep.returned(arrays)


def on_device(device: str) -> DeviceCalls:
    """This process's rows and operators served on ``device`` by the worker's torch backend and
    kernels; raises where that device cannot be used here."""
    import torch

    from .backend import TorchBackend
    from .kernels import KERNELS

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device in this process")
    return DeviceCalls(TorchBackend(device, bench_cache=False), KERNELS).install()


def _as_sent(a: np.ndarray) -> np.ndarray:
    """D308: an operand as a worker receives it off the wire (:func:`fusion_shim.protocol.wire.to_wire`):
    native byte order, C- or F-contiguous (torch takes no negative strides)."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return a if a.flags.c_contiguous or a.flags.f_contiguous else np.ascontiguousarray(a)


def _travelled(shape: tuple, layout: Any) -> tuple:
    return tuple(shape[i] for i in layout) if isinstance(layout, list) else tuple(shape)


def _nonfinite(arrays: list) -> bool:
    return any(a.dtype.kind in "fc" and a.size and not np.isfinite(a).all() for a in arrays)


def _unshared(results: list, inputs: list) -> list:
    """D308: a CPU tensor wraps its input's memory; a result that still does is copied, so that it
    never aliases an argument (a worker's reply never did)."""
    return [r.copy(order="K") if any(np.may_share_memory(r, a) for a in inputs) else r for r in results]


def _library(name: Any) -> bool:
    """Whether module ``name`` is one of LIBRARIES or below one; their test suites are programs."""
    if type(name) is not str:
        return False
    return name.partition(".")[0] in LIBRARIES and ".tests." not in name and not name.endswith(".tests")

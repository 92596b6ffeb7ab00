"""The op catalog: one row of data per intercepted function (all of numpy.linalg and
numpy.fft, the product family, and scipy.linalg / scipy.fft when SciPy is imported).

A row (:class:`OpSpec`) says where the function lives, which of its parameters are arrays, which
other parameters its rule understands, which kernel the worker runs, and which module's import
patches it. Its *rule* turns a call into a :class:`Prepared` call or raises :class:`Unsupported`
with the reason the call runs locally (see :mod:`.base`). Adding an op is adding a row, a rule if
no existing one fits, and a kernel on the worker. The rows are a table in :mod:`.rows`; their
rules live by family in :mod:`.products`, :mod:`.linalg`, :mod:`.fft` and :mod:`.scipy`, and
:mod:`.numba` holds those whose kernels are written with numba.cuda (bincount, convolve,
correlate, interp), offered only by a worker that can run them.

Every public function of numpy.linalg and numpy.fft is a row or is listed in
:data:`NOT_OFFLOADED` with the reason it stays local (a test holds the two together). Each row is
checked against the real function's signature when the interceptor wraps it (:func:`check_signature`).
"""
from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

from . import rows
from .rows import OPERATOR_SIGNATURES, OPERATORS
from .spec import OpSpec, Unsupported

if TYPE_CHECKING:
    from .base import Prepared

__all__ = ["BY_NAME", "CATALOG", "NOT_OFFLOADED", "OPERATORS", "OPERATOR_SIGNATURES", "OpSpec", "Prepared",
           "Unsupported", "check_names", "check_signature", "load_rules", "prepare"]

CATALOG: tuple[OpSpec, ...] = rows.PRODUCTS + rows.LINALG + rows.FFT + rows.SCIPY + rows.NUMBA
BY_NAME = {spec.name: spec for spec in CATALOG}

# Public functions of numpy.linalg and numpy.fft that are not rows, and why. (LinAlgError is an
# exception class and ``test`` NumPy's test runner: neither is an array operation.)
NOT_OFFLOADED: dict[str, str] = {
    "numpy.linalg.diagonal": "returns a view of its input: a copy from the worker would not alias it",
    "numpy.linalg.matrix_transpose": "returns a view of its input (a stride change, no arithmetic)",
    "numpy.fft.fftfreq": "builds sample frequencies from a length: no input array, no transform",
    "numpy.fft.rfftfreq": "builds sample frequencies from a length: no input array, no transform",
    "numpy.fft.fftshift": "an index roll (a copy): cheaper here than the bytes it would move",
    "numpy.fft.ifftshift": "an index roll (a copy): cheaper here than the bytes it would move",
}
NOT_ARRAY_FUNCTIONS = frozenset({"numpy.linalg.LinAlgError", "numpy.linalg.test", "numpy.fft.test"})


RULE_MODULES = ("base", "products", "linalg", "fft", "scipy", "numba")


def load_rules() -> None:
    """Import every rule's module now (the call path does, once, timed as its start-up) rather than
    inside the first call of each family."""
    for name in RULE_MODULES:
        importlib.import_module(f"{__name__}.{name}")


def __getattr__(name: str) -> Any:
    if name == "Prepared":  # with the rules, not with the rows (D116)
        from .base import Prepared

        return Prepared
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_signature(spec: OpSpec, func: Callable) -> inspect.Signature:
    """The row must name parameters the real function has; a library that changed them is caught
    at install, and the row is left unwrapped rather than misread."""
    sig = inspect.signature(func)
    names = set(sig.parameters)
    missing = [p for p in spec.args + spec.params if p not in names]
    if missing:
        raise TypeError(f"{spec.name}: catalog parameters {missing} are not in the signature {sig}")
    return sig


def check_names(spec: OpSpec, func: Callable) -> None:
    """:func:`check_signature`'s test at the cost of reading a code object where the function is
    plain Python behind NumPy's dispatcher (D116: inspect's signatures were a ninth of the shim's
    start); its signature is then made on the row's first call above its floor."""
    names = _parameter_names(func)
    if names is None:
        check_signature(spec, func)
        return
    missing = [p for p in spec.args + spec.params if p not in names]
    if missing:
        raise TypeError(f"{spec.name}: catalog parameters {missing} are not in the parameters {sorted(names)}")


def _parameter_names(func: Callable) -> frozenset[str] | None:
    """The parameter names ``inspect.signature(func)`` would give, or None where reading them needs
    inspect (no plain function at the end of the ``__wrapped__`` chain, a ``__signature__``)."""
    while True:
        if getattr(func, "__signature__", None) is not None:
            return None
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    code = getattr(func, "__code__", None)
    if type(func) is not _FUNCTION or code is None:
        return None
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & _VARARGS) + bool(code.co_flags & _VARKW)
    return frozenset(code.co_varnames[:n])


_FUNCTION = type(check_names)
_VARARGS, _VARKW = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


def prepare(spec: OpSpec, sig: inspect.Signature, args: tuple, kwargs: dict) -> Prepared:
    """Bind a call the way Python would and apply the row's rule; Unsupported says why not."""
    try:
        ba = _binder(sig)(args, kwargs)
    except TypeError as exc:
        raise Unsupported(f"arguments do not bind: {exc}") from None
    extra: Any = ba.arguments.get("kwargs") or {}
    unknown = sorted(set(ba.arguments) - set(spec.args) - set(spec.params) - {"kwargs"}) + sorted(
        k for k in extra if k not in spec.keywords)
    if unknown:
        raise Unsupported(f"unsupported keyword {unknown[0]}")
    try:
        return spec.rule(spec, ba)
    except Unsupported:
        raise
    except Exception as exc:  # a rule that trips over an argument it did not foresee: local, and said
        raise Unsupported(f"rule error: {type(exc).__name__}: {exc}"[:300]) from None


class _Bound:
    """What a rule reads of a binding: ``arguments``, the parameters given, by name."""
    __slots__ = ("arguments",)

    def __init__(self, arguments: dict):
        self.arguments = arguments


_BINDERS: dict[int, tuple[inspect.Signature, Callable]] = {}  # id -> (the signature, kept alive; its binder)


def _binder(sig: inspect.Signature) -> Callable[[tuple, dict], Any]:
    """``sig.bind`` for the common call (positional arguments, then keywords by name, every required
    one given) without inspect's general machinery; any other call goes to ``sig.bind`` itself. D340:
    it runs in every call above its floor that repeats no template, where ``sig.bind`` cost 0.9-6.3 us more."""
    entry = _BINDERS.get(id(sig))
    if entry is not None and entry[0] is sig:
        return entry[1]
    params = list(sig.parameters.values())
    P = inspect.Parameter
    positional: list[str] = []
    for p in params:
        if p.kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            break
        positional.append(p.name)
    by_name = frozenset(p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY))
    required = [p.name for p in params if p.default is P.empty
                and p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
    most = len(positional)

    def bind(args: tuple, kwargs: dict) -> Any:
        if len(args) <= most:
            arguments = dict(zip(positional, args))
            for name, value in kwargs.items():
                if name not in by_name or name in arguments:
                    break
                arguments[name] = value
            else:
                if all(name in arguments for name in required):
                    return _Bound(arguments)
        return sig.bind(*args, **kwargs)

    _BINDERS[id(sig)] = (sig, bind)
    return bind

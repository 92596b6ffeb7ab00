"""A catalog row (:class:`OpSpec`) and the reason a call stays local (:class:`Unsupported`).

Loaded when NumPy is (the interceptor wraps every row then); a row names its rule as
``"module.function"`` inside this package, and the rule's module loads on the row's first use
(D116): most rows of most programs never leave the fast path.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


class Unsupported(Exception):
    """The call cannot be offloaded faithfully; the message is the reason the ledger keeps."""


def resolve(ref: str) -> Callable:
    """The function a row names as ``"module.function"`` of this package, its module imported now."""
    where, _, func = ref.rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{where}"), func)


class OpSpec:
    """One row (D36: plain classes with ``__slots__``; a dataclass's generated methods cost their
    exec at every import of the catalog)."""

    __slots__ = ("name", "module", "attr", "family", "rule_ref", "params", "kernel", "args", "trigger", "nested",
                 "keywords", "repeat", "size_params", "result_size", "_rule")

    def __init__(self, name: str, module: str, attr: str, family: str,
                 rule: str | Callable[["OpSpec", Any], Any], params: tuple[str, ...] = (), kernel: str = "",
                 args: tuple[str, ...] = ("a", "b"), trigger: str = "numpy", nested: bool = False,
                 keywords: tuple[str, ...] = (), repeat: bool = False, size_params: tuple[str, ...] = (),
                 result_size: str = ""):
        setter = object.__setattr__
        setter(self, "name", name)        # the public name, e.g. "numpy.linalg.solve"
        setter(self, "module", module)    # where the attribute is patched
        setter(self, "attr", attr)
        setter(self, "family", family)    # "products" | "linalg" | "fft": cost model and report grouping
        setter(self, "rule_ref", rule)    # "linalg.rule_inv" (a module of this package), or the function
        setter(self, "params", params)    # parameters besides the arrays that the rule understands
        setter(self, "kernel", kernel)    # worker kernel id; defaults to name without "numpy."
        setter(self, "args", args)        # the parameters that carry arrays (in the signature's order)
        setter(self, "trigger", trigger)  # the module whose import patches this row ("scipy.linalg", ...)
        # an array parameter holds a list or tuple of arrays (multi_dot's arrays, lu_solve's (lu, piv)):
        # the interceptor's byte floor must look inside it, which only its Python fast path does
        setter(self, "nested", nested)
        setter(self, "keywords", keywords)  # what the rule understands of the function's **kwargs (einsum's dtype=)
        # D45: the rule reads only dtypes, shapes, strides and plain arguments: a call may repeat from a template
        setter(self, "repeat", repeat)
        setter(self, "size_params", size_params)  # D325: the kernel's params that name an output length
        setter(self, "result_size", result_size)  # D61: "sizes.fn", a floor on its results' elements; "" bounded
        setter(self, "_rule", None if isinstance(rule, str) else rule)

    @property
    def rule(self) -> Callable[["OpSpec", Any], Any]:
        """The rule: a bound call to a ``Prepared`` call, or ``Unsupported`` (see :mod:`.base`)."""
        rule = self._rule
        if rule is None:
            rule = resolve(self.rule_ref)
            object.__setattr__(self, "_rule", rule)
        return rule

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"OpSpec is frozen: cannot assign {name!r}")

    def _key(self) -> tuple:
        return tuple(getattr(self, n) for n in OpSpec.__slots__[:-1])

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if type(other) is OpSpec else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"OpSpec({self.name!r}, family={self.family!r}, trigger={self.trigger!r})"

    @property
    def kernel_id(self) -> str:
        return self.kernel or self.name.removeprefix("numpy.")

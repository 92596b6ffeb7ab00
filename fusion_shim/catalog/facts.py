"""What the worker reads of the rows, by kernel id (D325): a request names its kernel, not its row.

The rows of one kernel (``numpy.matmul``, ``a @ b``, ``numpy.linalg.matmul``) must say the same of
it: which of its params name an output length (``size_params``) and how many elements its results
have at least (``result_size``, :mod:`.sizes`, D61). :func:`by_kernel` builds the table once, and
refuses rows that disagree (a test builds it).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from . import CATALOG, OPERATORS
from .spec import resolve


class KernelFacts(NamedTuple):
    size_params: tuple[str, ...]                # params as sent that name an output length
    result_size: Callable[[list, dict], int | None] | None  # None: its results are bounded by its inputs


_TABLE: dict[str, KernelFacts] = {}
_NONE = KernelFacts((), None)


def by_kernel() -> dict[str, KernelFacts]:
    """Each kernel id of the catalog's rows and what its rows say of it."""
    if not _TABLE:
        table: dict[str, tuple] = {}
        for spec in (*CATALOG, *OPERATORS):
            said = (spec.size_params, spec.result_size)
            if table.setdefault(spec.kernel_id, said) != said:
                raise ValueError(f"{spec.name} says {said} of kernel {spec.kernel_id}; "
                                 f"another of its rows {table[spec.kernel_id]}")
        _TABLE.update({k: KernelFacts(p, resolve(r) if r else None) for k, (p, r) in table.items()})
    return _TABLE


def facts(op: str) -> KernelFacts:
    """What the rows say of kernel ``op``; nothing for a kernel no row names."""
    return by_kernel().get(op, _NONE)


def result_elements(op: str, shapes: list, params: dict) -> int | None:
    """The elements ``op``'s results will have in all, at least; None where it has no ``result_size``
    (its results are bounded by its inputs) or NumPy would refuse the shapes."""
    rule = facts(op).result_size
    if rule is None:
        return None
    try:
        return rule([tuple(int(d) for d in shape) for shape in shapes], params)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None  # a malformed parameter: the kernel's own checks answer it


"""A call's results checked against what it declares, before anything is computed (D61): the
worker refuses a call that would make more than it declared. What a kernel makes is the catalog's
fact (:mod:`fusion_shim.catalog.facts`, D325): its rows' ``result_size`` and ``size_params``.
"""
from __future__ import annotations

import math
from typing import Any

from ..catalog.facts import facts, result_elements


def over_declared(op: str, arrays: list, params: dict, declared: Any) -> str | None:
    """Why a call may not run: its results would have more elements than it declared (nothing is
    computed for an op whose results are bounded by its inputs)."""
    if facts(op).result_size is None:
        return None
    shapes = [a.shape for a in arrays]
    n = result_elements(op, shapes, params)
    said = sum(math.prod(shape) for _, shape in declared)
    if n is not None and n > said:
        return f"{op} of shapes {[list(s) for s in shapes]} makes {n} result elements; the call declared {said}"
    return None


def size_params_over(op: str, params: dict, declared: list) -> str | None:
    """An output length (an FFT's size) larger than the results the call declares would allocate
    past the budget (rfft gives n // 2 + 1)."""
    limit = 2 * max((d for _, shape in declared for d in shape), default=0) + 2
    for name in facts(op).size_params:
        value = params.get(name)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or abs(v) > limit:
                return f"{name}={value!r} does not fit the declared results (each size at most {limit})"
    return None

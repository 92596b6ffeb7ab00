"""A remote call that repeats an earlier one's layout, sent from what that call made (D45).

A program's small remote calls mostly repeat: the same op at the same line, on arrays of the same
dtypes, shapes and strides, with the same other arguments. For a row whose rule reads only that of
its arguments (its row's ``repeat``), such a call binds to the same :class:`Prepared` but for its
arrays, and encodes to the same header but for its id. A :class:`Template` keeps both from the
first call that went to a worker by value (no out=, no finish, every input an argument as given),
keyed by :func:`layout_key`; the next call with that key skips the binding, the rule, the planner's
``Call`` and the header's encoding. Its reply is read from the template's skeleton of the first
one where it repeats that one's bytes (D48), else decoded and checked in full, as any call's. A
call that the shared-memory lane carries is prepared from its template too, and its header encoded
in full (the lane names its segments there).

Under policy remote the decision is the template's for ``REPRICE_EVERY`` calls (the planner only
prices it for the report there, D45); under auto every call is decided afresh.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import plan
from ..catalog import OpSpec, Prepared
from ..protocol import messages, wire
from ..protocol.forms import RequestForm
from ..protocol.skeleton import Skeleton

REPRICE_EVERY = 16   # D45: calls a remote-policy template's decision is reused for
TEMPLATES_MAX = 64   # layouts remembered, the first ones kept
NEVER = "never"      # what make returns for a layout no call of which can be sent from a template
_SCALARS = (int, bool, str, type(None))
_ndarray = np.ndarray


def repeatable(spec: OpSpec) -> bool:
    """D45: the catalog's fact (a test checks each such row against arrays of the same layout and other values)."""
    return spec.repeat


def layout_key(args: tuple, kwargs: dict) -> tuple | None:
    """What a products rule reads of a call: each array's dtype, shape and strides, every other
    argument's type and value; None where an argument is anything else (a float, a list, a
    subclass of ndarray), which is never repeated."""
    key: list = []
    for x in args:
        t = type(x)
        if t is _ndarray:
            key.append((x.dtype, x.dtype.char, x.shape, x.strides))  # D199: 'q' == 'l', yet NumPy keeps each
        elif t in _SCALARS or (t is tuple and all(type(y) in _SCALARS for y in x)):
            key.append((t, x))
        else:
            return None
    if kwargs:
        for name, x in kwargs.items():
            t = type(x)
            if t is _ndarray:
                key.append((name, x.dtype, x.dtype.char, x.shape, x.strides))
            elif t in _SCALARS or (t is tuple and all(type(y) in _SCALARS for y in x)):
                key.append((name, t, x))
            else:
                return None
    return tuple(key)


class Encoded(NamedTuple):
    """A request already encoded, for :meth:`transport.Channel.request`; its reply read from ``skeleton``."""
    id: int
    encoded: list
    skeleton: Skeleton | None = None
    by_socket = True  # D45: a small call's frames as they are, as the lane would send them

    def frames(self) -> list:
        return self.encoded


class Template:
    """What one call made that the calls repeating its layout reuse."""

    __slots__ = (
        "c_order",
        "call",
        "dtypes",
        "form",
        "largest",
        "leading",
        "op_key",
        "planned",
        "prep",
        "reply",
        "rest",
        "shapes",
        "uses",
        "where",
    )

    def __init__(self, prep: Prepared, where: list, call: plan.Call, shapes: list, dtypes: list,
                 form: RequestForm):
        # Prepared's fields after its arrays, as every call from the template has them (no out=, no finish)
        self.rest = (prep.params, prep.results, prep.layouts, prep.flops, None, prep.scalar_0d, prep.scalar_out,
                     prep.returns, None)
        self.prep = Prepared(prep.spec, [], *self.rest)  # not the first call's arrays: kept alive else
        self.where = where        # per input: its index among the positional arguments, or its keyword
        # D351: inputs that are the leading positional arguments (np.dot(a, b)): their count, taken as a slice
        self.leading = len(where) if where == list(range(len(where))) else None
        self.call = call
        self.shapes, self.dtypes = shapes, dtypes
        self.form = form          # the header, its id last, and its bytes up to the id's value
        self.largest = max([a.nbytes for a in prep.arrays] + [math.prod(s) * d.itemsize for d, s in prep.results])
        self.op_key = (prep.spec.kernel_id, tuple(dtypes))  # what a crash pins (Checks.pinned_reason)
        self.planned: Any = None  # call.Planned, under policy remote: reused for REPRICE_EVERY calls
        self.uses = 0
        self.reply = Skeleton()   # its replies' header, learnt from the first (D48)
        # whether every input is C-ordered: its dtype, shape and strides, in the key, tell
        self.c_order = all(a.flags.c_contiguous for a in prep.arrays)

    def prepared(self, args: tuple, kwargs: dict) -> Prepared:
        """This call's :class:`Prepared`: the template's, with this call's arrays."""
        n = self.leading
        arrays = list(args[:n]) if n is not None else [args[w] if w.__class__ is int else kwargs[w] for w in self.where]
        return Prepared(self.prep.spec, arrays, *self.rest)

    def request(self, rid: int, prep: Prepared, drops: list) -> Encoded:
        """The call's frames: the header with ``rid`` (and the segments to drop), its inputs' bytes."""
        bufs = prep.arrays if self.c_order else [a if a.flags.c_contiguous else wire.to_wire(a)[1]
                                                  for a in prep.arrays]
        if drops:
            header = self.form.encode_with(rid, shm_drop=drops)
        else:
            header = self.form.encode(rid)
        return Encoded(rid, [header, *bufs], self.reply)


def make(prep: Prepared, args: tuple, kwargs: dict, call: plan.Call, shapes: list,
         dtypes: list) -> Template | str | None:
    """A template of a call that went by value, where every input is one of its arguments as given;
    None where only this call's arguments stand in the way (one array passed twice), :data:`NEVER`
    where its layout does (the rule reads only that: every call with its key would fail the same)."""
    if prep.out is not None or prep.finish is not None or not repeatable(prep.spec):
        return NEVER
    where: list = []
    for a in prep.arrays:
        at = [i for i, x in enumerate(args) if x is a] + [k for k, x in kwargs.items() if x is a]
        if len(at) > 1:
            return None  # aliased here; another call with this layout may not be
        if not at or not (a.flags.c_contiguous or a.flags.f_contiguous) or not a.dtype.isnative:
            return NEVER  # an input made by the rule, or copied on its way to the wire
        where.append(at[0])
    header = {"v": wire.VERSION, "t": "call", "op": prep.spec.kernel_id, "params": prep.params,
              "layouts": prep.layouts,
              "results": messages.call_header(0, "", {}, prep.layouts, prep.results)["results"],
              "arrays": [wire.to_wire(a)[0] for a in prep.arrays], "id": 0}
    form = RequestForm.of(header)
    return NEVER if form is None else Template(prep, where, call, shapes, dtypes, form)

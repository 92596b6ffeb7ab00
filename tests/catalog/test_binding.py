"""The catalog's fast binding reads a call exactly as ``inspect.Signature.bind`` does: the same
parameters by name for every call it takes, and every other call (too many positionals, a name
given twice, an unknown keyword, a required one missing, ``*args``/``**kwargs`` signatures) handed
to ``bind`` itself, with its TypeError."""
from __future__ import annotations

import importlib
import inspect
import itertools

import pytest

from fusion_shim.catalog import CATALOG, OPERATOR_SIGNATURES, _binder


def _signatures() -> list:
    sigs = []
    for spec in CATALOG:
        try:
            func = getattr(importlib.import_module(spec.module), spec.attr)
            sigs.append(pytest.param(inspect.signature(func), id=spec.name))
        except (ImportError, AttributeError, ValueError):
            continue  # scipy or numba absent, or a NumPy without the row's function
    sigs += [pytest.param(sig, id=f"operator-{i}") for i, sig in enumerate(OPERATOR_SIGNATURES)]
    return sigs


def _outcome(fn, *a, **k):
    try:
        return dict(fn(*a, **k).arguments)
    except TypeError:
        return TypeError


@pytest.mark.parametrize("sig", _signatures())
def test_fast_binding_matches_inspect(sig):
    bind = _binder(sig)
    names = list(sig.parameters) + ["not_a_parameter"]
    checked = 0
    for npos in range(len(sig.parameters) + 2):
        args = tuple(object() for _ in range(npos))
        for nkw in range(3):
            for keys in itertools.combinations(names, nkw):
                kwargs = {k: object() for k in keys}
                assert _outcome(bind, args, kwargs) == _outcome(sig.bind, *args, **kwargs), (args, kwargs)
                checked += 1
    assert checked > 0

"""Sampled verification (issue 7) knows every catalog row (issue 4): with every worker answer also
computed by the library and compared (``verify=1.0``), no generated call of any row is reported as
a mismatch: decompositions are compared by their invariants (eig's spectrum and A V = V diag(w),
qr's R^H R in mode "r" and LAPACK's factors in mode "raw", lu_factor's P L U = A), determinants
against Hadamard's bound, condition numbers with their own sensitivity, unordered eigenvalues as sets.
"""
from __future__ import annotations

import pytest

import fusion_shim
from tests.helpers.shims import shim_fixture
from tests.catalog.test_hypothesis import RECORDS, STRATEGIES, run_row

EXAMPLES = 8


shim = shim_fixture(scope="module", verify=1.0)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_checked_answer_matches(shim, name):
    RECORDS.clear()
    shim.checks.pinned.clear()
    run_row(shim, name, EXAMPLES)
    checked = [r for r in RECORDS if r.kind == "worker" and r.verify]
    mismatches = [(r.verify, r.shapes, r.dtypes) for r in RECORDS if (r.verify or "").startswith("mismatch")]
    assert not mismatches, mismatches
    assert checked or all(r.kind != "worker" for r in RECORDS), "nothing was checked"

"""The facts of an op live in its catalog row (D325): whether a call may repeat from a template,
which params name an output length, how many result elements it makes. Its users read the row; no
module outside the catalog keeps a table of op names or kernel ids to decide them, and each row's
facts agree with what its rule sends and makes."""
from __future__ import annotations

import ast
import importlib
import inspect
import math
import pathlib

import numpy as np
import pytest

import fusion_shim
from fusion_shim.catalog import CATALOG, OPERATORS, Unsupported, prepare
from fusion_shim.catalog.facts import by_kernel, facts, result_elements
from tests.catalog.test_differential import CASES, Maker

ROWS = (*CATALOG, *OPERATORS)
PACKAGE = pathlib.Path(fusion_shim.__file__).parent

# Modules that still name ops or kernel ids in a table, and why that is theirs, not a row's (D326).
NAMING_OPS = {
    "worker/kernels/fft.py": "the worker's registry: what runs for each kernel id",
    "worker/kernels/linalg.py": "the worker's registry: what runs for each kernel id",
    "worker/kernels/products.py": "the worker's registry: what runs for each kernel id",
    "worker/kernels/scipy_linalg.py": "the worker's registry: what runs for each kernel id",
    "worker/numba_kernels.py": "the worker's registry: what runs for each kernel id",
    "worker/bench.py": "the self-benchmark's choice of decompositions to time",
    "replay/hardware.py": "a replay's representative ops per family",
    "plan/model.py": "the cost model's representative ops and shared kernels (measured, per op)",
    "plan/policy.py": "the floor's cost shapes of measured ops",
    "plan/cpuwins.py": "a 'numpy.' prefix cut off for names",
    "plan/planner.py": "a 'numpy.' prefix cut off for names",
    "reporting/__init__.py": "a 'numpy.' prefix cut off for names",
    "reporting/layout.py": "a 'numpy.' prefix cut off for names",
    "client/runtime.py": "the operators' 'numpy.ndarray.' prefix: their floors are the trampolines'",
    "intercept/native.py": "the trampolines' three operator rows, by name, in their kind's order",
}


def _names_ops(value: str, in_table: bool) -> bool:
    """A row's name or kernel id in a table, or a prefix of one (or of a rule's module) anywhere."""
    names = {s.name for s in ROWS} | {s.kernel_id for s in ROWS}
    refs = {s.rule_ref for s in ROWS} | {s.result_size for s in ROWS if s.result_size}
    if value.endswith(".") and len(value) > 1 and any(x.startswith(value) for x in names | refs):
        return True
    return in_table and value in names


def op_tables(root: pathlib.Path) -> list[str]:
    """``path:line: value`` of every op-naming string outside ``root``'s catalog."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("catalog/"):
            continue
        tree = ast.parse(path.read_text())
        in_table = {id(e) for node in ast.walk(tree) if isinstance(node, (ast.Set, ast.List, ast.Tuple, ast.Dict))
                    for e in (node.keys if isinstance(node, ast.Dict) else node.elts) if e is not None}
        found += [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and _names_ops(node.value, id(node) in in_table)]
    return found


def test_no_module_outside_the_catalog_keeps_a_table_of_ops_but_those_listed_with_why():
    stray = [f for f in op_tables(PACKAGE) if f.split(":")[0] not in NAMING_OPS]
    assert stray == [], "move these facts into the catalog's rows (or list the module in NAMING_OPS with why)"
    assert set(NAMING_OPS) <= {f.split(":")[0] for f in op_tables(PACKAGE)}, "a listed module no longer names ops"


def test_the_rows_of_one_kernel_say_the_same_of_it():
    table = by_kernel()
    assert set(table) == {s.kernel_id for s in ROWS}
    assert facts("fft.fft1").size_params == ("n",) and facts("fft.fftn").size_params == ("s",)
    assert facts("no.such.kernel").result_size is None and facts("no.such.kernel").size_params == ()


def test_only_products_rules_repeat_from_a_template():
    # D45: a products rule reads only the layout key; numba's rows are of the products family, not its rules
    assert {s.name for s in ROWS if s.repeat} == {s.name for s in ROWS if s.rule_ref.startswith("products.")}


def _prepared_cases():
    for case in CASES:
        spec = next(s for s in CATALOG if s.name == case.op)
        try:
            func = getattr(importlib.import_module(spec.module), spec.attr)
        except (ImportError, AttributeError):
            continue
        a, k = case.build(Maker(case.dtypes[0], "C"))
        try:
            yield case, spec, prepare(spec, inspect.signature(func), a, k)
        except Unsupported:
            continue


@pytest.fixture(scope="module")
def prepared():
    return list(_prepared_cases())


def test_each_rows_size_params_are_params_its_rule_sends(prepared):
    seen = set()
    for case, spec, prep in prepared:
        assert set(spec.size_params) <= set(prep.params), (case.op, case.id, spec.size_params, sorted(prep.params))
        seen.add(spec.name)
    assert {s.name for s in CATALOG if s.size_params} & seen, "no case of a row with size_params"


def test_each_rows_result_size_is_at_most_what_it_makes_and_a_row_without_one_makes_no_more_than_it_gets(
        prepared):
    # D61: the worker refuses a call whose count is over its declaration, so an honest call's never is;
    # a row without a count is admitted unchecked, which holds only while its results are of its inputs' size
    # (eigh's n * n + n: at most twice), not their product (kron's: 4x here)
    for case, spec, prep in prepared:
        made = sum(math.prod(shape) for _, shape in prep.results)
        shapes = [np.shape(a) for a in prep.arrays]
        if spec.result_size:
            n = result_elements(spec.kernel_id, shapes, prep.params)
            assert n is None or n <= made, (case.op, case.id, n, made)
        elif not spec.size_params:
            assert made <= 2 * max(sum(math.prod(s) for s in shapes), 1), (case.op, case.id, shapes, prep.results)

"""Marking stages without changing the program: ``MODULE:QUALNAME`` wraps that function right after
its module is imported (:func:`fusion_shim._hooks.when_imported`), or at once where it already is;
the main script's own functions (``__main__:f``, or the script's name) are wrapped by a decorator
added to their definitions in its syntax tree before it runs, as pytest rewrites asserts.
"""
from __future__ import annotations

import ast
import os
from typing import Any, Callable

from .. import _hooks
from .wrapper import Stage

MAIN_NAME = "__fusion_shim_stage__"  # the decorator's name in the main script's globals


def split(specs: tuple[str, ...]) -> list[tuple[str, str]]:
    """``MODULE:QUALNAME`` specs as (module, qualname) pairs (config checked their form)."""
    return [tuple(s.split(":", 1)) for s in specs]  # type: ignore[misc]


class Marks:
    """The post-import hooks of one installation, and their undo."""

    def __init__(self, specs: tuple[str, ...], event: Callable[[str], None] | None = None):
        self.event = event or (lambda text: None)
        self.hooks: list[tuple[str, Callable]] = []
        self.wrapped: list[tuple[Any, str, Any]] = []
        for module, qualname in split(specs):
            if module == "__main__":
                continue
            hook = self._hook(qualname)
            self.hooks.append((module, hook))
            _hooks.when_imported(module, hook)

    def _hook(self, qualname: str) -> Callable:
        def wrap(module: Any) -> None:
            owner, name = _owner(module, qualname)
            target = getattr(owner, name, None) if owner is not None else None
            if target is None or not callable(target):
                self.event(f"stage {module.__name__}:{qualname} not found in its module: not a stage")
                return
            if not isinstance(target, Stage):
                self.wrapped.append((owner, name, target))
                setattr(owner, name, Stage(target))
        return wrap

    def undo(self) -> None:
        for module, hook in self.hooks:
            _hooks.forget(module, hook)
        for owner, name, original in reversed(self.wrapped):
            setattr(owner, name, original)
        self.hooks, self.wrapped = [], []


def _owner(module: Any, qualname: str) -> tuple[Any, str]:
    parts = qualname.split(".")
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, parts[-1]
    return owner, parts[-1]


def main_qualnames(specs: tuple[str, ...], script: str | None, module: str | None = None) -> set[str]:
    """The qualnames marked in the main script or ``-m`` module: under ``__main__``, the script's
    name, or the module's."""
    names = {"__main__", os.path.splitext(os.path.basename(script))[0] if script else None, module}
    return {q for m, q in split(specs) if m in names}


def compile_main(source: bytes, filename: str, qualnames: set[str]) -> Any:
    """The main script compiled with :data:`MAIN_NAME` as the outermost decorator of each function
    whose qualname is marked; its line numbers stay the source's."""
    tree = ast.parse(source, filename)
    _Marker(qualnames).visit(tree)
    return compile(tree, filename, "exec", dont_inherit=True)


class _Marker(ast.NodeVisitor):
    def __init__(self, qualnames: set[str]):
        self.qualnames, self.prefix = qualnames, []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.prefix.append(node.name)
        self.generic_visit(node)
        self.prefix.pop()

    def _function(self, node: Any) -> None:
        if ".".join([*self.prefix, node.name]) in self.qualnames:
            node.decorator_list.insert(0, ast.copy_location(ast.Name(MAIN_NAME, ast.Load()), node))
        # functions inside functions have <locals> qualnames: not marked by name

    visit_FunctionDef = visit_AsyncFunctionDef = _function


def main_globals() -> dict[str, Any]:
    """What the rewritten main script needs in its globals."""
    return {MAIN_NAME: Stage}

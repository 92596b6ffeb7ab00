"""A stage's code and objects as bytes, alike on both sides (docs/stages.md): loaded only where
stages are in use, the one module of the package that imports cloudpickle besides the stage child.

Objects are pickled with cloudpickle; each ndarray of a dtype the wire carries is left out of the
pickle as a *persistent id*, an index into a list of arrays that travel as raw frames (so a matrix
crosses once, by reference when the worker holds it). One array object met twice is one index:
aliasing inside the arguments survives the trip. A function is sent by reference (module, qualname,
hash of its source and of the modules of the program's tree its module imports, D342) or by value
(cloudpickle, its module and those registered to pickle by value).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import io
import os
import pickle
import site
import sys
import sysconfig
from typing import Any, Callable

import cloudpickle
import numpy as np

from .wire import DTYPES

BY_VALUE_NAMES = ("__main__", "__mp_main__")
MAX_IMPORTS = 256  # modules of the program's tree one reference may name; past it, by value
STAGE_TRACEBACK = "_fusion_shim_stage_traceback"  # D216: the attribute a stage's exception carries its frames in


def versions() -> dict[str, str]:
    """What must match between the two sides for a pickle made on one to load on the other."""
    return {"python": ".".join(map(str, sys.version_info[:3])), "cloudpickle": cloudpickle.__version__,
            "numpy": np.__version__}


def _travels(obj: Any) -> bool:
    return type(obj) is np.ndarray and obj.dtype.str in DTYPES


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, file: Any, arrays: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays
        self.index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if not _travels(obj):
            return None
        at = self.index.get(id(obj))
        if at is None:
            at = self.index[id(obj)] = len(self.arrays)
            self.arrays.append(obj)
        return at


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, arrays: list):
        super().__init__(file)
        self.arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, int) or not 0 <= pid < len(self.arrays):
            raise pickle.UnpicklingError(f"array {pid!r} is not among the {len(self.arrays)} that came")
        return self.arrays[pid]


# D174: what an answer from a worker may name: containers, NumPy's values, exceptions, and classes
# the program itself defines; never a function, nor a class another module imported
ANSWER_GLOBALS = frozenset(
    [("builtins", n) for n in ("complex", "range", "slice", "bytearray", "bytes", "set", "frozenset", "tuple",
                               "list", "dict", "object", "str", "int", "float", "bool")]
    + [("collections", n) for n in ("OrderedDict", "deque", "defaultdict", "Counter")]
    + [(m, n) for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n in ("_reconstruct", "scalar")]
    + [(m, "_frombuffer") for m in ("numpy._core.numeric", "numpy.core.numeric")]
    + [("numpy", "dtype"), ("numpy", "ndarray")])


class _AnswerUnpickler(_Unpickler):
    def __init__(self, file: Any, arrays: list, modules: frozenset):
        super().__init__(file, arrays)
        self.modules = modules

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ANSWER_GLOBALS:
            return super().find_class(module, name)
        owner = sys.modules.get(module)  # never imported on a worker's word
        obj = getattr(owner, name, None) if owner is not None and "." not in name else None
        if isinstance(obj, type) and obj.__module__ == module and (
                issubclass(obj, BaseException) or module in self.modules):
            return obj
        raise pickle.UnpicklingError(f"a worker's answer may not name {module}.{name}")


def dumps(obj: Any) -> tuple[bytes, list[np.ndarray]]:
    """``obj`` pickled, and the arrays left out of it, in the order of their ids."""
    buf, arrays = io.BytesIO(), []
    _Pickler(buf, arrays).dump(obj)
    return buf.getvalue(), arrays


def loads(data: Any, arrays: list) -> Any:
    """The object :func:`dumps` made, its arrays taken from ``arrays``."""
    return _Unpickler(io.BytesIO(memoryview(data).cast("B")), arrays).load()


def loads_answer(data: Any, arrays: list, modules: frozenset) -> Any:
    """A worker's answer, loaded as :func:`loads` does but naming only :data:`ANSWER_GLOBALS`,
    exception classes, and classes defined in ``modules`` (the stage's own): D174."""
    return _AnswerUnpickler(io.BytesIO(memoryview(data).cast("B")), arrays, modules).load()


def by_value(fn: Callable) -> Any:
    """What pickles ``fn`` with its code, and the code of the modules of the program's tree it
    imports (D342), even when its module could be imported by name."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None:
        return fn
    modules = [sys.modules[n] for n in tree_imports(fn)]
    modules += [] if module.__name__ in BY_VALUE_NAMES else [module]
    return _ByValue(fn, modules) if modules else fn


class _ByValue:
    """A function whose modules are registered to pickle by value while it is pickled."""

    def __init__(self, fn: Callable, modules: list):
        self.fn, self.modules = fn, modules

    def __reduce__(self) -> Any:
        before = set(cloudpickle.list_registry_pickle_by_value())
        registered = []
        try:
            for module in self.modules:
                if module.__name__ not in before:
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
            return pickle.loads, (cloudpickle.dumps(self.fn, protocol=pickle.HIGHEST_PROTOCOL),)
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives (the standard library, site-packages, this package): not the program's."""
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [*getattr(site, "getsitepackages", list)(), site.getusersitepackages(),
             os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


@functools.lru_cache(maxsize=4096)
def _of_tree(path: str) -> bool:
    return path.endswith(".py") and not os.path.realpath(path).startswith(_library_dirs())


def _tree_module(name: str) -> Any:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return module if isinstance(path, str) and _of_tree(path) else None


def _code_names(co: Any, out: set) -> None:
    out.update(co.co_names)  # a function's own imports name their modules here
    for const in co.co_consts:
        if inspect.iscode(const):
            _code_names(const, out)


def tree_imports(fn: Callable) -> list[str]:
    """D342: the modules of the program's tree (not the standard library, site-packages nor this
    package) that ``fn``'s module reaches through its globals and its functions' imports, in turn."""
    start = getattr(fn, "__module__", None)
    names: set = set()
    if getattr(fn, "__code__", None) is not None:
        _code_names(fn.__code__, names)
    todo, seen = [sys.modules.get(start or "")], {start}
    while todo:
        module = todo.pop()
        for value in list(vars(module).values()) if module is not None else ():
            if inspect.ismodule(value):
                names.add(value.__name__)
            elif inspect.isfunction(value) or inspect.isclass(value):
                names.add(getattr(value, "__module__", None))
                if inspect.isfunction(value) and value.__module__ == module.__name__:
                    _code_names(value.__code__, names)
        for name in [n for n in names if isinstance(n, str) and n not in seen]:
            seen.add(name)
            dep = _tree_module(name)
            if dep is not None:
                todo.append(dep)
    return sorted(n for n in seen - {start, *BY_VALUE_NAMES} if _tree_module(n) is not None)


def _code_parts(co: Any, out: list) -> None:
    out += [co.co_code, repr((co.co_names, co.co_varnames, co.co_freevars, co.co_cellvars, co.co_firstlineno))]
    for const in co.co_consts:
        if inspect.iscode(const):
            _code_parts(const, out)
        elif isinstance(const, frozenset):
            out.append(repr(sorted(map(repr, const))))
        else:
            out.append(f"{type(const).__name__}:{const!r}")


def source_hash(fn: Callable) -> str | None:
    """The hash of a function's source as its file holds it now and of the code it was compiled to
    (D190: a module edited after its import is not the code this process runs); None where it has
    no source (a lambda typed at a prompt)."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    parts = [text]
    code_obj = getattr(fn, "__code__", None)
    if code_obj is not None:
        _code_parts(code_obj, parts)
    return _digest(parts)


_MODULE_HASHES: dict[tuple, str | None] = {}  # (name, id, file's mtime and size) -> its hash: a stage call's cost


def _module_hash(module: Any) -> str | None:
    """A module's source as its file holds it now and the code of the functions it defines (D190)."""
    try:
        stat = os.stat(module.__file__)
    except (OSError, TypeError, AttributeError):
        return None
    key = (module.__name__, id(module), stat.st_mtime_ns, stat.st_size)
    if key in _MODULE_HASHES:
        return _MODULE_HASHES[key]
    try:
        parts: list = [inspect.getsource(module)]
    except (OSError, TypeError):
        return None
    for name, value in sorted(vars(module).items(), key=lambda kv: kv[0]):
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            parts.append(name)
            _code_parts(value.__code__, parts)
    if len(_MODULE_HASHES) >= 4096:
        _MODULE_HASHES.clear()
    _MODULE_HASHES[key] = _digest(parts)
    return _MODULE_HASHES[key]


def _digest(parts: list) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def identity(fn: Callable, imports: list[str]) -> str | None:
    """D342: the hash of ``fn``'s source and code and of the modules ``imports`` names, as this
    process holds them; None where one has no source."""
    own = source_hash(fn)
    if own is None or not imports:
        return own
    parts = [own]
    for name in imports:
        module = sys.modules.get(name)
        parts += [name, _module_hash(module) if module is not None else None]
    return None if None in parts else _digest(parts)


def by_reference(fn: Callable) -> dict | None:
    """The reference a worker can import ``fn`` by, or None where it must go by value."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module in BY_VALUE_NAMES or "<" in qualname:
        return None
    imports = tree_imports(fn)
    digest = identity(fn, imports) if len(imports) <= MAX_IMPORTS else None
    return None if digest is None else {"module": module, "qualname": qualname, "hash": digest, "imports": imports}


def resolve(ref: dict) -> tuple[Callable | None, str]:
    """The function a reference names, imported here with the modules it names, or None and why it
    cannot be used."""
    module, qualname, digest = ref.get("module"), ref.get("qualname"), ref.get("hash")
    imports = ref.get("imports", [])
    if not all(isinstance(v, str) for v in (module, qualname, digest)):
        return None, "a reference needs module, qualname and hash as strings"
    if not (isinstance(imports, list) and len(imports) <= MAX_IMPORTS and all(isinstance(n, str) for n in imports)):
        return None, f"a reference's imports are at most {MAX_IMPORTS} module names"
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        for name in imports:
            importlib.import_module(name)
    except Exception as exc:  # any import error of the user's module: it goes by value instead
        return None, f"{module}:{qualname} does not import here ({type(exc).__name__}: {exc})"[:300]
    obj = getattr(obj, "__wrapped__", obj)
    if identity(obj, imports) != digest:
        return None, f"{module}:{qualname} or a module it imports has another source here"
    return obj, ""

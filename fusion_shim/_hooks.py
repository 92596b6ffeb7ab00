"""Post-import hooks: ``when_imported(name, hook)`` runs ``hook(module)`` right after ``name`` is
imported, or at once if it already is. Imports only what the interpreter has loaded at start: the
``.pth`` bootstrap (``fusion_shim._start``) loads it when NumPy's import begins and registers its
hook on ``numpy`` with it, so that a process that never imports NumPy loads the package's
``__init__`` alone (D111, D121).

One finder sits first on ``sys.meta_path`` while a hook is pending. For a hooked name it asks the
finders after it for the module's spec and wraps only the spec's loader: the module and its spec
get their own loader back before the module runs, so nothing after the import sees the wrapper.
A hook that raises is reported on stderr and dropped; the import itself never fails for it.
``forget`` removes a pending hook; the finder leaves ``sys.meta_path`` when none is left.

Also the shim's start-up clock, :data:`SPENT`: seconds spent before a runtime existed to record
them (the bootstrap, the launcher), read by the runtime into its ledger.
"""
import sys

SPENT = {}  # phase -> seconds the shim spent on it before its runtime existed
_pending = {}  # module name -> hooks waiting for its import, in registration order


def when_imported(name, hook):
    """``hook(module)`` once ``name`` is imported: now if it is, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    hooks = _pending.setdefault(name, [])
    if hook not in hooks:  # registering twice runs it once
        hooks.append(hook)
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def forget(name, hook):
    """Drop a pending hook (the undo of :func:`when_imported`); harmless if it has run or is gone."""
    hooks = _pending.get(name, [])
    if hook in hooks:
        hooks.remove(hook)
    if not hooks:
        _pending.pop(name, None)
    if not _pending and FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)


def _fire(module):
    for hook in _pending.pop(module.__name__, []):
        try:
            hook(module)
        except Exception as exc:  # the program's import must not fail for the shim: said, not raised
            sys.stderr.write(f"fusion_shim: hook on {module.__name__} failed: {type(exc).__name__}: {exc}\n")
    if not _pending and FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)


class _Loader:
    """The real loader, and the hooks after its ``exec_module``."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_code, get_source, resources: what runpy and the launcher ask of it
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # the module's own loader from here on: its reloads, resources and tracebacks use it
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _fire(module)


class _Finder:
    """First on ``sys.meta_path`` while hooks are pending; finds nothing itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            # a loader without exec_module (legacy load_module) is left alone: no hook for it
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
            return spec
        return None

    def invalidate_caches(self):
        pass


FINDER = _Finder()

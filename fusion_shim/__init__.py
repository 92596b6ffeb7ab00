"""fusion_shim: run unchanged NumPy programs, offloading the large array operations that pay off to
a GPU worker over ZeroMQ, and report where the time went.

Library use::

    import fusion_shim
    fusion_shim.install(policy="remote")   # or Config.load(...) / FUSION_SHIM_* variables
    ...                                    # NumPy calls are intercepted from here on
    fusion_shim.uninstall()                # every patched attribute restored exactly

Programs: ``python -m fusion_shim app.py [args]``, ``python -m fusion_shim -m pkg.mod [args]``, or
``FUSION_SHIM=1 python app.py`` for any launch.

This module imports only what the interpreter has loaded at start: ``fusion_shim.pth`` imports it
and runs :func:`_start` in every process that sets ``FUSION_SHIM`` (D111); the post-import hook
module loads when NumPy's import begins (D121). Its names load on first use.
"""
import os
import sys
import time

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "FallbackError", "active", "install", "report", "stage", "uninstall",
           "__version__"]

_LAZY = {"active": "intercept", "install": "intercept", "uninstall": "intercept",  # a worker never needs these
         "Config": "config", "ConfigError": "config", "FallbackError": "errors", "stage": "stages"}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{where}"), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def report(format="text", full=False):
    """The report of the running shim so far: the table printed at exit (``format="text"``; ``full``:
    the wide table, every event and floor, as ``fusion-shim report --full``), or the map
    ``--report`` writes (``format="json"``); None where the shim is not installed."""
    if format not in ("text", "json"):
        raise ValueError(f"format must be 'text' or 'json', not {format!r}")
    from . import intercept
    from .reporting import build, format_table

    rt = intercept.active()
    if rt is None:
        return None
    built = build(rt)
    return built if format == "json" else format_table(built, full=full)


_PREFIX = "FUSION_SHIM_"  # config.PREFIX, not imported: with no setting given, start loads no config (D111)
_started = False


def _start():
    """What ``fusion_shim.pth`` runs at interpreter start when ``FUSION_SHIM`` is set and not off:
    a hook on ``numpy`` that installs the shim when it is imported, and nothing else loaded. Settings
    given as ``FUSION_SHIM_*`` variables are checked now, so that an invalid one fails before the
    program runs; with none given the defaults need no check. Children inherit the variable, and so
    the shim; they also inherit ``FUSION_SHIM_WORKER`` once this process has started its worker."""
    global _started
    switch = os.environ.get("FUSION_SHIM")  # unset: a sitecustomize that imports _bootstrap starts it
    if _started or (switch is not None and not _switched_on(switch)) or _own_process(getattr(sys, "orig_argv", ())):
        return
    _started = True
    t = time.perf_counter()
    env = {k: os.environ[k] for k in os.environ if k.startswith(_PREFIX)}  # D111: no value decoded but these
    if env:
        _checked_config(env)
    hook = _AtNumpy(env, time.perf_counter() - t)
    if "numpy" in sys.modules:  # a sitecustomize that ran late: the hook module's own path, at once
        hook.arm()
    else:
        sys.meta_path.insert(0, hook)


_OWN_MAINS = ("fusion_shim.worker.", "fusion_shim.pool.")  # run as ``-m``: a worker, a stage process


def _own_process(argv):
    """Whether this interpreter runs one of this package's own processes (``-m fusion_shim.worker.X``,
    ``-m fusion_shim worker``): a worker never intercepts, even where it inherited ``FUSION_SHIM``."""
    args = iter(argv[1:])
    for a in args:
        if a == "-m":
            module = next(args, "")
            return module.startswith(_OWN_MAINS) or (module == "fusion_shim" and next(args, "") == "worker")
        if a == "-c" or not a.startswith("-"):
            return False  # a command or a script: a program of the user's
        if a in ("-W", "-X"):
            next(args, None)
    return False


class _AtNumpy:
    """D121: first on ``sys.meta_path`` from the bootstrap until NumPy's import begins; only then is
    the post-import hook module loaded, its hook registered and the search handed to it."""

    __slots__ = ("env", "spent")

    def __init__(self, env, spent):
        self.env, self.spent = env, spent

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "numpy":
            return None
        return self.arm().find_spec(fullname, path, target)

    def arm(self):
        """Leave ``sys.meta_path``, register the hook on NumPy; the hook module's finder."""
        t = time.perf_counter()
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from . import _hooks

        env = self.env
        _hooks.SPENT["bootstrap"] = self.spent + time.perf_counter() - t  # before the hook: it may run now
        _hooks.when_imported("numpy", lambda numpy: _install_at_numpy(env))
        return _hooks.FINDER


def _switched_on(raw):
    """``FUSION_SHIM`` read as every boolean setting is (D186); an invalid value ends the process
    with code 2 and the valid values, before the program runs."""
    if raw in ("1", "true", "yes", "on"):  # the usual spellings, without loading config
        return True
    from .config import ConfigError, _bool

    try:
        return _bool("FUSION_SHIM", raw)
    except ConfigError as exc:
        sys.stderr.write(f"fusion_shim: {exc}\n")
        sys.stderr.flush()
        os._exit(2)  # as in _checked_config: the .pth runs inside site's import


def _checked_config(env):
    from .config import Config, ConfigError

    try:
        return Config.load(env)
    except ConfigError as exc:
        sys.stderr.write(f"fusion_shim: {exc}\n")
        sys.stderr.flush()
        # not SystemExit: raised while site imports the .pth, it becomes "Fatal Python error:
        # init_import_site" with a traceback and exit code 1; nothing has run yet that needs atexit
        os._exit(2)


def _install_at_numpy(env):
    """The settings of the variables set at start (not what the program put in ``os.environ``
    since) over the program's pyproject, read now: a process that never imports NumPy never reads it."""
    t = time.perf_counter()
    from .config import Config, ConfigError, find_project, program_dir
    from .intercept import install, note_startup

    try:
        main = sys.modules.get("__main__")
        script = None if getattr(main, "__spec__", None) is not None or not sys.argv else sys.argv[0]  # -m: cwd
        config = Config.load(env, project=find_project(program_dir(script)))
    except ConfigError as exc:
        sys.stderr.write(f"fusion_shim: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None  # at the program's `import numpy`, before it used any of it
    note_startup("interception", time.perf_counter() - t)  # its modules; install() adds the rest
    install(config, export_env=True)


def load_ipython_extension(ipython):
    """``%load_ext fusion_shim``: registers the ``%%fusion_shim`` cell magic."""
    from .ipython import load_ipython_extension as load

    load(ipython)

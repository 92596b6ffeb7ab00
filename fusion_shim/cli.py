"""Command line: run a program through the shim, serve as a worker, render a saved report.

    python -m fusion_shim [options] app.py [args...]
    python -m fusion_shim [options] -m package.module [args...]
    fusion-shim worker --bind URL [--device auto|cpu|cuda:N] [--keys DIR | --insecure]
    fusion-shim keys DIR [--client NAME ...]
    fusion-shim pool up|status|down [--ray ADDRESS] [...]
    fusion-shim report run.json [--full | --explain]
    fusion-shim config [options] [app.py | DIR]

The program sees what plain ``python`` would give it: ``sys.argv``, ``__name__ == "__main__"``,
``sys.path[0]``, its exit code, its output, and tracebacks without the shim's own frames.
"""
from __future__ import annotations

import builtins
import importlib.util
import os
import sys
import time
import types
from typing import Any

USAGE = """\
usage: python -m fusion_shim [options] (app.py | -m module) [args...]
       fusion-shim worker --bind URL [--device auto|cpu|cuda:N] [--keys DIR | --insecure]
       fusion-shim keys DIR [--client NAME ...]
       fusion-shim pool up|status|down [--ray ADDRESS] [--workers N] [--name NAME]   (docs/pool.md)
       fusion-shim report run.json [--full | --explain] [--what-if bandwidth=B,rtt=S,speedup=X] [--trace PATH]
       fusion-shim replay run.json --device NAME --link NAME   a SIMULATED run on other hardware (docs/replay.md)
       fusion-shim calibrate        measure this machine's local speed now and cache it
       fusion-shim config [options] [app.py | DIR]   the settings in force there, and where each came from

options (each also a FUSION_SHIM_* variable and a key of pyproject.toml's [tool.fusion_shim]):
  --policy auto|local|remote   where calls run (default auto)
  --worker URL                 a running worker (ipc://, tcp://); default: start one in the background
  --workers URL,URL,...        several running workers; each call runs here or on one of them
  --pool ray://ADDRESS[/NAME]  the workers of a pool on a Ray cluster (fusion-shim pool up)
  --device auto|cpu|cuda:N     device of the embedded worker
  --report PATH                write the report as JSON to PATH
  --trace PATH                 write a Chrome-trace timeline (open it in https://ui.perfetto.dev)
  --verify FRACTION|all        also compute that share of worker answers here and compare them
  --min-flops N                auto: never offload a call estimated below N flops (default 0: the
                               per-op floors the planner derives)
  --timeout SECONDS            a remote call not answered by then is computed locally (default 60)
  --ready-timeout SECONDS      how long --policy remote waits for a warming worker (default 120)
  --quiet                      no report table on stderr
  --strict                     raise FallbackError where a call would fall back to local
  --server-key PATH            the worker's public key file (a worker serving with --keys)
  --client-keys PATH           this client's .key_secret file (its name in the worker's allow-list)
  --insecure                   no authentication where the other end offers none: plaintext to a tcp
                               worker run --insecure, a pool's Ray cluster without tokens (loudly)
  --stage MODULE:QUALNAME      run that function whole on the worker when it pays (repeatable; docs/stages.md)
"""
RUN_OPTIONS = ("policy", "worker", "workers", "pool", "device", "report", "trace", "verify", "timeout", "ready-timeout", "min-flops",
               "server-key", "client-keys", "stage")
RUN_FLAGS = ("quiet", "strict", "insecure")


def usage() -> str:
    """USAGE, its first line naming the command as it was invoked (``fusion-shim`` or ``python -m``)."""
    if os.path.basename(sys.argv[0] or "") == "fusion-shim":
        return USAGE.replace("usage: python -m fusion_shim", "usage: fusion-shim", 1)
    return USAGE


class UsageError(Exception):
    pass


class HelpRequested(Exception):
    """``-h`` or ``--help`` among the launcher's options."""


def parse_run(argv: list[str], need_program: bool = True) -> tuple[dict[str, Any], str | None, str | None, list[str]]:
    """Options up to the program; returns (settings, script, module, program args)."""
    settings: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return settings, None, argv[i + 1], argv[i + 2:]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg in ("-h", "--help"):
            raise HelpRequested
        name, eq, value = arg[2:].partition("=")
        if arg.startswith("--") and name in RUN_FLAGS:
            settings[name.replace("-", "_")] = value if eq else True  # --quiet, or --quiet=1 / =0
            i += 1
            continue
        if not arg.startswith("--") or name not in RUN_OPTIONS:
            raise UsageError(f"unknown option {arg}")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"{arg} needs a value")
            value = argv[i + 1]
            i += 1
        if name == "stage":  # repeatable: the specs add up
            settings["stages"] = ",".join(filter(None, (settings.get("stages"), value)))
        else:
            settings[name.replace("-", "_")] = value
        i += 1
    if i >= len(argv):
        if need_program:
            raise UsageError("no program to run")
        return settings, None, None, []
    return settings, argv[i], None, argv[i + 1:]


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "worker":
        return worker_main(argv[1:])
    if argv[0] == "report":
        return report_main(argv[1:])
    if argv[0] == "replay":
        from .replay.command import main as replay_main

        return replay_main(argv[1:])
    if argv[0] == "calibrate":
        return calibrate_main(argv[1:])
    if argv[0] == "keys":
        return keys_main(argv[1:])
    if argv[0] == "config":
        return config_main(argv[1:])
    if argv[0] == "pool":
        from .pool.command import main as pool_main

        return pool_main(argv[1:])
    from .intercept import gc_paused  # loads config, which the run needs next

    with gc_paused():  # D119: the launcher's objects all live on; a collection would find nothing to free
        from .config import Config, ConfigError, find_project, program_dir

        try:
            settings, script, module, args = parse_run(argv)
            config, sources = Config.load_with_sources(project=find_project(program_dir(script)), **settings)
        except HelpRequested:
            print(usage())
            return 0
        except (UsageError, ConfigError) as exc:
            print(f"fusion_shim: {exc}\n\n{usage()}", file=sys.stderr)
            return 2
    return run_program(config, script, module, args, started, explicit=tuple(sources))


CONFIG_USAGE = """\
usage: fusion-shim config [options] [app.py | DIR]

Print the settings a run of that program (or one started in DIR, or here) would get with the options
given, and where each came from (default, pyproject, environment, flag). The options are those of
python -m fusion_shim (fusion-shim --help)."""


def config_main(argv: list[str]) -> int:
    """Print the settings a run from here (or of that program, or in that directory) would get, with
    the flags given, and where each came from."""
    from .config import Config, ConfigError, find_project, program_dir

    try:
        settings, target, module, _ = parse_run(argv, need_program=False)
        start = target if target and os.path.isdir(target) else program_dir(target)
        project = find_project(start)
        config, sources = Config.load_with_sources(project=project, **settings)
    except HelpRequested:
        print(CONFIG_USAGE)
        return 0
    except (UsageError, ConfigError) as exc:
        print(f"fusion-shim config: {exc}", file=sys.stderr)
        return 2
    print(format_settings(config, sources, project.path if project else None))
    return 0


def format_settings(config: Any, sources: dict[str, str], pyproject: str | None) -> str:
    lines = [f"pyproject: {pyproject or f'none with a [tool.fusion_shim] table at or above {os.getcwd()}'}",
             "precedence: defaults < pyproject < environment < flags"]
    fields = config.fields()
    width = max(len(name) for name in fields)
    for name in fields:
        value = getattr(config, name)
        shown = ",".join(value) if isinstance(value, tuple) else ("" if value is None else str(value))
        lines.append(f"  {name:<{width}}  {shown or '-':<24}  {sources.get(name, 'default')}")
    return "\n".join(lines)


CALIBRATE_USAGE = """\
usage: fusion-shim calibrate

Measure this machine's local speed for every (family, dtype) now and write the cache the planner
reads; runs would otherwise measure on first use, in the background, and only what they use."""


def calibrate_main(argv: list[str]) -> int:
    """Probe every (family, dtype) now and write the cache the planner reads on first use;
    runs would otherwise measure on first use, in the background, and only what they use."""
    if argv in (["-h"], ["--help"]):
        print(CALIBRATE_USAGE)
        return 0
    if argv:
        print(f"fusion-shim calibrate: unexpected argument {argv[0]}\n{CALIBRATE_USAGE}", file=sys.stderr)
        return 2
    from .plan import Planner, calibrate

    key = calibrate.build_key()
    path = calibrate.cache_path(key)
    planner = Planner("auto", 0, cache=calibrate.Cache(path, key), on_event=print)
    planner.calibrate_now([(f, d) for f in ("products", "linalg", "fft") for d in calibrate.FLOAT_DTYPES])
    print(f"written to {path}")
    return 0


def run_program(config: Any, script: str | None, module: str | None, args: list[str],
                started: float | None = None, explicit: tuple[str, ...] = ()) -> int:
    """Install the shim and run the program as plain python would; ``started``: when the launcher
    began (its time up to the program's first line is the report's ``launcher`` start-up);
    ``explicit``: the settings given, which children inherit even where they equal the default."""
    started = time.perf_counter() if started is None else started
    from .intercept import gc_paused

    with gc_paused():
        loaded = _install_and_load(config, script, module, args, started, explicit)
    if loaded is None:
        return 1 if module is not None else 2
    code, main_mod = loaded
    try:
        exec(code, main_mod.__dict__)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        # left to propagate, so that the interpreter exits by SIGINT as plain python does; the
        # frames it picks up on the way (runpy, this launcher) come off when it is printed
        _strip_chain(exc)
        user_tb, hook = exc.__traceback__, sys.excepthook

        def _print_user_frames(t: type, value: BaseException, tb: Any, interrupt: BaseException = exc) -> None:
            if value is interrupt:
                value.__traceback__ = tb = user_tb
            hook(t, value, tb)

        sys.excepthook = _print_user_frames
        raise
    except BaseException as exc:
        # the default hook prints exc.__traceback__ (the tb argument only when that is unset), so
        # the launcher's frames must come off the exception itself, and off its chained causes
        _strip_chain(exc)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1
    return 0


def _install_and_load(config: Any, script: str | None, module: str | None, args: list[str], started: float,
                      explicit: tuple[str, ...]) -> tuple[Any, types.ModuleType] | None:
    """The shim installed, the program's code compiled and ``sys.argv`` and ``__main__`` made its; None
    where the program cannot be found (said on stderr)."""
    from .intercept import install, note_startup

    # children inherit the shim with these same settings, less the report file (one per process
    # would overwrite it); they reuse this process's worker once it has one (see fusion_shim._start)
    child_env = {k: v for k, v in config.to_env(explicit).items() if k != "FUSION_SHIM_REPORT"}
    os.environ.update(child_env, FUSION_SHIM="1")
    install(config, export_env=True)
    if module is not None:
        code, main_mod, argv0 = _load_module(module, config.stages)
    else:
        code, main_mod, argv0 = _load_script(script, config.stages)
    if code is None:
        return None
    sys.argv = [argv0, *args]
    sys.modules["__main__"] = main_mod
    note_startup("launcher", time.perf_counter() - started)
    return code, main_mod


def _load_script(path: str, stages: tuple[str, ...] = ()) -> tuple[Any, types.ModuleType | None, str]:
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        print(f"{sys.executable}: can't open file {os.path.abspath(path)!r}: [Errno {exc.errno}] {exc.strerror}",
              file=sys.stderr)
        return None, None, path
    full = os.path.abspath(path)
    marked = _main_stages(stages, path)
    if marked:  # its marked functions get a decorator in the syntax tree (docs/stages.md)
        from .stages.mark import compile_main

        code = compile_main(source, full, marked)
    else:
        code = compile(source, full, "exec", dont_inherit=True)
    main_mod = types.ModuleType("__main__")
    if marked:
        from .stages.mark import main_globals

        main_mod.__dict__.update(main_globals())
    main_mod.__file__ = full
    main_mod.__builtins__ = builtins
    main_mod.__loader__ = None
    main_mod.__spec__ = None
    _program_path0(os.path.dirname(os.path.realpath(path)))
    return code, main_mod, path


def _program_path0(entry: str) -> None:
    """The program's first ``sys.path`` entry, as plain python puts it (none under -P); the entry
    points took the launcher's own out (D185)."""
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, entry)


def _main_stages(stages: tuple[str, ...], script: str | None, module: str | None = None) -> set[str]:
    if not stages:
        return set()
    from .stages.mark import main_qualnames

    return main_qualnames(stages, script, module)


def _load_module(name: str, stages: tuple[str, ...] = ()) -> tuple[Any, types.ModuleType | None, str]:
    _program_path0(os.getcwd())  # what `python -m` puts first
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(name + ".__main__")
    except (ImportError, ValueError) as exc:
        print(f"{sys.executable}: Error while finding module specification for {name!r} ({exc})", file=sys.stderr)
        return None, None, name
    if spec is None or spec.loader is None:
        print(f"{sys.executable}: No module named {name}", file=sys.stderr)
        return None, None, name
    marked = _main_stages(stages, None, spec.name.removesuffix(".__main__"))
    source = spec.loader.get_source(spec.name) if marked and hasattr(spec.loader, "get_source") else None
    main_mod = types.ModuleType("__main__")
    if source is not None:  # as for a script: its marked functions get a decorator (docs/stages.md)
        from .stages.mark import compile_main, main_globals

        code = compile_main(source.encode(), spec.origin, marked)
        main_mod.__dict__.update(main_globals())
    else:
        code = spec.loader.get_code(spec.name)
    main_mod.__file__ = spec.origin
    main_mod.__builtins__ = builtins
    main_mod.__loader__ = spec.loader
    main_mod.__spec__ = spec
    main_mod.__package__ = spec.parent
    if spec.cached:
        main_mod.__cached__ = spec.cached
    return code, main_mod, spec.origin or name


def _strip_chain(exc: BaseException, seen: set[int] | None = None) -> None:
    """Take the shim's frames off ``exc`` and the exceptions chained to it (cause, context)."""
    seen = set() if seen is None else seen
    seen.add(id(exc))
    exc.__traceback__ = _user_frames(exc.__traceback__)
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None and id(linked) not in seen:
            _strip_chain(linked, seen)


def _user_frames(tb: Any) -> Any:
    """The traceback without the launcher's frames and the shim's wrapper frames, nor the frames of
    what the shim called on the program's behalf (ZeroMQ, threading waits): what plain python would
    print. NumPy's frames stay: the program called NumPy."""
    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep
    deps = tuple(_dependency_dirs())
    after_ours = False

    def ours(t: Any) -> bool:
        nonlocal after_ours
        name = t.tb_frame.f_code.co_filename
        if name.startswith(pkg):
            after_ours = True
            return True
        return after_ours and name.startswith(deps)

    while tb is not None and ours(tb):
        tb = tb.tb_next
    head = tb
    while tb is not None:
        after_ours = False
        nxt = tb.tb_next
        while nxt is not None and ours(nxt):
            nxt = nxt.tb_next
        tb.tb_next = nxt
        tb = nxt
    return head


def _dependency_dirs() -> list[str]:
    """Where the modules the shim waits in live: pyzmq's package (its Cython frames name it
    relatively), threading and queue."""
    out = ["zmq" + os.sep]
    for name in ("zmq", "threading", "queue"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            out.append(os.path.dirname(path) + os.sep if name == "zmq" else path)
    return out


def worker_main(argv: list[str]) -> int:
    import fusion_shim

    from .worker import command

    fusion_shim.uninstall()  # a worker never intercepts, even under FUSION_SHIM=1
    return command.main(argv)


def keys_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fusion-shim keys",
                                     description="Make CURVE key pairs for a worker and its clients (files mode 0600).")
    parser.add_argument("dir", help="directory for the keys (created 0700)")
    parser.add_argument("--client", action="append", default=None, metavar="NAME",
                        help="make a key pair for client NAME and allow it (repeatable; default: one named 'client' "
                             "when the directory has no server keys yet)")
    opts = parser.parse_args(argv)
    from .auth import SERVER, KeyFileError, make_keys

    clients = opts.client
    if clients is None:
        clients = [] if os.path.exists(os.path.join(opts.dir, SERVER + ".key_secret")) else ["client"]
    try:
        written = make_keys(opts.dir, clients)
    except (KeyFileError, OSError) as exc:
        print(f"fusion-shim keys: {exc}", file=sys.stderr)
        return 1
    for path in written["server"]:
        print(f"wrote {path}")
    for pair, allowed in zip(written["clients"], written["authorized"]):
        print(f"wrote {pair}\nwrote {allowed}")
    d = opts.dir
    print(f"\nworker:  fusion-shim worker --bind tcp://0.0.0.0:5555 --keys {d}")
    for pair in written["clients"]:
        print(f"client:  FUSION_SHIM_SERVER_KEY={os.path.join(d, SERVER + '.key')} FUSION_SHIM_CLIENT_KEYS={pair}")
    return 0


def report_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fusion-shim report", description="Render a saved run's report.")
    parser.add_argument("path", help="a JSON report written with --report")
    parser.add_argument("--what-if", metavar="KEY=VALUE,...",
                        help="re-price the run under another link/device (an estimate): bandwidth=B/s, rtt=s, speedup=x")
    parser.add_argument("--trace", metavar="PATH", help="also write its Chrome-trace timeline to PATH")
    parser.add_argument("--full", action="store_true",
                        help="the wide table (every phase), every event and every op's floor")
    parser.add_argument("--explain", action="store_true", help="the table, then what each column and figure means")
    opts = parser.parse_args(argv)
    from .reporting import format_table, load

    try:
        profile = None
        if opts.what_if:  # a bad profile fails before anything is printed
            from .reporting.whatif import LinkProfile, format_whatif, reprice

            profile = LinkProfile.parse(opts.what_if)
        report = load(opts.path)
        print(format_table(report, full=opts.full))
        if opts.explain:
            from .reporting.layout import EXPLAIN

            print("\n" + EXPLAIN, end="")
        if opts.trace:
            from .reporting.trace import write_trace

            write_trace(report, opts.trace)
        if profile is not None:
            print(format_whatif(reprice(report, profile)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"fusion-shim report: {exc}", file=sys.stderr)
        return 1
    return 0


def entry() -> None:
    """The ``fusion-shim`` console script."""
    if not getattr(sys.flags, "safe_path", False) and sys.path:
        del sys.path[0]  # the script's directory: the program's own goes there (_program_path0)
    sys.exit(main())

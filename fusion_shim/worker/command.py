"""``fusion-shim worker``: its options, and the worker served from them."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from typing import Any, Callable

PROG = "fusion-shim worker"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve kernels to fusion_shim clients.")
    p.add_argument("--bind", required=True, help="ipc:///path, tcp://127.0.0.1:PORT, or inproc://name")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--keys", metavar="DIR", default=None,
                   help="serve with CURVE: DIR/server.key_secret and the allow-list DIR/authorized "
                        "(made by `fusion-shim keys DIR`); needed to bind a network address; a loopback "
                        "tcp address without it serves this user's own keys (~/.config/fusion_shim/keys)")
    p.add_argument("--insecure", action="store_true",
                   help="serve a tcp address WITHOUT authentication (warns loudly)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest message accepted, in bytes (default: half the host's memory and half the GPU's, "
                        "at most 64 GiB)")
    p.add_argument("--fresh-bench", action="store_true",
                   help="take the self-benchmark again instead of reusing this host's last one")
    p.add_argument("--allow-code", nargs="?", const="any", default=None, metavar="parent",
                   help="run stages (functions clients send, docs/stages.md) for authenticated clients; "
                        "'parent' (the embedded worker): only for the process given as --parent-pid")
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--memory-budget", type=size, default=None,
                   help="bytes the resident store may hold (e.g. 2G, 512M); default: half the GPU, "
                        "or a quarter of RAM up to 8G on the CPU")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    return start(p, p.parse_args(argv))


def start(p: argparse.ArgumentParser, opts: argparse.Namespace, make: Callable[..., Any] | None = None) -> int:
    """Check ``opts``, then serve a worker made by ``make(device, memory_budget, max_bytes=...)``
    (default :class:`.server.Worker`) until the loop ends."""
    from ..auth import KeyFileError
    from ..config import ConfigError, _device
    from .server import Worker, serve

    try:
        device = _device("--device", opts.device)
    except ConfigError as exc:
        p.error(str(exc))
    if opts.keys is not None and opts.insecure:
        p.error("--keys and --insecure exclude each other")
    from ..transport import check_url

    try:
        check_url(opts.bind)
    except ValueError as exc:
        p.error(str(exc))
    allow_code = getattr(opts, "allow_code", None)
    if allow_code not in (None, "any", "parent"):
        p.error("--allow-code takes no value, or 'parent'")
    if allow_code == "parent":
        if opts.parent_pid is None:
            p.error("--allow-code parent needs --parent-pid")
        allow_code = f"parent:{opts.parent_pid}"
    max_bytes = opts.max_bytes  # None: from the host's and the device's memory (D65)
    if max_bytes is not None and max_bytes <= 0:
        p.error("--max-bytes must be > 0")
    try:
        keys = opts.keys if opts.keys or opts.insecure else default_keys(opts.bind)
        security = (f"CURVE, clients from {keys}" if keys else
                    "no authentication" if opts.insecure else "this user's processes only")
        print(f"fusion_shim worker: binding {opts.bind} (device {device}; {security})", file=sys.stderr, flush=True)
        extra = {"allow_code": allow_code} if allow_code else {}  # a make() of tests takes none
        worker = (make or Worker)(device, opts.memory_budget, max_bytes=max_bytes, bench_cache=not opts.fresh_bench,
                                  **extra)
        def on_bound(endpoint: str) -> None:
            if opts.parent_pid is None:
                clean_on_sigterm(endpoint, True, worker.abandon_stages)
            else:  # D187: its client removes the socket; a handler only once stage processes exist
                worker.at_first_stage(lambda: clean_on_sigterm(endpoint, False, worker.abandon_stages))

        serve(opts.bind, worker, parent_pid=opts.parent_pid, keys=keys, insecure=opts.insecure, on_bound=on_bound)
        if opts.parent_pid is not None:
            remove_run_dir(opts.bind, opts.parent_pid)
    except (KeyFileError, OSError) as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    return 0


def default_keys(url: str) -> str | None:
    """D68: a loopback tcp address is served with this user's own keys (made on first use); an
    ``ipc://`` path is guarded by its directory and the peer's uid; a network address needs --keys."""
    from ..auth import ensure_user_keys
    from ..transport import check_url, is_loopback

    if check_url(url) != "tcp" or not is_loopback(url):
        return None
    return ensure_user_keys()


def clean_on_sigterm(endpoint: str, unlink: bool, cleanup: Callable[[], None]) -> None:
    """D187: what this process made goes when SIGTERM ends it, which then dies by that signal as
    before: ``cleanup`` (its stage processes and their directories), and where ``unlink``, the
    ``ipc://`` socket file just bound (same inode), never one bound since."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return  # a worker served in a thread (tests): its thread's owner cleans
    path = endpoint[len("ipc://"):] if unlink and endpoint.startswith("ipc://") else ""
    bound = None
    if path and not path.startswith("@"):  # abstract names and tcp leave no file
        try:
            st = os.stat(path)
            bound = (st.st_dev, st.st_ino)
        except OSError:
            pass

    def on_sigterm(signum: int, _frame: Any) -> None:
        try:
            cleanup()
        except Exception:  # dying anyway: what could not be cleaned stays
            pass
        try:
            st = os.lstat(path)
            if bound is not None and (st.st_dev, st.st_ino) == bound:
                os.unlink(path)
        except OSError:
            pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def remove_run_dir(url: str, parent_pid: int) -> None:
    """D63: an embedded worker whose client is gone (exited, or killed by any signal) removes the
    run's directory, its socket and log; only a directory named for that client's run."""
    if not url.startswith("ipc://"):
        return
    directory = os.path.dirname(url[len("ipc://"):])
    if re.fullmatch(rf"run-\d+-{parent_pid}-\d+(-.*)?", os.path.basename(directory)):
        shutil.rmtree(directory, ignore_errors=True)


def size(text: str) -> int:
    """``123``, ``512K``, ``64M``, ``2G`` (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"{text!r} is not a size; valid: a number of bytes, or with K, M, G, T") from None
    if value < 0:
        raise ValueError("a size must be >= 0")
    return value


def size_text(n: int) -> str:
    """``n`` bytes as ``size`` reads it back, to 2-3 digits: ``512B``, ``1.5K``, ``64M``, ``2.0G``."""
    for unit in ("T", "G", "M", "K"):
        scale = 1 << {"K": 10, "M": 20, "G": 30, "T": 40}[unit]
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{n}B"

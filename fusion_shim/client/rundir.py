"""Where a program's embedded worker listens and logs (D63): one directory per run inside a
per-user 0700 directory, ``$XDG_RUNTIME_DIR/fusion_shim`` or else ``/tmp/fusion-shim-<uid>``.

A run's directory is named for its process (``run-<pidns>-<pid>-<start>``), so the next run can
tell a leftover from a live one: a run killed with SIGKILL leaves its directory, and the next
program to start a worker removes it. A per-user directory that is another user's, a link, or open
to others is refused with an event, and a fresh private directory from ``tempfile.mkdtemp`` is used.
"""
from __future__ import annotations

import os
import re
import stat
import sys

from ..procinfo import owner_dead, pidns, proc_start

_RUN = r"run-(\d+)-(\d+)-(\d+)(-.*)?$"  # a second runtime's has a suffix; compiled on use (D123)


def is_run_socket(url: str) -> bool:
    """Whether ``url`` is an embedded worker's socket in a run's directory (a parent run's worker)."""
    if not url.startswith("ipc://"):
        return False
    name = os.path.basename(os.path.dirname(url[len("ipc://"):]))
    return bool(re.match(_RUN, name)) or name.startswith("fusion-shim-")  # new_run_dir's fallback


class RunDirError(OSError):
    """The per-user directory cannot be trusted."""


def user_dir(env: dict | None = None) -> str:
    """The per-user directory's path (not created)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "fusion_shim")
    return os.path.join(_temp_root(), f"fusion-shim-{os.geteuid()}")


def _temp_root() -> str:
    """``tempfile.gettempdir()`` where tempfile is loaded; else its usual answer without loading it
    (a deferred worker's directory is made at NumPy's import, D113): one that is not writable is
    refused by private_dir, and new_run_dir's fallback then asks tempfile itself."""
    loaded = sys.modules.get("tempfile")
    if loaded is not None:
        return loaded.gettempdir()
    return next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")


def private_dir(path: str) -> str:
    """``path``, created 0700 if missing; RunDirError unless it is this user's own directory,
    not a link, closed to group and others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RunDirError(f"{path} is not a private directory of this user (owner uid {st.st_uid}, "
                          f"mode {stat.S_IMODE(st.st_mode):04o}{', a link' if stat.S_ISLNK(st.st_mode) else ''})")
    return path


SOCKET_ROOM = len("/worker-99.sock")
IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) less its NUL, on Linux


def new_run_dir(env: dict | None = None) -> tuple[str, str | None]:
    """A fresh directory for this run's worker, and why the per-user one was not used (or None).
    Leftovers of dead runs are removed first."""
    try:
        base = _checked_base(env)
    except (RunDirError, OSError) as exc:
        import tempfile

        return tempfile.mkdtemp(prefix="fusion-shim-"), f"{exc}: a fresh private directory is used instead"
    sweep(base)
    path = _run_path(base)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # a second runtime in this process (install after uninstall)
        import tempfile

        path = tempfile.mkdtemp(prefix=os.path.basename(path) + "-", dir=base)
    return path, None


def run_dir_name(env: dict | None = None) -> str | None:
    """The directory :func:`new_run_dir` would make for this run, named and not made (D122): None
    where it would fall back (a per-user directory refused or too long, or the name taken)."""
    try:
        path = _run_path(_checked_base(env))
    except (RunDirError, OSError):
        return None
    return None if os.path.lexists(path) else path


def make_named(path: str) -> str:
    """Make the directory :func:`run_dir_name` named, leftovers of dead runs beside it removed first;
    RunDirError (an OSError) unless it is then this user's private directory."""
    sweep(os.path.dirname(path))
    return private_dir(path)


def _checked_base(env: dict | None) -> str:
    base = private_dir(user_dir(env))
    longest = len(os.path.join(base, f"run-{pidns()}-{2 ** 22}-{2 ** 40}")) + SOCKET_ROOM
    if longest > IPC_PATH_MAX:
        raise RunDirError(f"{base} is too long a path for a socket ({longest} > {IPC_PATH_MAX} bytes)")
    return base


def _run_path(base: str) -> str:
    pid = os.getpid()
    return os.path.join(base, f"run-{pidns()}-{pid}-{proc_start(pid) or 0}")


def sweep(base: str) -> list[str]:
    """Remove the run directories in ``base`` whose process is gone."""
    removed: list[str] = []
    if proc_start(os.getpid()) is None:
        return removed  # no /proc: every owner would look dead
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    run = re.compile(_RUN)
    for name in names:
        m = run.match(name)
        if m is None:
            continue
        ns, pid, start = (int(x) for x in m.groups()[:3])
        if owner_dead(ns, pid, start):
            import shutil  # here, as tempfile: see _temp_root

            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            removed.append(name)
    return removed

"""What a stage process may touch (docs/stages.md, D189): the worker non-dumpable (no
``/proc/PID/mem``, no ptrace by its uid), the stage process started isolated (``python -I``, an
explicit import path, only its socket inherited, an environment without the worker's secrets) and,
where the worker is root, as an unprivileged user: the worker's keys and memory out of its reach and
the worker beyond its signals. Imports nothing heavy: the stage process uses it first.
"""
from __future__ import annotations

import ctypes
import os
import pwd
import sys

PR_SET_DUMPABLE = 4
STAGE_USER = "nobody"  # D189: who stage code runs as where the worker runs as root
ENV_KEPT = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR")
ENV_KEPT_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_", "TORCH_", "FUSION_SHIM_")
BOOT = ("import sys, json; sys.path[:] = [p for p in sys.path if p]; sys.path[:0] = json.loads(sys.argv[1]); "
        "from fusion_shim.worker.stagechild import main; sys.exit(main(sys.argv[2:]))")


def non_dumpable() -> bool:
    """D189: this process's memory, fds and /proc entries closed to other processes of its uid
    (no /proc/PID/mem, no ptrace); False where the kernel offers no prctl (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stage_ids(user: str | int | None = STAGE_USER) -> tuple[int, int] | None:
    """The (uid, gid) stage processes run as: an unprivileged user where this worker is root and
    that user can run this Python and this package, else None (they run as the worker's user)."""
    if os.geteuid() != 0 or user is None or why_not_other_user() is not None:
        return None
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534  # the kernel's overflow uid: owns nothing


def _open_to_all(path: str) -> bool:
    path = os.path.realpath(path)
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return False
        if not mode & 0o005 if os.path.isdir(path) else not mode & 0o004:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def why_not_other_user() -> str | None:
    """Why another user could not run a stage process here (this Python or this package is not
    readable to all), or None."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for what, path in (("this Python", sys.executable), ("its library", os.path.dirname(os.__file__)),
                       ("fusion_shim", pkg)):
        if not _open_to_all(path):
            return f"{what} ({os.path.realpath(path)}) is not readable to other users"
    return None


def child_path() -> list[str]:
    """The stage process's import path beyond Python's own (D189): this package's parent and the
    worker's PYTHONPATH as given; never the current directory nor the worker's ``sys.path[0]``."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    return list(dict.fromkeys([pkg_parent, *extra]))


def child_env(ids: tuple[int, int] | None) -> dict[str, str]:
    """The stage process's environment: locale, paths and thread settings, no secrets of the worker's."""
    env = {k: v for k, v in os.environ.items() if k in ENV_KEPT or k.startswith(ENV_KEPT_PREFIXES)}
    if ids is None and "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    env["FUSION_SHIM"] = "0"
    return env

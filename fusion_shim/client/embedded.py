"""The embedded worker: a ``fusion-shim worker`` process this program starts for itself, when no
worker URL is given; whether this host has a GPU it could use; its scheduling priority."""
from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded by spawn(): the runtime reads gpu_visible() at NumPy's import (D113)
    import subprocess


def gpu_visible() -> bool:
    """Whether this host shows a GPU the embedded worker's torch could use, without importing torch:
    NVIDIA's device files or driver list, or ROCm's ``/dev/kfd``; ``CUDA_VISIBLE_DEVICES`` set empty
    or to -1 hides them."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    return bool(any(n.startswith("nvidia") and n[6:7].isdigit() for n in _listdir("/dev"))  # /dev/nvidia[0-9]*
                or _listdir("/proc/driver/nvidia/gpus") or os.path.exists("/dev/kfd"))


def _listdir(path: str) -> list[str]:
    """glob's answer without glob (read at NumPy's import, D113): no directory, no names."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def parallel_blas() -> bool:
    """Whether this process's BLAS may run helper threads (more than one CPU allowed, no *_NUM_THREADS=1):
    they spin for a while after each call, on the CPUs a same-host worker computes on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    from ..plan.calibrate import THREAD_VARS  # the BLAS thread settings the calibration cache is keyed on

    return cpus > 1 and not any(os.environ.get(v, "").strip() == "1" for v in THREAD_VARS)


def spawn(url: str, tmpdir: str, device: str, policy: str) -> subprocess.Popen:
    """Start the worker bound at ``url``, its output to ``tmpdir``/worker.log; under ``auto`` at idle
    priority (:func:`lower_priority`). It runs this process's stages, and no other's (D177)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["FUSION_SHIM"] = "0"  # the worker must not intercept (nor start a worker of its own)
    paths = import_paths(env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(paths)  # what the worker's own children inherit
    log = open(os.path.join(tmpdir, "worker.log"), "ab")
    cmd = [*isolated_python(paths), "worker", "--bind", url, "--device", device,
           "--parent-pid", str(os.getpid()), "--allow-code", "parent"]
    # D21: a process group of its own (Ctrl-C is the program's), in the program's session, whose
    # scheduling group it then shares
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **group)
    log.close()
    if policy == "auto":
        lower_priority(proc.pid)
    return proc


def import_paths(pythonpath: str) -> list[str]:
    """The directories a process the shim starts imports from besides the interpreter's own: this
    package's parent, then the absolute ``PYTHONPATH`` entries, never the current directory (D185)."""
    cwd = os.path.realpath(os.getcwd())
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out: list[str] = []
    for p in (pkg_parent, *pythonpath.split(os.pathsep)):
        if p and os.path.isabs(p) and os.path.realpath(p) != cwd and p not in out:
            out.append(p)
    return out


def isolated_python(paths: list[str]) -> list[str]:
    """D185: this interpreter in isolated mode (``-I``: no current directory or script directory on
    ``sys.path``, no ``PYTHON*`` variable, no user site), running the package's command line with
    ``paths`` put first and the user site added back where this process has it; arguments follow."""
    import site

    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    user = user if user in sys.path else None
    boot = (f"import sys; sys.path[:0] = {paths!r}; "
            + (f"import site; site.addsitedir({user!r}); " if user else "")
            + "from fusion_shim.cli import main; sys.exit(main())")
    return [sys.executable, "-I", "-c", boot]


def lower_priority(pid: int) -> None:
    """D20: under ``auto`` nobody waits for the embedded worker, and it shares the program's CPUs: it
    runs at idle priority (SCHED_IDLE; where that is missing, nice 19), so that its warm-up takes only
    CPU time nothing else wants. On a machine saturated by other work it then warms slowly or not at
    all, and ``auto`` stays local. Under ``remote`` the program waits for it: it keeps normal priority."""
    try:
        # Python 3.10 has no process_group: there the worker leads a session of its own, and with
        # autogroup scheduling a session is a scheduling group that competes with the program's as
        # an equal, whatever the priority inside it: the group's own nice must drop too. Never the
        # program's own session's group: that would be the user's whole terminal session
        if os.getsid(pid) == pid != os.getsid(0):
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write("19")
    except OSError:
        pass
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    except (AttributeError, OSError):
        pass


def boot_phase(pid: int, url: str, exited: "int | None", last_line: "str | None") -> str:
    """D286: where an embedded worker that is not ready is in its start, seen from outside: exited
    (with its log's last line), importing torch (it binds its socket only after), or taking its
    self-benchmark (bound; hellos wait for it); with the CPU time it has had, and its priority."""
    if exited is not None:
        return f"exited with status {exited}" + (f": {last_line}" if last_line else "")
    path = url[len("ipc://"):] if url.startswith("ipc://") else None
    if path is not None and not os.path.exists(path):
        phase = "importing torch (not listening yet)"
    else:
        phase = "self-benchmark running (listening; hellos wait for it)"
    cpu = _cpu_seconds(pid)
    if cpu is not None:
        phase += f", {cpu:.1f}s of CPU so far"
    if _idle_priority(pid):
        phase += ", at idle priority: it runs only on CPU time nothing else on this host wants"
    return phase


def _cpu_seconds(pid: int) -> "float | None":
    """User and system CPU time of ``pid`` (Linux ``/proc``); None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _idle_priority(pid: int) -> bool:
    try:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE
    except (AttributeError, OSError):
        return False


def fatal_fix(why: str | None, code: int | None, was_ready: bool) -> str | None:
    """The fix for an embedded worker's exit that a restart will not cure, or None: an import error,
    or any exception before it was ever ready (a bad device, a broken install). A kill is retried."""
    if not why or code is None or code <= 0 or not re.match(r"[\w.]+(Error|Exception)\b", why):
        return None
    if why.startswith(("ModuleNotFoundError", "ImportError")):
        return "this Python lacks the worker's packages: pip install 'fusion-shim[worker]', or --worker URL"
    if was_ready:
        return None
    return "check --device (FUSION_SHIM_DEVICE) and the worker's install, or give --worker URL"

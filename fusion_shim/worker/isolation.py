"""What a stage process may touch (docs/stages.md, D189): the worker non-dumpable (no
``/proc/PID/mem``, no ptrace by its uid), the stage process started isolated (``python -I``, an
explicit import path, only its socket inherited, an environment without the worker's secrets) and,
where the worker is root, as an unprivileged user: the worker's keys and memory out of its reach and
the worker beyond its signals; and, where the kernel has Landlock, confined to the files it needs
and to signals within itself (D214). Imports nothing heavy and nothing of this package at import:
the stage process loads it by its path, before anything else.
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
# D214: this file is loaded by its path and confines the process before the package (numpy, its
# threads) is imported, since Landlock binds only the calling thread and those it starts later.
BOOT = ("import sys, json, importlib.util as u; sys.path[:] = [p for p in sys.path if p]; "
        "sys.path[:0] = json.loads(sys.argv[1]); s = u.spec_from_file_location('fusion_shim_confine', sys.argv[2]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); why = m.confine(json.loads(sys.argv[3])); "
        "from fusion_shim.worker.stagechild import main; sys.exit(main(sys.argv[4:], why))")


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
    env["FUSION_SHIM_SHM"] = "0"  # D214: no /dev/shm in the sandbox; device calls are in-process (D307)
    return env


# D214: Landlock (Linux >= 5.13) confines the stage process to the files it needs and, from ABI 6,
# to signals and abstract sockets within its own domain.
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every Linux architecture
PR_SET_NO_NEW_PRIVS = 38
RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # all a rule on a file may hold
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV
SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
               "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf",
               "/etc/host.conf", "/etc/gai.conf", "/etc/services", "/etc/protocols", "/sys/devices/system/cpu",
               "/sys/devices/system/node", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/proc/driver/nvidia")
GPU_READ = ("/sys/bus/pci", "/sys/module/nvidia", "/sys/module/nvidia_uvm", "/proc/modules")  # where /dev/nvidia* is


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(*args) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(*args)
    return ret, ctypes.get_errno()


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers; 0 where it has none (not Linux, too old, turned off)."""
    try:
        ret, _ = _syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(ret, 0)


KEY_DIRS: set[str] = set()  # D215: the --keys directories of the workers this process serves; D344: token files


def protect(keys: str) -> str:
    """Keep ``keys`` (a worker's ``--keys`` directory, or a secret file: a pool's Ray token, D344) out of
    every stage process's sandbox; returns it."""
    KEY_DIRS.add(os.path.realpath(keys))
    return keys


def protected_dirs(keys: list[str] = ()) -> list[str]:
    """Directories a stage must never read: this user's fusion_shim configuration (its keys), the
    ``--keys`` directories of this process's workers, and ``keys``."""
    base = os.environ.get("XDG_CONFIG_HOME")
    base = base if base and os.path.isabs(base) else os.path.join(os.path.expanduser("~"), ".config")
    dirs = (os.path.join(base, "fusion_shim"), *sorted(KEY_DIRS), *keys)
    return list(dict.fromkeys(os.path.realpath(p) for p in dirs))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def narrowed(root: str, protected: list[str]) -> list[str]:
    """``root``, or where it holds a protected directory, its entries that hold none, recursively
    (D215: a Python installed in the home directory that holds the keys stays importable)."""
    root = os.path.realpath(root)
    if any(_within(root, p) for p in protected):
        return []
    if not any(_within(p, root) for p in protected):
        return [root]
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [r for name in names for r in narrowed(os.path.join(root, name), protected)]


def _mapped_dirs() -> list[str]:
    """The directories of the shared libraries this process has loaded (CUDA's, wherever they lie)."""
    try:
        with open("/proc/self/maps") as f:
            files = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return []
    return sorted({os.path.dirname(p) for p in files if p.startswith("/") and ".so" in os.path.basename(p)})


def sandbox_spec(tmp: str, keys: list[str] = ()) -> dict:
    """What a stage process may read and write (D214): Python and its libraries, this package and
    the worker's import path, the system's libraries and CPU facts, the devices; writes only to
    ``tmp``. No root holds a protected directory (D215)."""
    import site
    import sysconfig

    protected = protected_dirs(keys)
    paths = sysconfig.get_paths()
    wanted = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, paths["stdlib"],
              paths["platstdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages(),
              os.path.dirname(os.path.realpath(sys.executable)), *child_path(), *SYSTEM_READ, *_mapped_dirs()]
    read = [r for p in dict.fromkeys(wanted) if os.path.exists(p) for r in narrowed(p, protected)]
    devices = [p for p in DEVICES if os.path.exists(p)]
    gpus = sorted(os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia")) \
        if os.path.isdir("/dev") else []
    if gpus:  # CUDA reads the PCI tree and the driver's parameters as it starts
        pci = sorted(os.path.join("/sys/devices", n) for n in os.listdir("/sys/devices") if n.startswith("pci")) \
            if os.path.isdir("/sys/devices") else []
        read += [r for p in (*GPU_READ, *pci) if os.path.exists(p) for r in narrowed(p, protected)]
    devices += gpus
    spec = {"read": list(dict.fromkeys(read)), "devices": devices, "write": [os.path.realpath(tmp)]}
    reach = reaches(spec, protected)
    assert not reach, f"a stage's sandbox would reach a key directory: {reach}"
    return spec


def reaches(spec: dict, protected: list[str]) -> list[str]:
    """The roots of ``spec`` that hold (or lie in) a protected directory: none, always."""
    return [r for key in ("read", "devices", "write") for r in spec[key]
            if any(_within(p, r) or _within(r, p) for p in protected)]


def _add(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since the worker looked: nothing to allow
    try:
        if not os.path.isdir(path):
            access &= FILE_RIGHTS
        attr = _PathBeneath(access, fd)
        ret, err = _syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                            ctypes.byref(attr), ctypes.c_uint32(0))
        if ret != 0:
            raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def sandbox(spec: dict) -> str:
    """Confine this process to ``spec`` (D214), irreversibly; returns what it could not confine
    (empty when all of it holds). Call before any untrusted code runs."""
    abi = landlock_abi()
    if abi < 1:
        return "no Landlock in this kernel: a stage can read what its user can read and signal its user's processes"
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) \
        | (FS_IOCTL_DEV if abi >= 5 else 0)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16  # older kernels reject the unknown field
    ruleset, err = _syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                            ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock refused a ruleset: {os.strerror(err)}"
    try:
        for path in spec["read"]:
            _add(ruleset, path, READ)
        for path in spec["devices"]:
            _add(ruleset, path, READ | DEVICE)
        _add(ruleset, "/proc/self", READ)
        for path in spec["write"]:
            _add(ruleset, path, handled)
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return "no_new_privs refused: no Landlock sandbox"
        ret, err = _syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0))
        if ret != 0:
            return f"Landlock refused to restrict: {os.strerror(err)}"
    finally:
        os.close(ruleset)
    if not scoped:
        return f"Landlock ABI {abi} (< 6): a stage can still signal its user's processes"
    return ""


def confine(spec: dict) -> str:
    """The stage process's first act: non-dumpable (D189), then the sandbox (D214); returns what
    does not hold, for every answer's note."""
    non_dumpable()
    try:
        return sandbox(spec)
    except OSError as exc:  # a rule the kernel refused: nothing was restricted
        return f"no Landlock sandbox: {exc}"[:300]

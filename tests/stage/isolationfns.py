"""Stages that try to reach beyond their arguments: each reports what it met (docs/stages.md)."""
import os
import signal as _signal
import sys
import tempfile


def _try(action):
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "done"


def read_memory(pid):
    return _try(lambda: open(f"/proc/{pid}/mem", "rb").close())


def read_file(path):
    return _try(lambda: open(path, "rb").read())


def signal(pid):
    return _try(lambda: os.kill(pid, 0))


def stop_or_terminate(pid):
    """SIGSTOP and SIGTERM, sent only where the harmless probe failed: a test must not stop its own worker."""
    probe = signal(pid)
    if probe == "done":
        return {"probe": probe}
    return {"probe": probe, "SIGSTOP": _try(lambda: os.kill(pid, _signal.SIGSTOP)),
            "SIGTERM": _try(lambda: os.kill(pid, _signal.SIGTERM))}


def write_file(path):
    def write():
        with open(path, "w") as f:
            f.write("from a stage")
    return _try(write)


def write_temp():
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(b"scratch")
    return f.name


def surroundings():
    return {"uid": os.getuid(), "isolated": sys.flags.isolated, "path": list(sys.path),
            "env": sorted(os.environ), "msgpack": sys.modules["msgpack"].__file__, "fds": sorted(os.listdir("/proc/self/fd"))}

"""Stages that try to reach beyond their arguments: each reports what it met (docs/stages.md)."""
import os
import sys


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


def surroundings():
    return {"uid": os.getuid(), "isolated": sys.flags.isolated, "path": list(sys.path),
            "env": sorted(os.environ), "msgpack": sys.modules["msgpack"].__file__, "fds": sorted(os.listdir("/proc/self/fd"))}

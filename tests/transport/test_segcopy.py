"""The worker's copy through a client's segment (D180): a SIGBUS that a truncated segment raises
under a copy stops that copy, which says so; the process lives on. Any other SIGBUS still ends the
process, with or without Python's faulthandler."""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from fusion_shim.transport import shm, shm_worker

_segcopy = shm_worker.guarded_copy()  # this checkout's build, or the installed package's
pytestmark = [pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine"),
              pytest.mark.skipif(_segcopy is None, reason="fusion_shim._segcopy is not built (not POSIX)")]

N = 1 << 20


@pytest.fixture
def mapped():
    """A 1 MiB file in /dev/shm, mapped read-write, and its fd (to truncate it with)."""
    path = os.path.join(shm.SHM_DIR, f"fs-segcopy-test-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    os.ftruncate(fd, N)
    mm = mmap.mmap(fd, N, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    view = memoryview(mm)
    yield view, fd
    view.release()
    mm.close()
    os.close(fd)


def test_a_copy_moves_the_bytes_both_ways(mapped):
    view, _ = mapped
    src = np.random.default_rng(0).integers(0, 256, N, dtype=np.uint8)
    assert _segcopy.copy(view, src) is True
    out = np.zeros(N, np.uint8)
    assert _segcopy.copy(out, view) is True
    np.testing.assert_array_equal(out, src)
    assert _segcopy.copy(bytearray(0), b"") is True


def test_a_copy_out_of_a_truncated_segment_stops_and_says_so(mapped):
    view, fd = mapped
    _segcopy.copy(view, np.full(N, 7, np.uint8))
    os.ftruncate(fd, 4096)
    before = _segcopy.faults()
    out = np.zeros(N, np.uint8)
    assert _segcopy.copy(out, view) is False
    assert _segcopy.faults() == before + 1
    assert _segcopy.copy(out[:4096], view[:4096]) is True  # what is left of the file still reads
    assert (out[:4096] == 7).all()


def test_a_copy_into_a_truncated_segment_stops_and_does_not_grow_it(mapped):
    view, fd = mapped
    os.ftruncate(fd, 0)
    assert _segcopy.copy(view, np.ones(N, np.uint8)) is False
    assert os.fstat(fd).st_size == 0


def test_the_buffers_must_be_as_long_and_the_target_writable():
    with pytest.raises(ValueError):
        _segcopy.copy(bytearray(3), b"four")
    with pytest.raises((TypeError, BufferError)):
        _segcopy.copy(b"read-only", b"read-only")
    with pytest.raises(TypeError):
        _segcopy.copy(bytearray(1))


def test_a_fault_stops_only_the_copy_of_the_thread_that_met_it(mapped):
    """The guard is per thread: another thread's copies, running meanwhile, all complete."""
    view, fd = mapped
    src, dst = np.arange(N, dtype=np.uint8), np.zeros(N, np.uint8)
    stop, results = threading.Event(), []

    def copies() -> None:
        while not stop.is_set():
            results.append(_segcopy.copy(dst, src))

    other = threading.Thread(target=copies)
    other.start()
    try:
        os.ftruncate(fd, 0)
        assert all(_segcopy.copy(np.zeros(N, np.uint8), view) is False for _ in range(20))
    finally:
        stop.set()
        other.join(60)
    assert results and all(results)
    np.testing.assert_array_equal(dst, src)


UNGUARDED = """
import mmap, os
from fusion_shim.transport.shm_worker import guarded_copy
guarded_copy().copy(bytearray(1), b"x")  # the handler is in place
fd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o600)
os.unlink({path!r})
os.ftruncate(fd, 8192)
mm = mmap.mmap(fd, 8192)
os.ftruncate(fd, 0)
print(mm[5000])  # a fault outside any copy
print("survived")
"""


@pytest.mark.parametrize("faulthandler", [False, True])
def test_a_sigbus_outside_a_copy_still_ends_the_process(faulthandler):
    path = os.path.join(shm.SHM_DIR, f"fs-segcopy-unguarded-{os.getpid()}-{int(faulthandler)}")
    code = UNGUARDED.format(path=path)
    run = subprocess.run([sys.executable, *(["-X", "faulthandler"] if faulthandler else []), "-c", code],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGBUS, (run.returncode, run.stderr[-500:])
    assert "survived" not in run.stdout
    if faulthandler:  # the handler that was there before ours still ran
        assert "Bus error" in run.stderr


def test_a_sigbus_sent_by_kill_still_ends_the_process():
    code = ("import os, signal\nfrom fusion_shim.transport.shm_worker import guarded_copy\n"
            "guarded_copy().copy(bytearray(1), b'x')\nos.kill(os.getpid(), signal.SIGBUS)\nprint('survived')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGBUS and "survived" not in run.stdout


@pytest.mark.parametrize("then", ["faulthandler", "signal"])
def test_a_handler_installed_after_the_first_copy_does_not_disarm_the_guard(then):
    """A library that sets its own SIGBUS handler after the first copy (faulthandler enabled again,
    Python's signal module) must not turn the next truncated segment into a crash."""
    path = os.path.join(shm.SHM_DIR, f"fs-segcopy-late-{os.getpid()}-{then}")
    replace = ("import faulthandler; faulthandler.enable()" if then == "faulthandler" else
               "import signal; signal.signal(signal.SIGBUS, lambda *a: None)")
    code = (f"import mmap, os\nfrom fusion_shim.transport.shm_worker import guarded_copy\n"
            f"copy = guarded_copy().copy\nfd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            f"os.unlink({path!r})\nos.ftruncate(fd, {N})\n"
            f"view = memoryview(mmap.mmap(fd, {N}, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))\n"
            f"assert copy(view, bytes({N}))\n{replace}\nos.ftruncate(fd, 4096)\n"
            f"print('stopped' if copy(bytearray({N}), view) is False else 'copied')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "stopped", (run.returncode, run.stderr[-500:])

"""The same-host shared-memory lane (issue 9): same answers, results that are the program's own
writable arrays without a copy, segments reused, malformed locators refused, and no segment left in
/dev/shm after a SIGKILL of the client or of the worker.

The crash tests use real processes on ipc:// sockets; tests/catalog/test_shm_differential.py runs the whole
differential table through the lane.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fusion_shim
from fusion_shim.protocol import messages, wire
from fusion_shim.config import Config, ConfigError
from fusion_shim.transport import Channel, shm, shm_client
from fusion_shim.transport.principal import ANON

from tests.helpers.shims import READY_S, last_record

pytestmark = pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine")


def names_of(pid: int) -> list[str]:
    """The segment names in /dev/shm owned by process ``pid``."""
    tag = shm.owner_tag(pid).rsplit("-", 1)[0]  # namespace and pid (the start time is read live)
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"{shm.PREFIX}{tag}-"))


@pytest.fixture
def every_buffer_on_shm(monkeypatch):
    monkeypatch.setattr(shm_client, "MIN_BYTES", 0)  # where the client reads it


# --- results are the program's arrays, on reused segments ---------------------------------------------

def test_result_is_a_writable_view_on_a_segment_that_is_reused(inproc_worker):
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True)
    try:
        assert rt.link.wait_ready(READY_S)
        pool = rt.link.shm()
        a, b = np.random.default_rng(0).standard_normal((2, 256, 256))
        c = np.matmul(a, b)
        assert isinstance(c.base, shm._Lease) and c.flags.writeable and c.flags.c_contiguous
        np.testing.assert_allclose(c, np.matmul.__wrapped__(a, b), rtol=1e-12, atol=1e-12 * 256)
        rec = last_record(rt)
        assert rec.shm_sent == a.nbytes + b.nbytes and rec.shm_received == c.nbytes
        assert rec.bytes_received < 2048  # the result did not travel on the socket
        c[0, 0] = 42.0  # the program owns it
        view = c[::2]
        created = pool.stats["segments_created"]
        del c
        np.matmul(a, b)  # the held view keeps its segment out of the pool
        assert pool.stats["segments_created"] == created + 1
        assert view[0, 0] == 42.0
        del view
        for _ in range(3):  # now every segment comes back: no new ones
            np.matmul(a, b)
        assert pool.stats["segments_created"] == created + 1
        assert names_of(os.getpid()) == [], "names stay in /dev/shm after the worker mapped them"
    finally:
        fusion_shim.uninstall()


def test_a_full_dev_shm_sends_the_call_through_the_socket_and_says_so(inproc_worker, monkeypatch):
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True)
    try:
        assert rt.link.wait_ready(READY_S) and rt.link.shm() is not None

        def full(self, role, nbytes):
            raise shm.ShmError("no space left on /dev/shm")

        monkeypatch.setattr(shm_client.ShmPool, "acquire", full)
        a, b = np.random.default_rng(1).standard_normal((2, 256, 256))
        c = np.matmul(a, b)
        np.testing.assert_allclose(c, np.matmul.__wrapped__(a, b), rtol=1e-12, atol=1e-12 * 256)
        rec = last_record(rt)
        assert rec.kind == "worker" and rec.shm_sent == 0 and rec.bytes_sent > a.nbytes + b.nbytes
        assert not isinstance(c.base, shm._Lease)
        assert any("no space left on /dev/shm" in e and "through the socket" in e for _, e in rt.ledger.events)
    finally:
        fusion_shim.uninstall()


def test_shm_off_by_config(inproc_worker):
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True, shm="0")
    try:
        assert rt.link.wait_ready(READY_S)
        a = np.ones((256, 256))
        np.matmul(a, a)
        rec = last_record(rt)
        assert rt.link.shm() is None and rec.shm_sent == 0 and rec.bytes_sent > a.nbytes
    finally:
        fusion_shim.uninstall()
    with pytest.raises(ConfigError, match="valid: auto, 0"):
        Config.load(env={"FUSION_SHIM_SHM": "yes"})


def test_no_shm_over_tcp():
    from fusion_shim.worker.server import Worker

    w = Worker.__new__(Worker)
    w.shm, w.max_bytes = None, 1 << 20
    w.enable_shm("tcp://127.0.0.1:5555")
    assert w.shm is None
    w.enable_shm("ipc:///tmp/x.sock")
    assert w.shm is not None


# --- validation ------------------------------------------------------------------------------------------

def test_a_shm_meta_without_negotiation_is_refused():
    meta = {"dtype": "<f8", "shape": [4], "order": "C", "shm": {"name": "fshm-1-2-3-i4", "offset": 0}}
    frames = [__import__("msgpack").packb({"v": wire.VERSION, "t": "call", "id": 1, "arrays": [meta]})]
    with pytest.raises(wire.WireError, match="not negotiated"):
        wire.decode(frames)


def test_mapper_refuses_bad_locators():
    pool = shm.ShmPool()
    mapper = shm.ShmMapper().acting_for(ANON)
    try:
        seg = pool.acquire("i", 1000)
        dt = np.dtype("f8")
        with pytest.raises(wire.WireError, match="not a fusion_shim segment"):
            mapper.array({"name": "../etc/passwd", "offset": 0}, dt, (1,), "C")
        with pytest.raises(wire.WireError, match="overruns"):
            mapper.array({"name": seg.name, "offset": seg.size - 8, "nbytes": 16}, dt, (2,), "C")
        with pytest.raises(wire.WireError, match="offset"):
            mapper.array({"name": seg.name, "offset": -1}, dt, (1,), "C")
        with pytest.raises(wire.WireError, match="cannot open"):
            mapper.array({"name": seg.name[:-1] + "9999", "offset": 0}, dt, (1,), "C")
        out = pool.acquire("o", 1000)
        with pytest.raises(wire.WireError, match="cannot serve as an input"):
            mapper.array({"name": out.name, "offset": 0}, dt, (1,), "C")
        x = mapper.array({"name": seg.name, "offset": 0}, dt, (4,), "C")
        assert not x.flags.writeable  # inputs are mapped read-only on the worker
        staged = shm.Staged(pool, [(dt, (8192,))])
        with pytest.raises(wire.WireError, match="did not offer"):
            staged.array({"name": seg.name, "offset": 0}, dt, (8192,), "C")
    finally:
        pool.close()


def test_a_segment_already_open_is_refused_where_a_new_one_would_be():
    """D79: an input read from a segment the mapper holds skips the name's parse, not its checks."""
    pool = shm.ShmPool()
    mapper = shm.ShmMapper()
    other = ANON._replace(name="uid:other")
    try:
        seg, out = pool.acquire("i", 1000), pool.acquire("o", 1000)
        dt = np.dtype("f8")
        mapper.array({"name": seg.name, "offset": 0}, dt, (4,), "C", ANON)  # opened
        assert mapper.out_slot({"name": out.name, "offset": 0, "nbytes": 8}, 8, ANON) is not None
        for offset in (-1, True, 1.0, "0"):
            with pytest.raises(wire.WireError, match="offset"):
                mapper.array({"name": seg.name, "offset": offset}, dt, (1,), "C", ANON)
        with pytest.raises(wire.WireError, match="No such file"):
            mapper.array({"name": seg.name, "offset": 0}, dt, (1,), "C", other)
        with pytest.raises(wire.WireError, match="cannot serve as an input"):
            mapper.array({"name": out.name, "offset": 0}, dt, (1,), "C", ANON)
        with pytest.raises(wire.WireError, match="overruns"):
            mapper.array({"name": seg.name, "offset": seg.size - 8}, dt, (2,), "C", ANON)
        assert mapper.take_new() == [seg.name, out.name]  # nothing opened twice
    finally:
        pool.close()


def test_worker_answers_a_bad_segment_with_an_error_and_stays_up(every_buffer_on_shm):
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    w.enable_shm("inproc://x")
    meta = {"dtype": "<f8", "shape": [2, 2], "order": "C", "shm": {"name": f"fshm-{shm.owner_tag()}-i77777", "offset": 0}}
    frames = [__import__("msgpack").packb({"v": wire.VERSION, "t": "call", "id": 3, "op": "matmul",
                                           "params": {"cdtype": "<f8"}, "layouts": ["C"], "arrays": [meta, meta]})]
    header, _ = wire.decode(w.handle(frames))
    assert header["t"] == "error" and header["kind"] == "bad_request" and "cannot open" in header["msg"]


# --- crashes: nothing left in /dev/shm ---------------------------------------------------------------

def _start_worker(tmp_path, *extra):
    url = f"ipc://{tmp_path}/w.sock"
    entry = ["fusion_shim.worker.testing"] if extra else ["fusion_shim", "worker"]  # the testing worker takes --delay
    proc = subprocess.Popen([sys.executable, "-m", *entry, "--bind", url, "--device", "cpu", *extra],
                            stderr=subprocess.DEVNULL)
    return url, proc


def _worker_stats(url):
    chan = Channel(url)
    try:
        return chan.request(messages.stats_request(1), time.monotonic() + 30).header
    finally:
        chan.close()


WAIT_S = 120.0  # for something that surely happens: a deadline only a broken run reaches


def _wait(cond, seconds=WAIT_S):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


CLIENT = textwrap.dedent("""
    import sys, numpy as np, fusion_shim
    rt = fusion_shim.install(policy="remote", worker=sys.argv[1], quiet=True, timeout=60)
    assert rt.link.wait_ready(600)
    a = np.ones((512, 512))
    kept = np.matmul(a, a)          # a result the program holds, on a segment
    b = np.ones((600, 600))         # another size: new segments, their names still in /dev/shm
    c = np.ones((600, 600))         # a second input (one passed twice is placed once)
    print("calling", flush=True)
    while True:                     # the worker holds each one (--delay): killed during one,
        np.matmul(b, c)             # however late the test, busy with others, looks
""")


def test_sigkill_of_the_client_leaves_no_segment(tmp_path):
    url, worker = _start_worker(tmp_path, "--delay", "1.5")
    client = None
    try:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, url], stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "calling"
        assert _wait(lambda: len(names_of(client.pid)) >= 3, WAIT_S), "the call's segments never appeared"
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert names_of(client.pid), "nothing to clean: the test did not catch the window it is about"
        assert _wait(lambda: not names_of(client.pid), WAIT_S), f"left behind: {names_of(client.pid)}"
        # its mappings are gone too; the names were unlinked by the worker's sweep, or by any client
        # starting meanwhile (each sweeps dead owners' names: a parallel test's may come first)
        assert _wait(lambda: _worker_stats(url)["shm_live"] == 0, WAIT_S), _worker_stats(url)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        worker.kill()
        worker.wait()


def test_sigkill_of_the_worker_leaves_no_segment(tmp_path):
    url, worker = _start_worker(tmp_path, "--delay", "0.5")
    rt = fusion_shim.install(policy="remote", worker=url, quiet=True, timeout=2.0)
    try:
        assert rt.link.wait_ready(READY_S)
        a = np.random.default_rng(1).standard_normal((256, 256))
        np.matmul(a, a)
        assert last_record(rt).kind == "worker" and last_record(rt).shm_sent > 0
        threading.Timer(0.2, worker.kill).start()
        got = np.matmul(a, a)  # the worker dies holding it: computed here instead
        rec = last_record(rt)
        assert rec.kind == "fallback", rec
        np.testing.assert_array_equal(got, np.matmul.__wrapped__(a, a))
        worker.wait()
        assert names_of(worker.pid) == []  # the worker never owns a segment
        left = [n for n in names_of(os.getpid()) if shm.parse(n)[3] != "p"]  # not the new handshake's probe
        assert left == [], "the abandoned call's segments were not retired"
        assert rt.link.shm().stats["retired"] >= 1  # its result slot (the inputs went by reference: residency)
    finally:
        fusion_shim.uninstall()
        worker.kill()
        worker.wait()
    assert names_of(os.getpid()) == []


def test_embedded_worker_sweeps_its_dead_client(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, fusion_shim
        from fusion_shim.transport import shm
        rt = fusion_shim.install(policy="remote", quiet=True)
        assert rt.link.wait_ready(600) and rt.link.shm() is not None
        np.matmul(np.ones((256, 256)), np.ones((256, 256)))
        seg = rt.link.shm().acquire("i", 1 << 20)   # created, never sent: its name is still there
        print(rt.link.proc.pid, flush=True)
        import time; time.sleep(60)
    """)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker_pid = int(client.stdout.readline())
    assert names_of(client.pid), "the test segment is missing"
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert _wait(lambda: not names_of(client.pid), WAIT_S), f"left behind: {names_of(client.pid)}"
    assert _wait(lambda: shm.proc_start(worker_pid) is None, WAIT_S), "the embedded worker outlived its client"


def test_a_new_client_sweeps_names_of_dead_owners():
    leaver = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        from fusion_shim.transport import shm
        pool = shm.ShmPool()
        print(pool.acquire("o", 4096).name, flush=True)
        import time; time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    name = leaver.stdout.readline().strip()
    leaver.send_signal(signal.SIGKILL)
    leaver.wait()
    foreign = f"{shm.PREFIX}1-{leaver.pid}-0-i1"  # another pid namespace: never judged
    open(os.path.join(shm.SHM_DIR, foreign), "wb").close()
    mine = shm.ShmPool()
    live = mine.acquire("i", 4096)
    try:
        assert os.path.exists(os.path.join(shm.SHM_DIR, name))
        rt = fusion_shim.install(policy="remote", worker="inproc://fusion-shim-nobody", quiet=True)
        fusion_shim.uninstall()
        assert not os.path.exists(os.path.join(shm.SHM_DIR, name))
        assert any("left by dead processes" in what for _, what in rt.ledger.events)
        assert os.path.exists(os.path.join(shm.SHM_DIR, foreign))
        assert os.path.exists(os.path.join(shm.SHM_DIR, live.name))  # a live owner's: kept
    finally:
        os.unlink(os.path.join(shm.SHM_DIR, foreign))
        mine.close()


def test_a_forked_child_does_not_write_into_the_parents_result(inproc_worker, monkeypatch):
    """Result arrays live in MAP_SHARED segments, where ordinary NumPy memory is copy-on-write after
    fork: the child gets private copies at the same addresses (transport.shm._privatize_after_fork)."""
    rt = fusion_shim.install(policy="remote", worker=inproc_worker, quiet=True)
    try:
        assert rt.link.wait_ready(READY_S)
        c = np.matmul(np.ones((256, 256)), np.ones((256, 256)))
        assert isinstance(c.base, shm._Lease)

        def child_writes() -> int:
            pid = os.fork()
            if pid == 0:
                ok = c[0, 0] == 256.0 and c.sum() == 256.0 ** 3  # the child sees the result
                c[:] = 999.0
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)

        assert child_writes() == 0
        assert c.max() == 256.0, "the child's write reached the parent's result"
        monkeypatch.setattr(shm_client, "_POOLS", set())  # without the fork handler's work ...
        assert child_writes() == 0
        assert c.max() == 999.0  # ... the write would be shared: the test has teeth
    finally:
        fusion_shim.uninstall()


def test_the_workers_idle_input_buffers_are_unmapped_when_a_run_ends():
    """D195: buffers kept for reuse are given back once a principal's run ended; one still under an
    array stays mapped until that array goes."""
    import gc

    from fusion_shim.transport.shm_worker import ShmMapper

    mapper = ShmMapper()
    kept, dropped = mapper._buffers.take(1 << 20), mapper._buffers.take(3 << 20)
    dropped_size = dropped.nbytes
    del dropped
    gc.collect()  # the finalizer hands the buffer back
    assert mapper.release() == dropped_size
    assert mapper._buffers._idle == 0 and not mapper._buffers._free
    kept[:] = 7  # still mapped and writable
    del kept
    gc.collect()
    assert mapper.release() >= 1 << 20 and mapper.release() == 0

"""A client that truncates its own segment after the worker used it cannot crash the worker: the
worker copies inputs out of a mapping of the segment and results into it with the C extension's
copy, which a SIGBUS stops (D180), or, without the extension, through the segment's fd (D67). Each
process test runs on both. An input cut short is answered with an error; a result slot cut short,
before the call or while its kernel runs, gets the result inline. The worker keeps its pid and
serves an honest client correctly afterwards. The attacker is a raw ZeroMQ client of its own; the
worker a real process."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time

import msgpack
import numpy as np
import pytest
import zmq

from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.fingerprint import fingerprint
from fusion_shim.transport import Channel, shm, shm_worker

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine")

N = 64 * 1024           # float64 elements: 512 KiB, above the lane's threshold
START_S = 180.0         # a worker's start and warm-up on a loaded 2-core host
REPLY_S = 60.0
_SEQ = itertools.count(900_000)  # far above the honest pool's names of this process
_MADE: list[str] = []
# how the worker copies: through a mapping with the C extension's copy (where it is built), or its fds
COPIES = ["mapped", "fd"] if shm_worker.guarded_copy() is not None else ["fd"]
FD_ONLY = ("import runpy, fusion_shim.transport.shm_worker as m; m.COPY = None; "
           "runpy.run_module({mod!r}, run_name='__main__', alter_sys=True)")


@pytest.fixture(autouse=True)
def _unlink_segments():
    yield
    while _MADE:
        path = _MADE.pop()
        if os.path.exists(path):
            os.unlink(path)


def segment(role: str, data: np.ndarray | None = None) -> tuple[str, str]:
    """A segment of N float64 of this process, as a file it can truncate: its name and path."""
    name = f"{shm.PREFIX}{shm.owner_tag()}-{role}{next(_SEQ)}"
    path = os.path.join(shm.SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, N * 8)
        if data is not None:
            os.pwrite(fd, data.tobytes(), 0)
    finally:
        os.close(fd)
    _MADE.append(path)
    return name, path


class Attacker:
    """Its own connection, its own segments, its own request ids."""

    def __init__(self, url: str, proc: subprocess.Popen):
        self.proc = proc
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.rid = itertools.count(1000)

    def echo(self, src: str | np.ndarray, slot: str | None = None) -> list:
        """An ``echo`` of an input in segment ``src`` (or inline), its result offered ``slot``."""
        self.last_id = next(self.rid)
        header = messages.call_header(self.last_id, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", (N,))])
        extra = {"out_shm": [{"name": slot, "offset": 0, "nbytes": N * 8}]} if slot else {}
        if isinstance(src, np.ndarray):
            frames = messages.Request(header, [wire.to_wire(src)]).frames(**extra)
        else:
            meta = {"dtype": "<f8", "shape": [N], "order": "C", "shm": {"name": src, "offset": 0}}
            frames = [msgpack.packb({"v": wire.VERSION, **header, "arrays": [meta], **extra})]
        self.sock.send_multipart(frames)
        return self.reply()

    def reply(self) -> list:
        deadline = time.monotonic() + REPLY_S
        while time.monotonic() < deadline:
            if self.sock.poll(200):
                return self.sock.recv_multipart()
            assert self.proc.poll() is None, f"the worker died (exit status {self.proc.returncode})"
        raise AssertionError("no reply")

    def close(self) -> None:
        self.sock.close(0)


def _result(frames: list, slot_path: str | None = None) -> tuple[dict, np.ndarray]:
    """A reply's header and its one result, read from the attacker's slot file where it lies there."""
    header = wire.decode_header(frames[0])
    assert header["t"] == "result", header
    if "shm" in header["arrays"][0]:
        with open(slot_path, "rb") as f:
            return header, np.frombuffer(f.read(N * 8), np.float64)
    return header, wire.decode(frames)[1][0]


class Honest:
    """A client as the library makes one: a channel and one pool of segments for this worker."""

    def __init__(self, url: str, proc: subprocess.Popen):
        self.proc, self.pool = proc, shm.ShmPool()
        self.chan = Channel(url, lane=lambda: self.pool)

    def hello(self) -> dict:
        offer, probe = shm.make_probe()
        try:
            hello = messages.hello(1, offer)._replace(by_socket=True)  # no segment drops on it
            return self.chan.request(hello, time.monotonic() + START_S).header
        finally:
            probe.unlink()

    def matmul(self, rid: int) -> None:
        """The right answer, back on a result segment, and the worker still the same process."""
        rng = np.random.default_rng(rid)
        a, b = (rng.integers(-3, 4, (256, 256)).astype(np.float64) for _ in range(2))  # exact sums
        header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [("<f8", (256, 256))])
        req = messages.Request(header, [wire.to_wire(a), wire.to_wire(b)], results=[(np.dtype("<f8"), (256, 256))])
        answer = self.chan.request(req, time.monotonic() + REPLY_S)
        assert answer.header["t"] == "result", answer.header
        assert isinstance(answer.arrays[0].base, shm._Lease)  # through shared memory
        np.testing.assert_array_equal(answer.arrays[0], a @ b)
        assert answer.shm_sent == a.nbytes + b.nbytes
        assert self.hello()["pid"] == self.proc.pid and self.proc.poll() is None

    def close(self) -> None:
        self.pool.close()
        self.chan.close()


def _start(copy: str, testing: bool = False):
    d = tempfile.mkdtemp(prefix="fs-trunc-", dir="/tmp")
    url = f"ipc://{d}/w.sock"
    mod, args = ("fusion_shim.worker.testing", ["--delay", "1.5"]) if testing else ("fusion_shim", ["worker"])
    run = ["-m", mod] if copy == "mapped" else ["-c", FD_ONLY.format(mod=mod)]
    proc = subprocess.Popen([sys.executable, *run, *args, "--bind", url, "--device", "cpu"], stderr=subprocess.DEVNULL)
    honest = Honest(url, proc)
    ready = honest.hello()
    assert ready["t"] == "ready" and ready["shm"]["ok"] and ready["pid"] == proc.pid, ready
    return proc, honest, Attacker(url, proc), d


def _stop(proc, honest, attacker, d) -> None:
    attacker.close()
    honest.close()
    proc.kill()
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", params=COPIES)
def worker(request):
    started = _start(request.param)
    yield (*started[:3], request.param)
    _stop(*started)


def _maps(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` mapped."""
    with open(f"/proc/{pid}/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


def test_an_input_truncated_after_the_worker_read_it_is_an_error_and_the_worker_stays_up(worker):
    proc, honest, attacker, copy = worker
    x = np.arange(N, dtype=np.float64)
    name, path = segment("i", x)
    header, y = _result(attacker.echo(name))
    np.testing.assert_array_equal(y, x)
    assert name in header.get("shm_mapped", [])
    assert _maps(proc.pid, path) == (copy == "mapped")  # the copy this run means to test
    os.truncate(path, 0)
    header = wire.decode_header(attacker.echo(name)[0])
    assert header["t"] == "error" and header["kind"] == "bad_request", header
    assert header["id"] == attacker.last_id  # its own reply, which a client waits for
    assert "truncated" in header["msg"], header
    assert proc.poll() is None
    honest.matmul(10)


def test_a_result_slot_truncated_after_the_worker_wrote_it_gets_the_result_inline(worker):
    proc, honest, attacker, _ = worker
    x = np.arange(N, dtype=np.float64) * 3
    slot, path = segment("o")
    header, y = _result(attacker.echo(x, slot), path)
    assert "shm" in header["arrays"][0]  # written into the slot
    np.testing.assert_array_equal(y, x)
    os.truncate(path, 0)
    header, y = _result(attacker.echo(-x, slot), path)
    assert "shm" not in header["arrays"][0]  # the slot is gone: inline, and right
    np.testing.assert_array_equal(y, -x)
    assert os.stat(path).st_size == 0  # the worker did not write it back to life
    assert proc.poll() is None
    honest.matmul(20)


@pytest.mark.parametrize("copy", COPIES)
def test_a_result_slot_truncated_while_its_kernel_runs_gets_the_result_inline(copy):
    started = _start(copy, testing=True)  # each call held 1.5 s before its kernel
    proc, honest, attacker, _ = started
    try:
        x = np.arange(N, dtype=np.float64) + 0.5
        slot, path = segment("o")
        header, y = _result(attacker.echo(x, slot), path)
        assert "shm" in header["arrays"][0]
        attacker.sock.send_multipart(messages.Request(
            messages.call_header(7, "echo", {"cdtype": "<f8"}, ["C"], [("<f8", (N,))]), [wire.to_wire(-x)]
        ).frames(out_shm=[{"name": slot, "offset": 0, "nbytes": N * 8}]))
        time.sleep(0.7)  # admitted: its slot checked, its kernel not yet run
        os.truncate(path, 0)
        header, y = _result(attacker.reply(), path)
        assert "shm" not in header["arrays"][0]
        np.testing.assert_array_equal(y, -x)
        assert proc.poll() is None
        honest.matmul(30)
    finally:
        _stop(*started)


def test_an_input_the_worker_keeps_is_not_overwritten_by_the_next_one():
    """A kept input holds the worker's buffer it was read into: the next input goes elsewhere."""
    from fusion_shim.worker.server import Worker

    w = Worker("cpu")
    w.enable_shm("inproc://x")
    a = np.arange(N, dtype=np.float64)
    meta = {"dtype": "<f8", "shape": [N], "order": "C"}
    fp = fingerprint(meta, a.view(np.uint8))

    def call(rid: int, m: dict) -> np.ndarray:
        frames = [msgpack.packb({"v": wire.VERSION, "t": "call", "id": rid, "op": "echo", "params": {"cdtype": "<f8"},
                                 "layouts": ["C"], "arrays": [m], "results": [{"dtype": "<f8", "shape": [N]}]})]
        header, arrays = wire.decode(w.handle(frames))
        assert header["t"] == "result", header
        return arrays[0]

    first, _ = segment("i", a)
    call(1, {**meta, "fp": fp, "shm": {"name": first, "offset": 0}})
    assert w.store.holds(w.principal.name, fp)
    second, _ = segment("i", -a)
    np.testing.assert_array_equal(call(2, {**meta, "shm": {"name": second, "offset": 0}}), -a)
    np.testing.assert_array_equal(call(3, {**meta, "ref": True, "fp": fp}), a)


def test_a_principal_holds_at_most_its_share_of_segments_open():
    """Each segment held costs the worker an fd: past a principal's share a new input is refused
    and a new result slot declined (its result travels inline); the segments held still serve."""
    from fusion_shim.transport.principal import ANON

    mapper = shm.ShmMapper()
    mapper.per_principal = 2
    dt = np.dtype("<f8")
    held, _ = segment("i", np.ones(N))
    slot, _ = segment("o")
    mapper.array({"name": held, "offset": 0}, dt, (N,), "C", ANON)
    assert mapper.out_slot({"name": slot, "offset": 0, "nbytes": 8}, 8, ANON) is not None
    extra_in, _ = segment("i", np.ones(N))
    with pytest.raises(wire.WireError, match="holds 2 segments"):
        mapper.array({"name": extra_in, "offset": 0}, dt, (N,), "C", ANON)
    extra_out, _ = segment("o")
    assert mapper.out_slot({"name": extra_out, "offset": 0, "nbytes": 8}, 8, ANON) is None
    assert mapper.array({"name": held, "offset": 0}, dt, (N,), "C", ANON).tolist() == [1.0] * N
    mapper.drop([held, slot], ANON)
    assert mapper.array({"name": extra_in, "offset": 0}, dt, (N,), "C", ANON).sum() == N


def test_another_principals_segment_can_be_neither_read_nor_written():
    """D60: a segment belongs to the principal that first named it. Another naming it, as an input
    or as a result slot, is told what a name that does not exist tells it; a segment of another
    uid is refused to an ipc peer before it is opened for reading."""
    from fusion_shim.transport.principal import Principal

    uid = os.getuid()
    victim, other = Principal(f"uid:{uid}", uid), Principal("key:mallory", None)
    stranger = Principal(f"uid:{uid + 1}", uid + 1)  # an ipc peer of another user: simulated uid
    mapper = shm.ShmMapper()
    dt = np.dtype("<f8")
    secret = np.random.default_rng(3).standard_normal(N)
    held, _ = segment("i", secret)
    slot, slot_path = segment("o")
    assert mapper.array({"name": held, "offset": 0}, dt, (N,), "C", victim).tolist() == secret.tolist()
    taken = mapper.out_slot({"name": slot, "offset": 0, "nbytes": N * 8}, N * 8, victim)
    absent = f"{shm.PREFIX}{shm.owner_tag()}-i{next(_SEQ)}"
    with pytest.raises(wire.WireError) as nowhere:
        mapper.array({"name": absent, "offset": 0}, dt, (N,), "C", other)
    for who in (other, stranger):
        with pytest.raises(wire.WireError) as read:
            mapper.array({"name": held, "offset": 0}, dt, (N,), "C", who)
        assert str(read.value) == str(nowhere.value).replace(absent, held)
        with pytest.raises(wire.WireError, match="No such file"):
            mapper.out_slot({"name": slot, "offset": 0, "nbytes": N * 8}, N * 8, who)
    fresh, _ = segment("i", secret)
    with pytest.raises(wire.WireError, match="belongs to uid"):
        mapper.array({"name": fresh, "offset": 0}, dt, (N,), "C", stranger)
    assert mapper.stats_for(other) == {"shm_mapped": 0, "shm_dropped": 0, "shm_live": 0}
    mapper.drop([held, slot], other)  # another's drop forgets nothing of the victim's
    assert mapper.stats_for(victim)["shm_live"] == 2
    assert mapper.write(taken, np.ones(N)) and np.fromfile(slot_path).tolist() == [1.0] * N

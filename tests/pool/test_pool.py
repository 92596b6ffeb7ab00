"""A pool on a real local Ray cluster, strictly on loopback (a head started with ``ray start
--node-ip-address 127.0.0.1`` in a process group of its own, this process its driver): one cluster
for the module, which one test process runs whole (the suite runs `--dist loadfile`, D160), with two
logical GPUs on a machine that may have none (EMULATED: Ray accounts for them, torch sees no CUDA
device, the workers compute on the CPU). The cluster asks for a token: the module's own, in a file
only this user reads (never ``~/.ray``)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.environment import ROOT
from tests.pool.clusters import ONE_NODE_ON_LOOPBACK, start_head, stop_head, token_env, wait_for

ray = pytest.importorskip("ray")
from fusion_shim.pool import manage  # noqa: E402
from fusion_shim.reporting.trace import build_trace  # noqa: E402

PROGRAM = str(ROOT / "tests" / "pool" / "programs.py")
POOL = "t"
DEADLINE_S = 600.0  # generous: the machine is shared, and a worker Ray restarts imports torch and warms up again


@pytest.fixture(scope="module")
def cluster():
    """The head on loopback only, in a process group of its own; this process its driver. Ray's
    multi-node support is off in every process that joins it (in this one too: Ray read the variable at
    import), else each would resolve 127.0.0.1 to this host's own address (clusters.ONE_NODE_ON_LOOPBACK)."""
    directory = Path(tempfile.mkdtemp(prefix="rpt", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    env = {**token_env(directory), **ONE_NODE_ON_LOOPBACK}
    shared = ("RAY_AUTH_TOKEN_PATH", *ONE_NODE_ON_LOOPBACK)
    saved = {k: os.environ.get(k) for k in (*shared, "RAY_AUTH_MODE")}
    # the mode is the cluster's alone: this process presents the token as a pool command does (manage.connect)
    os.environ.update({k: env[k] for k in shared})
    os.environ.pop("RAY_AUTH_MODE", None)
    constants = ray._private.ray_constants
    enabled, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
    head = None
    try:
        head, address = start_head(directory, env, "--num-gpus", "2", "--object-store-memory", str(80 << 20),
                                   num_cpus=4)
        manage.connect(address, lambda text: None)
        yield address
    finally:
        ray.shutdown()
        if head is not None:
            stop_head(head)
        shutil.rmtree(directory, ignore_errors=True)
        constants.ENABLE_RAY_CLUSTER = enabled
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def pool(cluster):
    rows, made = manage.up(cluster, 2, "auto", name=POOL)
    assert made
    # warmed before the programs start: a run shorter than a worker's warm-up would use only the other
    wait_for(lambda: all(r["state"] == "ready" for r in manage.status(cluster, POOL)), "both workers warm")
    try:
        yield rows
    finally:
        manage.down(cluster, POOL)


def _shim(address: str, argv: list[str], report: str, timeout: float = DEADLINE_S, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fusion_shim", "--policy", "remote", "--pool", f"ray://{address}/{POOL}",
           "--report", report, "--quiet", PROGRAM, *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _plain(argv: list[str]) -> str:
    out = subprocess.run([sys.executable, PROGRAM, *argv], capture_output=True, text=True, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_pool_up_places_two_workers_on_emulated_gpus_and_a_second_up_makes_none(cluster, pool):
    assert [r["name"] for r in pool] == [f"{POOL}.0", f"{POOL}.1"]
    assert sorted(g for r in pool for g in r["ray_gpus"]) == ["0", "1"]  # num_gpus=1 each, one GPU apiece
    assert all(r["gpu_emulated"] for r in pool)  # no CUDA device behind Ray's GPUs here: labelled
    again, made = manage.up(cluster, 2, "auto", name=POOL)
    assert not made and [r["pid"] for r in again] == [r["pid"] for r in pool]
    assert manage.names(ray, POOL) == [f"{POOL}.0", f"{POOL}.1"]


def test_every_node_of_the_pools_cluster_and_every_worker_is_on_loopback(cluster, pool):
    nodes = ray.nodes()
    assert nodes and [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"] * len(nodes), nodes
    assert cluster.startswith("127.0.0.1:"), cluster
    rows = manage.status(cluster, POOL)
    assert len(rows) == 2 and all(r["ip"] == "127.0.0.1" and r["node"].endswith("@127.0.0.1")
                                  and r["url"].startswith("tcp://127.0.0.1:") for r in rows), rows


def _single_worker_cap() -> int:
    """A CPU worker's resident cap when alone on its host: a quarter of RAM, at most 8 GiB."""
    return min(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4, 8 << 30)


def test_two_workers_on_one_host_split_the_single_workers_cap(cluster, pool):
    budgets = [r["memory_budget"] for r in manage.status(cluster, POOL)]
    assert [r["sharing"] for r in pool] == [2, 2]  # one node: both bundles on it
    assert budgets == [_single_worker_cap() // 2] * 2 and sum(budgets) <= _single_worker_cap()


def test_a_worker_alone_on_its_host_gets_the_whole_cap(cluster):
    rows, made = manage.up(cluster, 1, "cpu", name="alone")
    try:
        assert made and rows[0]["sharing"] == 1
        assert rows[0]["memory_budget"] == _single_worker_cap()
    finally:
        manage.down(cluster, "alone")


def test_calls_through_the_pool_print_what_plain_python_prints_and_spread_over_both(cluster, pool, tmp_path):
    report = tmp_path / "r.json"
    proc = _shim(cluster, ["spread"], str(report))
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err[-3000:]
    assert out == _plain(["spread"])
    workers = json.loads(report.read_text())["pool"]["workers"]
    assert [w["name"] for w in workers] == [f"{POOL}.0", f"{POOL}.1"]
    assert all(w["calls"] > 0 for w in workers), (workers, json.loads(report.read_text())["events"])
    assert all(w["gpu_emulated"] and re.fullmatch(r"[0-9a-f]{8}@[0-9.]+", w["node"]) for w in workers), workers
    trace = build_trace(json.loads(report.read_text()))["traceEvents"]
    named = [e["args"]["name"] for e in trace if e["name"] == "process_name"]
    assert sorted(n.split(" on ")[0] for n in named if n.startswith("pool worker")) == [f"pool worker {POOL}.0",
                                                                                        f"pool worker {POOL}.1"]
    assert {e["pid"] for e in trace if e.get("cat") == "device"} == {w["pid"] for w in workers}
    assert any(e.get("cat") == "pool" for e in trace)  # the pool's events, as instants


def test_pool_status_shows_each_worker_with_its_calls(cluster, pool):
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "status", "--ray", cluster, "--name", POOL],
                         capture_output=True, text=True, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["worker", "node", "pid", "device", "state", "calls", "resident", "budget"]
    assert [ln.split()[0] for ln in lines[1:]] == [f"{POOL}.0", f"{POOL}.1"]
    assert all("EMULATED" in ln for ln in lines[1:])
    assert all(ln.split()[1].endswith("@127.0.0.1") for ln in lines[1:]), out.stdout  # every node on loopback
    half = manage.size_text(_single_worker_cap() // 2)
    assert all(ln.rstrip().endswith(f"{half} (2 on its host)") for ln in lines[1:]), out.stdout


def test_a_client_whose_key_was_not_given_gets_no_work_done(cluster, pool):
    import zmq

    from fusion_shim import transport
    from fusion_shim.protocol import messages

    actor = ray.get_actor(f"{POOL}.1")
    before = ray.get(actor.stats.remote(), timeout=60)
    public, secret = zmq.curve_keypair()
    chan = transport.Channel(before["url"], (before["server_key"], public, secret), None, None)
    try:
        with pytest.raises(transport.TransportError):
            chan.request(messages.hello(1), time.monotonic() + 3)
    finally:
        chan.close()
    assert ray.get(actor.stats.remote(), timeout=60)["calls"] == before["calls"]
    ray.get(actor.join.remote(public), timeout=60)  # the same key, given through Ray: served
    chan = transport.Channel(before["url"], (before["server_key"], public, secret), None, None)
    try:
        assert chan.request(messages.hello(2), time.monotonic() + 60).header["t"] == "ready"
    finally:
        chan.close()


def test_a_worker_killed_mid_run_is_restarted_by_ray_with_every_answer_right(cluster, pool, tmp_path):
    """The run goes on until the restarted actor has served one of its calls: waited for on the
    worker's own count through Ray, not for a number of rounds (its warm-up after a restart takes
    from seconds to minutes on a loaded machine)."""
    report = tmp_path / "r.json"
    progress = tmp_path / "progress"
    proc = _shim(cluster, ["until_stopped", str(tmp_path)], str(report))
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, "the first rounds")
        actor = ray.get_actor(f"{POOL}.0")
        old = ray.get(actor.describe.remote(), timeout=60)
        os.kill(old["pid"], signal.SIGKILL)

        wait_for(lambda: ray.get(actor.stats.remote(), timeout=120)["pid"] != old["pid"], "Ray's restart")
        # the client relocates on its next probe (backing off to 5 s) and sends once the worker is warm
        wait_for(lambda: ray.get(actor.stats.remote(), timeout=120)["calls"] > 0, "a call on the restarted worker")
        done = int(progress.read_text() or 0)
        wait_for(lambda: int(progress.read_text() or 0) >= done + 2, "rounds after it")
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    rounds = len(out.splitlines())
    (tmp_path / "plain").mkdir()
    assert out == _plain(["until_stopped", str(tmp_path / "plain"), "--rounds", str(rounds)])
    rep = json.loads(report.read_text())
    killed = rep["pool"]["workers"][0]
    assert killed["restarts"] >= 1 and killed["calls_since_restart"] > 0, killed
    assert any(f"pool worker {POOL}.0 restarted by Ray" in e["what"] for e in rep["events"]), rep["events"]


def test_pool_down_leaves_no_actor_process_or_socket(cluster):
    rows, made = manage.up(cluster, 1, "cpu", name="d")
    assert made and not rows[0]["ray_gpus"]
    host, port = rows[0]["url"].removeprefix("tcp://").rsplit(":", 1)
    assert len(manage.down(cluster, "d")) == 1
    assert manage.names(ray, "d") == []
    wait_for(lambda: not _pid_alive(rows[0]["pid"]), "the worker's process to end")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_pool_up_prints_no_warning_that_its_workers_cannot_be_restarted(cluster):
    """Ray warns, once a worker, that a restartable detached actor in a placement group is not restarted
    once the group is removed: only `pool down` removes it, to end them; a worker that dies is restarted."""
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "up", "--workers", "1", "--device", "cpu",
                          "--ray", cluster, "--name", "quiet"], capture_output=True, text=True, timeout=DEADLINE_S)
    try:
        assert out.returncode == 0, out.stderr[-2000:]
        assert "restarted" not in out.stdout + out.stderr and out.stderr == "", out.stderr
    finally:
        manage.down(cluster, "quiet")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ray_messages_to_drivers_never_reach_the_programs_stdout(cluster, pool, tmp_path):
    """What Ray's raylet publishes to every driver when a node dies (its state dump), published here
    while the program runs: the program is no driver (D300), so it never hears it; its output stays
    plain Python's."""
    from ray._private.utils import publish_error_to_driver

    report = tmp_path / "r.json"
    progress = tmp_path / "progress"
    proc = _shim(cluster, ["until_stopped", str(tmp_path)], str(report))
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 1, "the first rounds")
        done = int(progress.read_text() or 0)
        worker = ray._private.worker.global_worker
        publish_error_to_driver("node_died", "A node died.\n[state-dump] NodeManager:\n[state-dump] Pending: 0",
                                worker.gcs_client)
        wait_for(lambda: int(progress.read_text() or 0) >= done + 3, "rounds after it")
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "state-dump" not in out + err and "raylet" not in out + err
    (tmp_path / "plain").mkdir()
    assert out == _plain(["until_stopped", str(tmp_path / "plain"), "--rounds", str(len(out.splitlines()))])
    events = [e["what"] for e in json.loads(report.read_text())["events"]]
    assert not any("A node died." in e for e in events), events  # no driver in the program: nothing to hear


def test_pool_up_refuses_a_token_file_other_users_can_read(cluster, tmp_path):
    exposed = tmp_path / "auth_token"
    exposed.write_text(open(os.environ["RAY_AUTH_TOKEN_PATH"]).read())
    exposed.chmod(0o644)
    out = subprocess.run([sys.executable, "-m", "fusion_shim", "pool", "up", "--workers", "1", "--ray", cluster,
                          "--name", "exposed"], capture_output=True, text=True, timeout=DEADLINE_S,
                         env={**os.environ, "RAY_AUTH_TOKEN_PATH": str(exposed)})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"chmod 600 {exposed}" in lines[0], out.stderr
    assert manage.names(ray, "exposed") == []

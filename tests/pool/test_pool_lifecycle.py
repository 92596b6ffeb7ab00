"""A pool's life on an EMULATED cluster of three nodes on this host (a head without GPUs and two nodes
with one logical GPU each, every node a raylet of its own in its own process group, given 127.0.0.1,
which Ray turns into this host's address, D345): `pool up` waits aloud and leaves nothing placed
when it gives up, workers are named by their node, a worker whose raylet dies exits (also while a
program computes on it, the program's output staying plain Python's), `pool down` leaves no process
behind and names each worker it stopped as `pool up` and `pool status` showed it, and `--allow-code`
is what lets a pool worker run stages. The commands run as the user runs them, each in a process of
its own; this one never joins Ray (the pids come from the pool's records on this host)."""
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
from pathlib import Path

import pytest

from fusion_shim.pool import host, manage
from fusion_shim.procinfo import proc_start
from tests.helpers.environment import ROOT
from tests.pool.clusters import (children, command_line, records, start_head, start_node, stop_head,
                                 token_env, wait_for)

pytest.importorskip("ray")

DEADLINE_S = 300.0  # generous: the machine is shared; a worker imports torch as it starts
STAGE_PROBE = str(ROOT / "tests" / "pool" / "stage_probe.py")
PROGRAM = str(ROOT / "tests" / "pool" / "programs.py")


@pytest.fixture(scope="module")
def cluster():
    directory = Path(tempfile.mkdtemp(prefix="rpl", dir="/tmp"))  # Ray: socket paths <= 107 bytes
    env = {**token_env(directory), "XDG_STATE_HOME": str(directory / "state")}
    head, address = start_head(directory, env)
    nodes = []
    try:
        nodes = [start_node(directory, env, address, num_gpus=1) for _ in range(2)]
        yield address, env, nodes
    finally:
        for proc in [*nodes, head]:
            stop_head(proc)
        shutil.rmtree(directory, ignore_errors=True)


def _pool(cluster, *argv: str) -> subprocess.CompletedProcess:
    address, env, _ = cluster
    action, rest = argv[0], list(argv[1:])
    return subprocess.run([sys.executable, "-m", "fusion_shim", "pool", action, "--ray", address, *rest],
                          capture_output=True, text=True, timeout=DEADLINE_S, env={**os.environ, **env})


def _records(cluster, pool: str) -> list[dict]:
    return records(cluster[1], pool)


def _rows(out: str) -> dict[str, tuple[str, int]]:
    """The workers of a `pool up` or `pool status` table: name -> (node, pid)."""
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("worker"))
    assert lines[header].split()[:3] == ["worker", "node", "pid"], out
    return {r.split()[0]: (r.split()[1], int(r.split()[2])) for r in lines[header + 1:] if r.strip()}


def _named(rows: dict[str, tuple[str, int]]) -> list[str]:
    """The lines `pool down` stops these workers with."""
    return sorted(f"{name} on {node} (pid {pid})" for name, (node, pid) in rows.items())


def _stopped(down: subprocess.CompletedProcess, pool: str) -> list[str]:
    """`pool down`'s lines, one per worker stopped (sorted), after its count."""
    assert down.returncode == 0, down.stderr[-2000:]
    head, *lines = down.stdout.strip().splitlines()
    assert head == f"pool {pool}: {len(lines)} workers stopped", down.stdout
    return sorted(ln.strip() for ln in lines)


def _not_the_lost_copy(line: str, name: str, pid: int) -> bool:
    """``line`` names worker ``name`` as not answering, or a copy Ray restarted: never the lost process ``pid``."""
    found = re.fullmatch(rf"{re.escape(name)} (\(not answering\)|on [0-9a-f]{{8}}@[0-9.]+ \(pid (\d+)\))", line)
    return found is not None and found.group(2) != str(pid)


def _alive(entry: dict) -> bool:
    return proc_start(entry["pid"]) == entry["start"]


def test_pool_up_past_the_clusters_gpus_fails_in_one_line_and_the_next_up_succeeds(cluster):
    short = _pool(cluster, "up", "--workers", "3", "--wait", "5")
    assert short.returncode == 1, short.stderr[-2000:]
    lines = short.stderr.strip().splitlines()
    assert len(lines) == 1 and "3 GPUs" in lines[0] and "cluster has 2" in lines[0], short.stderr
    assert "waiting for 3 GPUs" in short.stdout and "cluster has 2" in short.stdout, short.stdout
    ok = _pool(cluster, "up", "--workers", "2")  # its placement group went with the failure: no name clash
    try:
        assert ok.returncode == 0, ok.stderr[-2000:]
        status = _pool(cluster, "status")
        assert status.returncode == 0, status.stderr[-2000:]
        rows = _rows(status.stdout)
        assert list(rows) == ["default.0", "default.1"] and rows == _rows(ok.stdout), status.stdout
        nodes = [node for node, _ in rows.values()]
        assert all(re.fullmatch(r"[0-9a-f]{8}@[0-9.]+", n) for n in nodes) and len(set(nodes)) == 2, nodes
        # the pids the actors reported are the processes recorded on this host
        assert sorted(pid for _, pid in rows.values()) == sorted(e["pid"] for e in _records(cluster, "default"))
    finally:
        down = _pool(cluster, "down")
    assert _stopped(down, "default") == _named(rows), down.stdout
    assert all(not _alive(e) for e in _records(cluster, "default"))


def test_pool_up_interrupted_while_waiting_leaves_nothing_placed(cluster):
    address, env, _ = cluster
    proc = subprocess.Popen([sys.executable, "-m", "fusion_shim", "pool", "up", "--ray", address, "--workers", "3",
                             "--wait", "600", "--name", "i"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})
    try:
        assert "waiting for 3 GPUs" in proc.stdout.readline()  # blocks until it says so
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].endswith("up interrupted: nothing left placed"), err
    ok = _pool(cluster, "up", "--workers", "2", "--name", "i")
    try:
        assert ok.returncode == 0, ok.stderr[-2000:]
    finally:
        down = _pool(cluster, "down", "--name", "i")
    assert _stopped(down, "i") == _named(_rows(ok.stdout)), (ok.stdout, down.stdout)


def test_a_pool_worker_runs_stages_only_when_started_with_allow_code(cluster):
    address = cluster[0]
    for name, flags in (("code", ["--allow-code"]), ("plain", [])):
        up = _pool(cluster, "up", "--workers", "1", "--device", "cpu", "--name", name, *flags)
        try:
            assert up.returncode == 0, up.stderr[-2000:]
            out = subprocess.run([sys.executable, STAGE_PROBE, address, f"{name}.0"], capture_output=True, text=True,
                                 timeout=DEADLINE_S, env={**os.environ, **cluster[1]}, cwd=ROOT)
            assert out.returncode == 0, out.stderr[-3000:]
            answer = out.stdout.strip().splitlines()[-1]
            if flags:
                assert answer == "ran 12.0", out.stdout
            else:
                assert answer.startswith("refused") and "--allow-code" in answer, out.stdout
        finally:
            down = _pool(cluster, "down", "--name", name)
        assert _stopped(down, name) == _named(_rows(up.stdout)), (up.stdout, down.stdout)


def test_three_workers_on_nodes_sharing_a_host_split_its_cap_and_up_and_status_say_so(cluster):
    """Three nodes, one address: one machine's RAM, split three ways (D313)."""
    cap = min(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4, 8 << 30)
    third = manage.size_text(cap // 3)
    up = _pool(cluster, "up", "--workers", "3", "--device", "cpu", "--name", "b")
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        lines = up.stdout.splitlines()
        header = next(i for i, ln in enumerate(lines) if ln.startswith("worker"))
        assert lines[header].split()[-1] == "budget", up.stdout
        made = lines[header + 1:]
        # one CPU per node: the three workers are on three nodes, all at 127.0.0.1
        assert [r.split()[0] for r in made] == ["b.0", "b.1", "b.2"], up.stdout
        assert len({r.split()[1] for r in made}) == 3, up.stdout
        assert all(ln.rstrip().endswith(f"{third} (3 on its host)") for ln in made), up.stdout
        status = _pool(cluster, "status", "--name", "b")
        assert status.returncode == 0, status.stderr[-2000:]
        rows = status.stdout.splitlines()[1:]
        assert len(rows) == 3 and all(ln.rstrip().endswith(f"{third} (3 on its host)") for ln in rows), status.stdout
        assert _rows(status.stdout) == _rows(up.stdout)
    finally:
        down = _pool(cluster, "down", "--name", "b")
    # three nodes on one address, told apart by their node ids
    assert _stopped(down, "b") == _named(_rows(up.stdout)), (up.stdout, down.stdout)


def test_pool_down_stops_a_recorded_process_that_is_still_ours_and_leaves_others(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path)}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        host.record("c:1", "p", "p.0", "abcd1234@127.0.0.1", env, pid=orphan.pid)
        host.record("c:1", "p", "p.1", "abcd1234@127.0.0.1", env, pid=other.pid)
        entry = next(e for _, e in host.records("c:1", "p", env) if e["pid"] == other.pid)
        entry["start"] += 1  # the pid now names another process than the one recorded
        Path(host.state_dir(env), f"{other.pid}.json").write_text(json.dumps(entry))
        host.record("c:2", "p", "p.0", "abcd1234@127.0.0.1", env, pid=elsewhere.pid)  # another cluster's pool
        stopped = host.reap("c:1", "p", env)
        assert [e["name"] for e in stopped] == ["p.0"]
        assert orphan.wait(60) == -signal.SIGTERM
        assert other.poll() is None and elsewhere.poll() is None
        assert host.records("c:1", "p", env) == [] and len(host.records("c:2", "p", env)) == 1
    finally:
        for proc in (orphan, other, elsewhere):
            if proc.poll() is None:
                proc.kill()
                proc.wait(60)


def test_a_worker_whose_raylet_dies_exits_and_pool_down_leaves_no_process(cluster):
    """Run last: it kills a node of the module's cluster."""
    up = _pool(cluster, "up", "--workers", "2", "--name", "o")
    assert up.returncode == 0, up.stderr[-2000:]
    recorded = {e["pid"]: e for e in _records(cluster, "o")}
    assert len(recorded) == 2
    node = cluster[2][1]
    raylet = next(p for p in children(node.pid) if "raylet" in command_line(p).split(" ")[0])
    victim = next(e for e in recorded.values() if e["pid"] in children(raylet))
    os.kill(raylet, signal.SIGKILL)
    wait_for(lambda: not _alive(victim), f"the orphaned worker {victim['name']} (pid {victim['pid']}) to exit")
    # an orphan its watchdog did not end (as one frozen would be): recorded as the victim was, still running
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        host.record(victim["cluster"], "o", victim["name"], victim["where"], cluster[1], pid=left.pid)
        down = _pool(cluster, "down", "--name", "o")
        assert left.wait(60) == -signal.SIGTERM
    finally:
        if left.poll() is None:
            left.kill()
            left.wait(60)
    rows = _rows(up.stdout)
    kept = next(n for n in rows if n != victim["name"])
    lines = _stopped(down, "o")
    assert len(lines) == 3, down.stdout
    assert f"{kept} on {rows[kept][0]} (pid {rows[kept][1]})" in lines, (up.stdout, down.stdout)
    assert f"{victim['name']} on {victim['where']} (pid {left.pid}, orphaned)" in lines, down.stdout
    (lost,) = [ln for ln in lines if ln.startswith(victim["name"] + " ") and "orphaned" not in ln]
    assert _not_the_lost_copy(lost, victim["name"], victim["pid"]), down.stdout
    every = [*recorded.values(), *_records(cluster, "o")]  # a copy Ray started meanwhile, too
    assert [e["name"] for e in every if _alive(e)] == [], down.stdout
    assert _records(cluster, "o") == []


def _node_of(cluster, pid: int) -> subprocess.Popen | None:
    """The node (its `ray start` process) whose raylet started ``pid``; None if no live node did."""
    for node in cluster[2]:
        for raylet in (p for p in children(node.pid) if "raylet" in command_line(p).split(" ")[0]):
            if pid in children(raylet):
                return node
    return None



def _run_through_pool(address: str, name: str, tmp_path: Path, env: dict) -> tuple[Path, Path, subprocess.Popen]:
    """``programs.py until_stopped`` forced onto pool ``name``: its progress file, its report, its process."""
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "fusion_shim", "--policy", "remote", "--pool", f"ray://{address}/{name}", "--quiet",
           "--report", str(report), PROGRAM, "until_stopped", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    return tmp_path / "progress", report, proc

def test_a_node_lost_mid_run_leaves_the_output_plain_pythons_and_no_process(cluster, tmp_path):
    """Run after the raylet's death: it kills a whole node (every process of it, as a machine lost)
    while a program computes on the node's worker."""
    address, env, _ = cluster
    up = _pool(cluster, "up", "--workers", "1", "--name", "n")  # a GPU each: on a node, not the head
    assert up.returncode == 0, up.stderr[-2000:]
    (victim,) = _records(cluster, "n")
    node = _node_of(cluster, victim["pid"])
    assert node is not None, (victim, up.stdout)
    progress, report, proc = _run_through_pool(address, "n", tmp_path, env)
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, "the first rounds")
        os.killpg(node.pid, signal.SIGKILL)
        done = int(progress.read_text() or 0)
        wait_for(lambda: int(progress.read_text() or 0) >= done + 3, "rounds after the node's loss")
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    assert proc.returncode == 0, err[-3000:]
    assert "raylet" not in out + err and "state-dump" not in out + err, err[-3000:]
    (tmp_path / "plain").mkdir()
    plain = subprocess.run([sys.executable, PROGRAM, "until_stopped", str(tmp_path / "plain"), "--rounds",
                            str(len(out.splitlines()))], capture_output=True, text=True, timeout=DEADLINE_S)
    assert out == plain.stdout
    rep = json.loads(report.read_text())
    calls = rep["summary"]["calls"]
    assert rep["pool"]["workers"][0]["calls"] > 0, rep["pool"]  # the node's worker served before its loss
    # where the rest ran is timing: here, on a copy Ray started elsewhere, or on the lost node's worker
    # until its watchdog sees the raylet gone (under load, several rounds); every answer is plain Python's
    assert sum(calls.values()) >= rep["pool"]["workers"][0]["calls"], calls
    wait_for(lambda: not _alive(victim), f"the lost node's worker (pid {victim['pid']}) to end")
    down = _pool(cluster, "down", "--name", "n")
    (line,) = _stopped(down, "n")
    assert _not_the_lost_copy(line, "n.0", victim["pid"]), down.stdout
    assert [e["name"] for e in [victim, *_records(cluster, "n")] if _alive(e)] == [], down.stdout
    assert _records(cluster, "n") == []


def _raylet_of(node: subprocess.Popen) -> int | None:
    return next((p for p in children(node.pid) if "raylet" in command_line(p).split(" ")[0]), None)


def _serves(url: str) -> bool:
    """Whether something accepts connections at the worker's ``tcp://IP:PORT``."""
    ip, port = url.removeprefix("tcp://").rsplit(":", 1)
    try:
        socket.create_connection((ip, int(port)), timeout=5).close()
    except OSError:
        return False
    return True


def test_a_raylet_killed_mid_run_leaves_the_output_plain_pythons_and_no_process(cluster, tmp_path):
    """Only the raylet of the node hosting the pool's worker is SIGKILLed while a program computes on
    that worker: the worker, orphaned, stops serving and exits (D265), the run goes on with every
    answer plain Python's and says what fell back or moved, and `pool down` leaves no process. On a node
    of its own (one GPU): the tests before it may have taken the module's nodes."""
    address, env, _ = cluster
    own = start_node(tmp_path, env, address, num_gpus=1)
    proc = None
    try:
        up = _pool(cluster, "up", "--workers", "1", "--name", "r")
        assert up.returncode == 0, up.stderr[-2000:]
        (victim,) = _records(cluster, "r")
        node = next((n for n in [*cluster[2], own] if _raylet_of(n) is not None
                     and victim["pid"] in children(_raylet_of(n))), None)
        assert node is not None, (victim, up.stdout)
        progress, report, proc = _run_through_pool(address, "r", tmp_path, env)
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, "the first rounds")
        os.kill(_raylet_of(node), signal.SIGKILL)
        wait_for(lambda: not _alive(victim), f"the orphaned worker (pid {victim['pid']}) to exit")
        done = int(progress.read_text() or 0)
        wait_for(lambda: int(progress.read_text() or 0) >= done + 3, "rounds after the worker's exit")
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 0, err[-3000:]
        assert re.search(r"\bray\b|raylet|state-dump", out + err, re.IGNORECASE) is None, (out + err)[-3000:]
        (tmp_path / "plain").mkdir()
        plain = subprocess.run([sys.executable, PROGRAM, "until_stopped", str(tmp_path / "plain"), "--rounds",
                                str(len(out.splitlines()))], capture_output=True, text=True, timeout=DEADLINE_S)
        assert out == plain.stdout
        rep = json.loads(report.read_text())
        (worker,) = rep["pool"]["workers"]
        assert worker["calls"] > 0, rep["pool"]  # it served before its raylet died
        events = [e["what"] for e in rep["events"]]
        calls = rep["summary"]["calls"]
        moved = any("pool worker r.0 restarted by Ray" in e for e in events)
        fell_back = calls["fallback"] + calls["no_worker"] + calls["local"] > 0
        assert moved or fell_back, (calls, events)
        assert any(e.startswith(("worker fault", "worker not ready")) for e in events), events
        ready = re.compile(rf"worker ready at (\S+) on .*\(pid {victim['pid']},")
        served = [m.group(1) for m in map(ready.match, events) if m]
        assert served and not any(_serves(u) for u in served), events  # the orphan's endpoint is closed
        down = _pool(cluster, "down", "--name", "r")
        assert down.returncode == 0, down.stderr[-2000:]
        assert [e["name"] for e in [victim, *_records(cluster, "r")] if _alive(e)] == [], down.stdout
        assert _records(cluster, "r") == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(60)
        stop_head(own)


GRANDCHILD = """
import sys, time
from fusion_shim.pool import host
host.watch(lambda: open(sys.argv[1], "w").write("stopped serving"), lambda: None, every_s=0.1)
print("watching", flush=True)
time.sleep(600)
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X")  # exited; its new parent reaps it


def test_the_watchdog_stops_serving_and_ends_the_process_once_its_parent_is_gone(tmp_path):
    """What a pool worker runs against its raylet (D265), with a plain parent in the raylet's place."""
    marker = tmp_path / "stopped"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, GRANDCHILD, str(marker)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = None
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "watching"
        assert not _gone(child)
        parent.kill()
        parent.wait(60)
        wait_for(lambda: _gone(child), "the orphan to exit", 120)
        assert marker.read_text() == "stopped serving"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)

"""Run as a script by the pool's tests: join the cluster at ADDRESS, give this process's key to pool
worker NAME through Ray, send it one stage by value over its socket and print ``ran VALUE`` or
``refused WHY`` (one line). With CALLS (JSON: ``[[FUNCTION, ARGS], ...]``, functions of
``tests.stage.isolationfns``), it runs each of those on the worker instead and prints one JSON line:
the worker as it described itself and each stage's answer (``PYTHONPATH`` must hold the repository)."""
import json
import sys
import time

import numpy as np
import zmq


class Link:
    """What :func:`fusion_shim.stages.remote.send` needs of a link: a channel and request ids."""

    def __init__(self, chan):
        self.chan, self.rid = chan, 0

    def channel(self):
        return self.chan

    def next_id(self):
        self.rid += 1
        return self.rid


def doubled_sum(a):
    return float((a * 2).sum())


def run(link, fn, args):
    """``fn(*args)`` on the worker, by value: its answer (a raise as its repr); never run here."""
    from fusion_shim.stages import remote

    packed = remote.pack(fn, tuple(args), {}, True, False)
    out = remote.send(link, fn, None, packed, set(), 120.0)
    return f"raised {out.value!r}" if out.raised else out.value


def main(address: str, name: str, calls: str | None = None) -> None:
    from fusion_shim import transport
    from fusion_shim.protocol import messages
    from fusion_shim.pool.manage import connect
    from fusion_shim.stages import remote

    ray = connect(address, lambda text: None)
    public, secret = zmq.curve_keypair()
    d = ray.get(ray.get_actor(name).join.remote(public), timeout=120)
    chan = transport.Channel(d["url"], (d["server_key"], public, secret), None, None)
    try:
        ready = chan.request(messages.hello(0), time.monotonic() + 300)  # answered once warm
        assert ready.header["t"] == "ready", ready.header
        if calls is not None:
            from tests.stage import isolationfns

            link = Link(chan)
            answers = [run(link, getattr(isolationfns, fn), args) for fn, args in json.loads(calls)]
            print(json.dumps({"worker": {k: d[k] for k in ("name", "node", "pid")}, "answers": answers}), flush=True)
            return
        try:
            print("ran", run(Link(chan), doubled_sum, (np.arange(4.0),)), flush=True)
        except remote.Refused as exc:
            print("refused", exc, flush=True)
    finally:
        chan.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])

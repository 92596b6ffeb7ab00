"""Run as a script by the pool's tests: join the cluster at ADDRESS, give this process's key to pool
worker NAME through Ray, send it one stage by value over its socket and print ``ran VALUE`` or
``refused WHY`` (one line)."""
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


def main(address: str, name: str) -> None:
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
        packed = remote.pack(doubled_sum, (np.arange(4.0),), {}, True, False)
        try:
            out = remote.send(Link(chan), doubled_sum, None, packed, set(), 120.0)
            print("ran", out.value, flush=True)
        except remote.Refused as exc:
            print("refused", exc, flush=True)
    finally:
        chan.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])

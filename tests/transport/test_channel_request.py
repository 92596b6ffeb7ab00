"""``Channel.request(request, deadline)``: what a request watches and the lane it uses are the
channel's, given where it is made; a reply skeleton and the socket-only choice are the request's."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fusion_shim.protocol import messages, wire
from fusion_shim.protocol.skeleton import Skeleton
from fusion_shim.transport import Channel, WorkerDied

READY_S = 120.0


class RecordingPool:
    """A lane that stages nothing: it notes each request and hands its plain frames to the socket."""

    def __init__(self) -> None:
        self.staged: list[int] = []

    def stage(self, req):
        self.staged.append(req.id)
        return None, req.frames(), None


def _call(rid: int, a: np.ndarray, skeleton: Skeleton | None = None) -> messages.Request:
    """``a @ a``."""
    header = messages.call_header(rid, "matmul", {"cdtype": "<f8"}, ["C"], [(a.dtype, a.shape)])
    return messages.Request(header, [wire.to_wire(a), wire.to_wire(a)], results=[(a.dtype, a.shape)],
                            skeleton=skeleton)


def test_a_request_goes_through_the_channels_lane_unless_it_asks_for_the_socket(inproc_worker):
    pool = RecordingPool()
    chan = Channel(inproc_worker, lane=lambda: pool)
    try:
        assert chan.request(messages.hello(1), time.monotonic() + READY_S).header["t"] == "ready"
        by_socket = messages.hello(2)._replace(by_socket=True)
        assert chan.request(by_socket, time.monotonic() + READY_S).header["t"] == "ready"
        assert pool.staged == [1]
    finally:
        chan.close()


def test_a_channel_without_a_lane_sends_by_the_socket(inproc_worker):
    chan = Channel(inproc_worker, lane=lambda: None)  # a lane not negotiated (yet)
    try:
        a = np.arange(4.0).reshape(2, 2)
        ans = chan.request(_call(1, a), time.monotonic() + READY_S)
        assert ans.header["t"] == "result" and ans.shm_sent == 0
        np.testing.assert_array_equal(ans.arrays[0], a @ a)
    finally:
        chan.close()


def test_a_requests_skeleton_is_offered_its_reply_to_learn_from(inproc_worker):
    chan = Channel(inproc_worker)
    try:
        a = np.arange(4.0).reshape(2, 2)
        assert chan.request(_call(1, a), time.monotonic() + READY_S).learn_from is None  # no skeleton
        ans = chan.request(_call(2, a, Skeleton()), time.monotonic() + READY_S)
        assert ans.header["t"] == "result" and ans.learn_from is not None
    finally:
        chan.close()


def test_every_request_on_a_channel_watches_its_alive_check(tmp_path):
    chan = Channel(f"ipc://{tmp_path}/nobody.sock", alive=lambda: False)  # nothing listens there
    try:
        with pytest.raises(WorkerDied):
            chan.request(messages.hello(1), time.monotonic() + READY_S)
    finally:
        chan.close()

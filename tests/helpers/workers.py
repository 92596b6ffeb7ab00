"""Workers for tests to talk to."""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def thread_worker(name: str, **options):
    """A worker serving ``inproc://`` in a thread of this process (``options``: serve_in_thread's,
    device "cpu" unless they say otherwise); yields (url, the Worker), stopped on exit."""
    from fusion_shim.worker import serve_in_thread

    url = f"inproc://fusion-shim-{name}-{os.getpid()}"
    thread, stop = serve_in_thread(url, **{"device": "cpu", **options})
    try:
        yield url, thread.worker
    finally:
        stop.set()
        thread.join(10)

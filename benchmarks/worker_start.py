"""Seconds from starting `fusion-shim worker --device cpu` to its first `hello` answered, and what its
self-benchmark says (others_busy, contended, cached_s). Extra arguments go to the worker
(`--fresh-bench`). Used for D58; run it a few times with the same XDG_CACHE_HOME."""
import subprocess, sys, time, tempfile, os
from fusion_shim.transport import Channel
from fusion_shim.protocol import messages
d = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
url = f"ipc://{d}/w.sock"
t = time.monotonic()
p = subprocess.Popen([sys.executable, "-m", "fusion_shim", "worker", "--bind", url, "--device", "cpu", *sys.argv[1:]], stderr=subprocess.DEVNULL)
c = Channel(url)
h = c.request(messages.hello(1), time.monotonic() + 600).header
b = h.get("bench", {})
print("ready after", round(time.monotonic() - t, 2), "s", b.get("others_busy"), b.get("contended"), b.get("cached_s"))
c.close(); p.kill()

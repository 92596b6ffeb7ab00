"""Child program for bench_memory.py: a 4096x4096 float64 matmul, then this process's peak RSS.

Run plainly (NumPy's own peak) or under ``python -m fusion_shim --policy remote`` (the client's peak
with the product computed by the worker). Prints one JSON line.
"""
import json
import resource
import sys

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n))
b = rng.standard_normal((n, n))
c = np.matmul(a, b)
checksum = float(c[::97, ::89].sum())
try:
    import fusion_shim

    rt = fusion_shim.active()
    where = rt.ledger.records[-1].kind if rt is not None and rt.ledger.records else "plain"
except ImportError:
    where = "plain"
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_mib": peak_kib / 1024, "where": where, "checksum": checksum, "n": n}))

"""Child program for bench_memory.py: ``np.dot(x, x)`` of one 512 MiB float64 vector, then this
process's peak RSS. Run plainly or under ``python -m fusion_shim --policy remote``. Prints one JSON line.
"""
import json
import resource
import sys

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 26
x = np.ones(n)
checksum = float(np.dot(x, x))
try:
    import fusion_shim

    rt = fusion_shim.active()
    where = rt.ledger.records[-1].kind if rt is not None and rt.ledger.records else "plain"
except ImportError:
    where = "plain"
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_mib": peak_kib / 1024, "where": where, "checksum": checksum, "n": n}))

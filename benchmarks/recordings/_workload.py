"""Run one workload of benchmarks/workloads/ as a program (for a recording): setup, then its work
``FS_WORKLOAD_REPEAT`` times (default 4, as benchmarks/workloads/run.py runs it)."""
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

mod = importlib.import_module(f"benchmarks.workloads.{sys.argv[1]}")
data = mod.setup()
print([mod.run(data) for _ in range(int(os.environ.get("FS_WORKLOAD_REPEAT", "4")))])

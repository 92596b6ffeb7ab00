"""The benchmarks' tools: the link emulation and the prepared GPU run."""

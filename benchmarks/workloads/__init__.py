"""The workload suite of issue 5: programs of different character, each run under ``local``,
``remote``, ``auto`` and an oracle (see ``run.py``).

Each module defines ``DESCRIPTION``, ``setup() -> data`` (inputs, made before the shim is installed and
not timed) and ``run(data) -> float`` (the timed program: plain NumPy calls, a checksum returned so that
nothing is optimised away). Programs call ``np.matmul``/``np.dot`` rather than ``@``: the operator is
intercepted only with the native trampolines (issue 3).
"""
WORKLOADS = ("matmul_large", "small_calls", "chain_reuse", "fft_heavy", "decompositions", "mix")

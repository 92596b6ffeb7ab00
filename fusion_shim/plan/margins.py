"""The margins a decision asks of a predicted gain (:mod:`.policy` decides with them). Standard
library only: :mod:`.cpuwins` reads them at NumPy's import, where the planner is not yet made."""
from __future__ import annotations

import math

Z = 1.0                  # margin in sigmas of the difference of the two predictions' logs
Z_PRIOR = 2.0            # D84: the same where one side is only a static prior (no curve, no sample)
# D86: added to the margin of an op not yet run (drift unmeasured) on a worker sharing the BLAS's CPUs
SIGMA_SHARED_CPUS = 1.0
MIN_LOG_MARGIN = 0.02    # never offload on a predicted gain under 2%


def first_call_margin(shared_cpus: bool) -> float:
    """The least speedup for which a worker gets an op's first call without exploring: both
    predictions exact, and on a worker sharing this host's CPUs the D86 uncertainty still added."""
    return math.exp(Z * (SIGMA_SHARED_CPUS if shared_cpus else 0.0) + MIN_LOG_MARGIN)


__all__ = ["MIN_LOG_MARGIN", "SIGMA_SHARED_CPUS", "Z", "Z_PRIOR", "first_call_margin"]

"""The floors every wrapped function compares with before the planner's models give one: the
runtime holds them from install, before its planner is made (on first need), and hands the same
cells to the planner. Imports nothing."""
from __future__ import annotations

from collections import defaultdict

NEVER = 1 << 62          # the floor of an op that cannot win on any worker the planner knows
FLOOR_BYTES = 64 * 1024  # the floor where no model makes one (policy local: larger calls are recorded)


def starting_floor(policy: str) -> int:
    """remote: every call is the worker's; auto: none until a worker is first ready (D90, the
    planner's ``held``); local: larger calls are recorded."""
    return 0 if policy == "remote" else NEVER if policy == "auto" else FLOOR_BYTES


def floor_cells(policy: str) -> "defaultdict[str, list[int]]":
    """One cell per op, read by the interceptor's fast path without a lock: [floor in bytes]."""
    start = starting_floor(policy)
    return defaultdict(lambda: [start])

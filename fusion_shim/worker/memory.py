"""The worker's memory: its message budget, what an out-of-memory error looks like, and freeing
what the device's allocator holds after one."""
from __future__ import annotations

import gc
import os
from typing import Any

MAX_MESSAGE_BYTES = 1 << 36  # the most ``max_bytes`` defaults to (D65: also half the host's, the GPU's memory)


def default_max_bytes(device: Any) -> int:
    """D65: one message may take half of the host's memory, and half of a GPU's, at most 64 GiB."""
    limits = [MAX_MESSAGE_BYTES]
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError):
        pass
    if getattr(device, "type", None) == "cuda":
        import torch

        limits.append(torch.cuda.get_device_properties(device).total_memory // 2)
    return min(limits)


def is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "out of memory" in text or "can't allocate memory" in text)


def free_memory(backend: Any) -> None:
    free = getattr(backend, "free_memory", None)
    if free is not None:
        free()
        return
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()



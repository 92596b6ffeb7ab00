"""Where fusion_shim keeps what it measured about this host: ``$XDG_CACHE_HOME/fusion_shim``
(``~/.cache/fusion_shim`` by default). Both sides use it; it imports nothing of either."""
from __future__ import annotations

import os


def cache_dir(env: dict | None = None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusion_shim")

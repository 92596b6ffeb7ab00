"""Imported by ``fusion_shim.pth`` at interpreter start when ``FUSION_SHIM`` is set and not "0".

The .pth line itself only reads one environment variable, so an unset ``FUSION_SHIM`` costs one
dictionary lookup per interpreter start. Children inherit the variable, and so the shim; they also
inherit ``FUSION_SHIM_WORKER`` once this process has started its worker, and reuse that worker.
"""
from __future__ import annotations

import os
import sys


def run() -> None:
    from . import install
    from .config import Config, ConfigError

    try:
        config = Config.load()
    except ConfigError as exc:
        sys.stderr.write(f"fusion_shim: {exc}\n")
        sys.stderr.flush()
        # not SystemExit: raised while site imports the .pth, it becomes "Fatal Python error:
        # init_import_site" with a traceback and exit code 1; nothing has run yet that needs atexit
        os._exit(2)
    install(config, export_env=True)


run()

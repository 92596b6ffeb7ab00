"""The client side of one run: the runtime that intercepted calls go through, its worker links, the
embedded worker, residency, sampled checks.

Light on purpose: the interceptor imports :data:`GUARD` before NumPy is imported; the modules that
need NumPy and ZeroMQ (``runtime``, ``call``, ``link``) load when NumPy does. Nothing here imports
the interceptor: it installs the runtime and calls :meth:`runtime.Runtime.dispatch`.
"""
from __future__ import annotations

import _thread  # D36: not threading, which NumPy's import does not load

# One per process, shared by every Runtime, so that intercept.bypassed() holds across installs:
# while a thread's .busy is set, its NumPy calls are not intercepted nor recorded.
GUARD = _thread._local()  # threading.local is this type

"""The worker side: a ZeroMQ server and its torch kernels. Needs the ``worker`` extra (torch)."""
import os

# D70: OpenMP threads wait for work asleep, not spinning: set before torch loads libgomp (any
# module of the worker imports this package first); a user's own OMP_WAIT_POLICY stands
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .server import Worker, serve, serve_in_thread  # noqa: E402

__all__ = ["Worker", "serve", "serve_in_thread"]

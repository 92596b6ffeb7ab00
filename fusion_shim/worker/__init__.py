"""The worker side: a ZeroMQ server and its torch kernels. Needs the ``worker`` extra (torch)."""
from .server import Worker, serve, serve_in_thread

__all__ = ["Worker", "serve", "serve_in_thread"]

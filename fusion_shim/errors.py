"""The errors the shim raises into a program: only in strict mode, where a call would otherwise fall
back to local computation without a word. Light: importing them imports neither NumPy nor ZeroMQ."""
from __future__ import annotations


class FallbackError(RuntimeError):
    """Raised in strict mode where a call would otherwise have fallen back to local computation."""


class VerificationError(FallbackError):
    """Strict mode: a checked answer from the worker differed from NumPy's."""

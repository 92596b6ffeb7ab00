"""The errors the shim raises into a program: only in strict mode, where a call would otherwise fall
back to local computation without a word; and the kinds of fallback they and the report name.
Light: importing them imports neither NumPy nor ZeroMQ."""
from __future__ import annotations

from enum import Enum


class FallbackKind(str, Enum):
    """Why a call meant for a worker was computed here (D323): a record's ``fallback``, beside its
    free-text ``reason``; the report counts them (``fallbacks_by_kind``). A str: JSON writes the value."""

    TIMEOUT = "timeout"                # no reply within the call's deadline
    WORKER_LOST = "worker_lost"        # the worker died, its connection dropped, or it could not be reached
    BAD_REPLY = "bad_reply"            # a malformed reply, or one that does not fit the call
    WORKER_FAULT = "worker_fault"      # the worker answered with an error (a kernel's, a health check's, ...)
    NOT_REPRODUCIBLE = "not_reproducible"  # the worker declined: its answer could differ from NumPy's here
    BUSY = "busy"                      # the worker holds as many of this client's bytes as it takes
    REFUSED = "refused"                # the worker refused this client (its key, its uid) or the request
    OUT_OF_MEMORY = "out_of_memory"    # the worker ran out of memory, or the call would not fit a budget
    NO_WORKER_READY = "no_worker_ready"  # under policy remote: no worker was ready (starting, faulted, none)
    UNENCODABLE = "unencodable"        # the request could not be encoded here: nothing was sent
    ERROR_STATE = "error_state"        # NumPy's error state asks for what a worker's result cannot show (D198)
    PINNED = "pinned"                  # the op (or stage) runs here for the rest of the run after earlier faults
    INTERRUPTED = "interrupted"        # Ctrl-C while the call waited
    INTERNAL_ERROR = "internal_error"  # a bug on the shim's own remote path or in its planner
    UNSUPPORTED = "unsupported"        # strict mode only: arguments the worker cannot take (record kind unsupported)
    VERIFICATION_MISMATCH = "verification_mismatch"  # strict mode only: a checked answer differed from NumPy's

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__  # a member and its value are one key of a dict (Enum hashes the name)


class FallbackError(RuntimeError):
    """Raised in strict mode where a call would otherwise have fallen back to local computation:
    ``kind`` (a :class:`FallbackKind`) says why, ``detail`` says where and what in words."""

    def __init__(self, kind: FallbackKind | str, detail: str = ""):
        kind = FallbackKind(kind)  # an unknown kind is the shim's bug: ValueError names it
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value


class VerificationError(FallbackError):
    """Strict mode: a checked answer from the worker differed from NumPy's."""

    def __init__(self, detail: str = ""):
        super().__init__(FallbackKind.VERIFICATION_MISMATCH, detail)
        self.args = (detail,)  # what pickling passes back to __init__

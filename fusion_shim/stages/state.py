"""What the runner and the checks share about a stage's answer. (Which stages run plain on this
thread is the runtime's guard: ``.busy``, ``.stages``, D336.)"""
from __future__ import annotations


class Raised:
    """A stage's exception, carried to where the program gets it."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class RemoteTraceback(Exception):
    """The stage's own traceback on the worker, as text: the cause of the exception the program
    gets (D216), as ``multiprocessing`` gives a pool task's."""

    def __str__(self) -> str:
        return f"\n\nThe stage's traceback, on the worker:\n{self.args[0]}" if self.args else ""

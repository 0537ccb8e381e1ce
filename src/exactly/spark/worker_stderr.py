"""Quiet PySpark's report of a flush to a worker connection the JVM has already closed.

Spark closes Python workers that stayed idle for a minute (and those of a stopped session).
PySpark's daemon then finishes the worker and flushes what it wrote last to the closed
connection. Over loopback TCP that flush succeeds (the peer's close is noticed a write
later); over the Unix domain sockets exactly's sessions use (:mod:`exactly.spark.session`) it
fails at once with ``BrokenPipeError``: measured here, three tracebacks on the console after
every idle minute, nothing lost (the JVM had stopped reading those workers). PySpark reports
it one of two ways (``spark.python.daemon.killWorkerOnFlushFailure``): by default the worker
exits and its daemon prints the traceback (``traceback.print_exc``); otherwise the daemon
prints "PySpark daemon failed to flush the output to the worker process" and the traceback.

:func:`install` quiets both in the process it runs in: ``traceback.print_exc`` says nothing
while the exception being handled is a ``BrokenPipeError``, and ``sys.stderr`` drops the
daemon's message about a ``BrokenPipeError``; every other error is reported unchanged. The
``sitecustomize`` of :mod:`exactly.spark.pyspark_path` installs it in every Python process
Spark starts for a session of exactly's (the daemons and their workers), and only there.
This module imports nothing of exactly.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

#: how PySpark's daemon (``pyspark/daemon.py``) begins the report
REPORT = "PySpark daemon failed to flush the output to the worker process"


class ClosedPipeFilter:
    """A text stream that passes every write to ``stream`` except the daemon's report of a
    ``BrokenPipeError`` (and the line end ``print`` writes after it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._dropped = False

    def write(self, text: str) -> int:
        if text.startswith(REPORT) and "BrokenPipeError" in text:
            self._dropped = True
            return len(text)
        if self._dropped and text == "\n":
            self._dropped = False
            return len(text)
        self._dropped = False
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def print_exc(*args: Any, **kwargs: Any) -> None:
    """``traceback.print_exc``, silent while the exception being handled is a
    ``BrokenPipeError`` (the JVM closed the connection: nobody reads the worker any more)."""
    if isinstance(sys.exc_info()[1], BrokenPipeError):
        return
    _print_exc(*args, **kwargs)


_print_exc = traceback.print_exc


def install() -> None:
    """Quiet the two reports in this process (once): :func:`print_exc` as
    ``traceback.print_exc`` and ``sys.stderr`` in a :class:`ClosedPipeFilter`."""
    traceback.print_exc = print_exc
    if sys.stderr is not None and not isinstance(sys.stderr, ClosedPipeFilter):
        sys.stderr = ClosedPipeFilter(sys.stderr)

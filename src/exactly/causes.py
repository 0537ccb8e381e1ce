"""The one line that says what went wrong, found under Spark's and Py4J's wrapping.

Used by the command line (the last line of a failed command) and by the job supervisor (the
cause logged with every restart, and whether a failure is worth a restart at all).
"""

from __future__ import annotations

import re

#: ``exactly.errors.FencedError: ...`` or any exception class of exactly's own modules
_EXACTLY_LINE = re.compile(r"^exactly\.[\w.]*?(\w+): (.+)$")
#: an OS error with its errno, from Python (``OSError: [Errno 30] ...``)
_ERRNO_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+): (\[Errno \d+\].*)$")
#: the exception line that ends a Python traceback (``module.SomethingError: message``)
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?([A-Za-z_]\w*)(?:: (.*))?$")
_JAVA_LINE = re.compile(r"^(?:Caused by: |: )?(?:[a-z]\w*\.)+([A-Z]\w*(?:Error|Exception)): "
                        r"(.+)$")
_SPARK_PREFIX = re.compile(r"^\[STREAM_FAILED\] Query \[id = [^\]]*\] terminated with "
                           r"exception: ")
_SQLSTATE = re.compile(r"(\s*SQLSTATE: \w+)+;?\s*$")


def root_cause_of(exc: BaseException) -> str:
    """:func:`root_cause` of ``exc`` formatted with its traceback and chained causes."""
    import traceback

    return root_cause("".join(traceback.format_exception(exc)))


def root_cause(text: str) -> str:
    """The one line that says what really went wrong, from a formatted exception.

    Spark wraps a Python worker's error in a StreamingQueryException (or Py4J's error) whose
    text holds the worker's traceback. In order of preference: the last line raised by one
    of exactly's own exception classes; the last OS error with its errno; the exception line
    that ends the innermost (last) Python traceback, or the innermost Java cause; finally
    the first line of the text. Spark's "[STREAM_FAILED] Query [...] terminated with
    exception:" prefix and "SQLSTATE" suffixes are removed.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    for pattern in (_EXACTLY_LINE, _ERRNO_LINE):
        matches = [m for m in map(pattern.match, lines) if m]
        if matches:
            return _clean(f"{matches[-1].group(1)}: {matches[-1].group(2)}")
    java = [m for m in map(_JAVA_LINE.match, lines) if m]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if starts:
        for line in lines[starts[-1] + 1:]:
            if not line or line[0].isspace() or line.startswith("^"):
                continue  # a frame, a source line or a caret marker
            match = _EXCEPTION_LINE.match(line)
            if match is None:
                return _clean(line)
            name, message = match.group(1), _clean(match.group(2) or "")
            if java and name in ("Py4JJavaError", "StreamingQueryException") and (
                    not message or message.startswith("An error occurred while calling")):
                break
            return f"{name}: {message}" if message else name
    if java:
        return _clean(f"{java[-1].group(1)}: {java[-1].group(2)}")
    first = next((line.strip() for line in lines
                  if line.strip() and "Traceback (most recent call last)" not in line), "")
    return _clean(first) or "unknown error"


def _clean(message: str) -> str:
    return _SQLSTATE.sub("", _SPARK_PREFIX.sub("", message.strip())).strip()


#: a full disk, as Python (``[Errno 28]``) and the JVM (``IOException``) report it
_DISK_FULL = re.compile(r"\[Errno 28\]|No space left on device|ENOSPC")
_QUOTED_PATH = re.compile(r"""['"](/[^'"]+)['"]""")


def remedy(cause: str) -> str | None:
    """What to do about a root cause (a line of :func:`root_cause`), when exactly knows:
    today a full disk (``ENOSPC``, from the Python workers, our staging and commit-log writes
    or Spark's checkpoint writes). None otherwise."""
    if not _DISK_FULL.search(cause):
        return None
    path = _QUOTED_PATH.search(cause)
    where = (f"the disk holding {path.group(1)}" if path else
             "a disk the job writes to (the checkpoint, the sink's staging or commit log under "
             "exactly.logDir or the output path, or Spark's local dirs)")
    return (f"{where} is full (no space left on device). Free space there, or move that "
            "location to a larger volume, then restart the job on the same checkpoint: no "
            "epoch is left partly visible (recovery finishes an epoch whose intent was written "
            "and aborts the other pre-commits) and the restart runs the failed epoch again.")

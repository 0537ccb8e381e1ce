"""The filter of PySpark's closed-pipe report in Spark's Python processes
(exactly.spark.worker_stderr)."""

from __future__ import annotations

import io

from exactly.spark.worker_stderr import REPORT, ClosedPipeFilter


def report(error: str) -> str:
    return (f"{REPORT}:\nTraceback (most recent call last):\n  File \"daemon.py\", line 95\n"
            f"{error}\n")


def test_the_daemons_broken_pipe_report_is_dropped_with_its_line_end():
    out = io.StringIO()
    stream = ClosedPipeFilter(out)
    print(report("BrokenPipeError: [Errno 32] Broken pipe"), file=stream)
    print("next line", file=stream)
    assert out.getvalue() == "next line\n"


def test_every_other_write_goes_through_the_same_report_of_another_error_too():
    out = io.StringIO()
    stream = ClosedPipeFilter(out)
    print(report("OSError: [Errno 28] No space left on device"), file=stream)
    print("\n", end="", file=stream)
    stream.write("BrokenPipeError in a user's message\n")
    assert out.getvalue() == (report("OSError: [Errno 28] No space left on device") + "\n\n"
                              "BrokenPipeError in a user's message\n")
    assert stream.getvalue() == out.getvalue()  # the stream's own attributes stay reachable

"""The root cause of a failure, found under Spark's and Py4J's wrapping.

The texts under data/root_cause/ are ``traceback.format_exception`` of real failures captured
from real local[2] runs (read-only bind mount, full 1 MiB tmpfs, a lease held by a live
process, a torn lease.json, PostgreSQL and Kafka on a closed port, a checkpoint on a
read-only mount, a stray commits/.2.crc with and without the preflight).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from exactly.cli import main, root_cause

DATA = Path(__file__).parent / "data" / "root_cause"


@pytest.mark.parametrize(("capture", "expected"), [
    ("erofs", "OSError: [Errno 30] Read-only file system: '/tmp/rotest/ro/out'"),
    ("enospc", "OSError: [Errno 28] No space left on device"),
    ("ck_erofs", "IOException: mkdir of file:/tmp/rotest/ro/ck failed"),
    ("stray_crc_spark",
     "StreamingQueryException: Multiple streaming queries are concurrently using "
     "file:/tmp/rc/stray/ck/commits."),
])
def test_the_root_cause_is_the_innermost_real_error_line(capture, expected):
    assert root_cause((DATA / f"{capture}.txt").read_text()) == expected


@pytest.mark.parametrize(("capture", "start"), [
    ("fenced", "FencedError: this instance (run 2a7b204e-61a6-4819-bad8-28d547edc10d) is "
               "fenced off: run another-run holds it"),
    ("torn_lease", "CorruptFileError: /tmp/rc/torn/out/_exactly/lease.json is not valid JSON"),
    ("stray_crc_preflight", "CorruptCheckpointFileError: /tmp/rc/stray/ck/commits/.2.crc is a "
                            "checksum file"),
    ("pg_refused", "DatabaseError: connecting to PostgreSQL (postgresql://u@127.0.0.1:1/db): "
                   "OperationalError: connection failed"),
    ("kafka_refused", "KafkaSinkError: cannot reach Kafka at 127.0.0.1:1"),
])
def test_an_error_raised_by_exactly_is_preferred_over_the_wrapping(capture, start):
    cause = root_cause((DATA / f"{capture}.txt").read_text())
    assert cause.startswith(start)
    assert "SQLSTATE" not in cause and "\n" not in cause


def test_an_os_error_is_preferred_over_the_last_exception_line():
    text = (DATA / "erofs.txt").read_text()
    assert "StreamingQueryException" in text.splitlines()[-1] or "Logical Plan" in text
    assert root_cause(text).startswith("OSError: [Errno 30]")


def test_the_pg_refusal_keeps_the_connection_refused_words():
    assert "Connection refused" in root_cause((DATA / "pg_refused.txt").read_text())


def test_a_text_without_a_traceback_gives_its_first_line():
    assert root_cause("something broke\nmore detail") == "something broke"
    assert root_cause("") == "unknown error"


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


#: the audit of a table on a closed port: the connection fails (not bad input: exit 3)
UNREACHABLE = ["verify", "--expect", "select 1 as id", "--output",
               "postgresql://u:secret@127.0.0.1:1/db?table=t"]


def test_a_failing_cli_command_ends_stderr_with_its_root_cause_and_no_traceback():
    result = _cli(*UNREACHABLE)
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("verify failed: DatabaseError: connecting to PostgreSQL "
                                "(postgresql://u:***@127.0.0.1:1/db)")
    assert "Traceback" not in result.stderr and "secret" not in result.stderr


def test_verbose_prints_the_traceback_above_the_root_cause():
    result = _cli("--verbose", *UNREACHABLE)
    lines = result.stderr.strip().splitlines()
    assert "Traceback (most recent call last):" in result.stderr
    assert lines[-1].startswith("verify failed: ") and result.exit_code == 3


def test_a_full_disk_gets_its_cause_and_fix_on_the_command_line():
    """The Python side names the file (staging, commit log), the JVM side (Spark's checkpoint
    writes) does not: both get the cause, and the fix printed above the root cause line
    (which stays the last line)."""
    from exactly.causes import remedy

    python_side = root_cause((DATA / "enospc.txt").read_text())
    assert "is full" in (remedy(python_side) or "")
    jvm_side = "IOException: No space left on device"
    assert "the checkpoint" in (remedy(jvm_side) or "")
    staged = "OSError: [Errno 28] No space left on device: '/d/out/_exactly/query.json'"
    fix = remedy(staged) or ""
    assert "/d/out/_exactly/query.json" in fix and "restart" in fix
    assert remedy("FencedError: this instance is fenced off") is None

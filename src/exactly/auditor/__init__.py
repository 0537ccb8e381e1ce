"""The auditor behind ``exactly verify``: prove on your own job that nothing was lost or
duplicated.

:func:`verify` (locations as strings) and :func:`run_audit` (an :class:`AuditSpec`) compare
the rows a job should have produced (its input, filtered or transformed by a SQL query)
with what a sink made visible: the file sink's directory (local or on S3), a Delta table, an
Iceberg table, a PostgreSQL or SQLite table, a Kafka topic. See docs/verify.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactly.auditor.engine import AuditSpec, run_audit
from exactly.auditor.locations import (
    DeltaLocation,
    FilesLocation,
    IcebergLocation,
    KafkaLocation,
    Location,
    ObjectFilesLocation,
    PostgresLocation,
    SqliteLocation,
    parse_location,
)
from exactly.auditor.report import EpochLine, Finding, VerifyReport


def verify(input: str | Path | None, output: str | Path, key: str | tuple[str, ...] = "id",
           **options: Any) -> VerifyReport:
    """Audit ``output`` against ``input`` (paths or location strings, see
    :func:`parse_location`); ``options`` are :class:`AuditSpec`'s (``where``, ``expect``,
    ``compare``, ...). Raises :class:`~exactly.errors.AuditInputError` for bad input."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    return run_audit(AuditSpec(
        output=parse_location(str(output), what="output"),
        input=None if input is None else parse_location(str(input), what="input"),
        keys=keys, **options))


__all__ = [
    "AuditSpec",
    "DeltaLocation",
    "EpochLine",
    "FilesLocation",
    "Finding",
    "IcebergLocation",
    "KafkaLocation",
    "Location",
    "ObjectFilesLocation",
    "PostgresLocation",
    "SqliteLocation",
    "VerifyReport",
    "parse_location",
    "run_audit",
    "verify",
]

"""Id audits in memory: compare the ids of a source with the ids a sink made visible.

The user-facing auditor, with filters, values, aggregates and every target, is
:mod:`exactly.auditor` (``exactly verify``); this module is its small in-memory sibling for
tests and benchmarks that already hold the ids. A run is exactly-once when every input id
appears exactly once in the output: no id missing, no id duplicated, no id the input never
had. :func:`audit_ids` is that comparison,
for ids from anywhere; the readers below give it the ids of a sink:

* files (:func:`file_ids`): files and directories whose names start with
  ``_`` or ``.`` (staging, commit logs) are not output, as for any reader;
* database tables (:func:`pg_table_ids`, :func:`sqlite_table_ids`);
* consumed records with JSON values, e.g. a Kafka topic (:func:`json_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from exactly.errors import ConfigError

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass
class AuditReport:
    """What :func:`audit_ids` found. ``ok`` is True only for a perfect one-to-one match."""

    expected: int
    found_rows: int
    missing: np.ndarray
    duplicated: np.ndarray
    unexpected: np.ndarray
    duplicate_extra_rows: int
    malformed_input_rows: int = 0
    input_duplicates: int = 0

    @property
    def ok(self) -> bool:
        return not (len(self.missing) or len(self.duplicated) or len(self.unexpected))

    def rows(self) -> list[tuple[str, str]]:
        def sample(values: np.ndarray) -> str:
            shown = ", ".join(str(v) for v in values[:10])
            return f"{len(values)}" + (f"  (e.g. {shown})" if len(values) else "")

        extra = f"  [{self.duplicate_extra_rows} extra rows]" if self.duplicate_extra_rows else ""
        return [
            ("expected ids", str(self.expected)),
            ("output rows", str(self.found_rows)),
            ("missing ids", sample(self.missing)),
            ("duplicated ids", sample(self.duplicated) + extra),
            ("unexpected ids", sample(self.unexpected)),
            ("malformed input rows", str(self.malformed_input_rows)),
            ("verdict", "EXACTLY ONCE" if self.ok else "MISMATCH"),
        ]

    def to_json(self) -> dict:
        return {"expected": self.expected, "found_rows": self.found_rows,
                "missing": len(self.missing), "duplicated": len(self.duplicated),
                "duplicate_extra_rows": self.duplicate_extra_rows,
                "unexpected": len(self.unexpected),
                "malformed_input_rows": self.malformed_input_rows, "ok": self.ok}


def data_files(root: Path) -> list[Path]:
    """Parquet and JSON-lines files below ``root``, skipping hidden and ``_``-prefixed files
    and directories; ConfigError when ``root`` does not exist."""
    from exactly.auditor.files import data_files as listed

    if not root.exists():
        raise ConfigError(f"{root} does not exist")
    return listed(root, DATA_SUFFIXES)


def read_ids(path: Path, column: str) -> tuple[np.ndarray, int]:
    """The ``column`` values of one file, and how many of its rows had no readable id."""
    if path.suffix == ".parquet":
        table = pq.read_table(path, columns=[column])
        values = table.column(column)
        return values.drop_null().to_numpy(), values.null_count
    try:
        table = pajson.read_json(path, parse_options=pajson.ParseOptions(
            explicit_schema=pa.schema([(column, pa.int64())]),
            unexpected_field_behavior="ignore"))
        values = table.column(column)
        return values.drop_null().to_numpy(), values.null_count
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        ids, bad = [], 0
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)[column]
                    ids.append(int(value))
                except (ValueError, KeyError, TypeError):
                    bad += 1
        return np.array(ids, dtype=np.int64), bad


def audit_ids(found: np.ndarray, expected: np.ndarray, *,
              malformed_input_rows: int = 0) -> AuditReport:
    """Compare the ids ``found`` in a sink (duplicates kept) with the ``expected`` input ids.

    ``malformed_input_rows``: input rows without a readable id, reported as they are.
    """
    found = np.asarray(found, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.int64)
    expected_ids = np.unique(expected)
    found_ids, counts = np.unique(found, return_counts=True)
    return AuditReport(
        expected=len(expected_ids),
        found_rows=len(found),
        missing=np.setdiff1d(expected_ids, found_ids, assume_unique=True),
        duplicated=found_ids[counts > 1],
        unexpected=np.setdiff1d(found_ids, expected_ids, assume_unique=True),
        duplicate_extra_rows=int((counts[counts > 1] - 1).sum()),
        malformed_input_rows=malformed_input_rows,
        input_duplicates=len(expected) - len(expected_ids),
    )


def file_ids(root: Path, column: str = "id") -> tuple[np.ndarray, int]:
    """The ``column`` values of every data file below ``root`` (duplicates kept), and how
    many rows had no readable id."""
    parts, bad = [], 0
    for path in data_files(root):
        ids, unreadable = read_ids(path, column)
        parts.append(ids.astype(np.int64, copy=False))
        bad += unreadable
    return (np.concatenate(parts) if parts else np.array([], dtype=np.int64)), bad


def pg_table_ids(conn, table: str, column: str = "id") -> np.ndarray:
    """Every value of ``column`` in a PostgreSQL table (duplicates kept); ``conn`` is a
    psycopg connection, ``table`` a name as :class:`exactly.connectors.sql.TableName` parses."""
    from psycopg import sql

    from exactly.connectors.sql import TableName

    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT {} FROM {}").format(sql.Identifier(column),
                                                         TableName.parse(table).sql()))
        return np.array([r[0] for r in cur.fetchall()], dtype=np.int64)


def sqlite_table_ids(path: str | Path, table: str, column: str = "id") -> np.ndarray:
    """Every value of ``column`` in a table of the SQLite database file ``path``."""
    import sqlite3
    from contextlib import closing

    from exactly.connectors.sql import quote_sqlite

    with closing(sqlite3.connect(str(path))) as conn:
        rows = conn.execute(f"SELECT {quote_sqlite(column)} FROM {quote_sqlite(table)}")
        return np.array([r[0] for r in rows], dtype=np.int64)


def json_ids(values: Iterable[str | bytes | None], column: str = "id") -> np.ndarray:
    """The ``column`` of JSON-object values, such as the record values a Kafka consumer
    read (duplicates kept); ``None`` values (tombstones) are skipped."""
    return np.array([json.loads(v)[column] for v in values if v is not None], dtype=np.int64)

"""Exactly-once audits of database tables: ids in a table vs the ids the input had."""

from __future__ import annotations

import numpy as np

from exactly.audit import AuditReport
from exactly.connectors.sql import TableName


def audit_ids(found: np.ndarray, expected: np.ndarray) -> AuditReport:
    """Compare the ids found in a sink with the expected input ids."""
    expected_ids = np.unique(expected)
    found_ids, counts = np.unique(found, return_counts=True)
    return AuditReport(
        expected=len(expected_ids), found_rows=len(found),
        missing=np.setdiff1d(expected_ids, found_ids, assume_unique=True),
        duplicated=found_ids[counts > 1],
        unexpected=np.setdiff1d(found_ids, expected_ids, assume_unique=True),
        duplicate_extra_rows=int((counts[counts > 1] - 1).sum()),
        input_duplicates=len(expected) - len(expected_ids))


def pg_table_ids(conn, table: str, column: str = "id") -> np.ndarray:
    """Every value of ``column`` in a PostgreSQL table (duplicates kept)."""
    from psycopg import sql

    name = TableName.parse(table)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT {} FROM {}").format(sql.Identifier(column), name.sql()))
        return np.array([r[0] for r in cur.fetchall()], dtype=np.int64)


def sqlite_table_ids(path: str, table: str, column: str = "id") -> np.ndarray:
    import sqlite3

    from exactly.connectors.sql import quote_sqlite

    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT {quote_sqlite(column)} FROM {quote_sqlite(table)}")
        return np.array([r[0] for r in rows], dtype=np.int64)

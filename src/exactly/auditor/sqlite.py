"""A SQLite table for the audit (the write-ahead sink's SQLite target), read in batches."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing

import pyarrow as pa

from exactly.auditor.locations import SqliteLocation
from exactly.auditor.relation import Relation, first_line, load_batches
from exactly.connectors.sql import quote_sqlite
from exactly.errors import AuditInputError

_BATCH = 100_000


def attach_sqlite(con, name: str, location: SqliteLocation,
                  columns: list[str] | None = None) -> Relation:
    """Copy ``location``'s table into the DuckDB table ``name``: only ``columns`` when it has
    them all, every column otherwise."""
    relation = Relation(name, location.describe())
    uri = location.path.resolve().as_uri() + "?mode=ro"  # read only: never creates a file
    try:  # DuckDB pulls the batches from its own threads
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        table = quote_sqlite(location.table)
        present = [d[0] for d in db.execute(f"SELECT * FROM {table} LIMIT 0").description]
        selected = "*"
        if columns is not None and set(columns) <= set(present):
            selected = ", ".join(quote_sqlite(c) for c in columns)
        cursor = db.execute(f"SELECT {selected} FROM {table}")
    except sqlite3.Error as exc:
        raise AuditInputError(f"{location.describe()}: {first_line(exc)}") from None
    with closing(db):
        names = [d[0] for d in cursor.description]

        def tables() -> Iterator[pa.Table]:
            while rows := cursor.fetchmany(_BATCH):
                yield pa.table({n: pa.array(list(column))
                                for n, column in zip(names, zip(*rows, strict=True),
                                                     strict=True)})

        # an empty table's columns have no type to read: it takes the expected rows' columns
        relation.empty = not load_batches(con, name, tables())
    return relation

"""Upserts in PostgreSQL, shared by the 2PC sink's upsert mode and the idempotent upsert sink.

``INSERT ... SELECT * FROM unnest(...) ON CONFLICT (keys) DO UPDATE``, optionally guarded by
an epoch column so a replay of an older epoch never moves a value back. Identifiers are
always quoted.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from exactly.connectors.sql import TableName, pg_type


def dedup_last(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of each key (upserts of one statement must not repeat a key)."""
    if table.num_rows < 2:
        return table
    indexed = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    last = indexed.group_by(list(keys), use_threads=False).aggregate([("__row", "max")])
    keep = pc.sort_indices(last.column("__row_max"))
    return table.take(pc.take(last.column("__row_max"), keep))


def upsert_statement(table: TableName, schema: pa.Schema, keys: Sequence[str],
                     epoch_column: str | None = None):
    """``INSERT ... SELECT * FROM unnest(...) ON CONFLICT (keys) DO UPDATE``; with
    ``epoch_column``, a row only replaces one written by the same or an older epoch (or one
    whose epoch is NULL)."""
    from psycopg import sql

    names = list(schema.names)
    arrays = [sql.SQL("%s::{}[]").format(sql.SQL(pg_type(f))) for f in schema]
    cols = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    updates = [n for n in names if n not in keys]
    action: sql.Composable
    if not updates:
        action = sql.SQL("DO NOTHING")
    else:
        action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
            sql.SQL("{} = excluded.{}").format(sql.Identifier(n), sql.Identifier(n))
            for n in updates))
        if epoch_column:  # a NULL epoch (a row written by something else) is replaced
            current = sql.SQL("{}.{}").format(table.sql(), sql.Identifier(epoch_column))
            action = sql.SQL("{} WHERE {} IS NULL OR {} <= excluded.{}").format(
                action, current, current, sql.Identifier(epoch_column))
    return sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) {}").format(
        table.sql(), cols, sql.SQL(", ").join(arrays),
        sql.SQL(", ").join(sql.Identifier(k) for k in keys), action)


def upsert_rows(cur, statement, table: pa.Table, chunk_rows: int = 20_000) -> int:
    for offset in range(0, table.num_rows, chunk_rows):
        part = table.slice(offset, chunk_rows)
        cur.execute(statement, [col.to_pylist() for col in part.columns])
    return table.num_rows

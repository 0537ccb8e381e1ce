"""Upserts in PostgreSQL, shared by the 2PC sink's upsert mode and the idempotent upsert sink.

``INSERT ... SELECT ... ON CONFLICT (keys) DO UPDATE``, optionally guarded by an epoch column
so a replay of an older epoch never moves a value back. The rows come either from column
arrays (``unnest``: works in a transaction that is later PREPAREd) or from a temporary table
filled by COPY (:func:`copy_upsert`: ~4x faster, but PostgreSQL refuses to PREPARE a
transaction that used a temporary table). Identifiers are always quoted.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from exactly.connectors.sql import CopyStream, TableName, pg_type

#: the temporary table :func:`copy_upsert` fills (one per session, dropped at commit)
STAGE = TableName("pg_temp", "exactly_upsert_stage")


def dedup_last(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of each key (upserts of one statement must not repeat a key)."""
    if table.num_rows < 2:
        return table
    indexed = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    last = indexed.group_by(list(keys), use_threads=False).aggregate([("__row", "max")])
    keep = pc.sort_indices(last.column("__row_max"))
    return table.take(pc.take(last.column("__row_max"), keep))


def upsert_statement(table: TableName, schema: pa.Schema, keys: Sequence[str],
                     epoch_column: str | None = None, source: TableName | None = None):
    """``INSERT ... SELECT ... ON CONFLICT (keys) DO UPDATE`` from column arrays
    (``unnest``, one parameter per column) or, with ``source``, from that table; with
    ``epoch_column``, a row only replaces one written by the same or an older epoch (or one
    whose epoch is NULL)."""
    from psycopg import sql

    names = list(schema.names)
    cols = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    rows: sql.Composable
    if source is None:
        rows = sql.SQL("SELECT * FROM unnest({})").format(sql.SQL(", ").join(
            sql.SQL("%s::{}[]").format(sql.SQL(pg_type(f))) for f in schema))
    else:
        rows = sql.SQL("SELECT {} FROM {}").format(cols, source.sql())
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
    return sql.SQL("INSERT INTO {} ({}) {} ON CONFLICT ({}) {}").format(
        table.sql(), cols, rows, sql.SQL(", ").join(sql.Identifier(k) for k in keys), action)


def upsert_rows(cur, statement, table: pa.Table, chunk_rows: int = 20_000) -> int:
    for offset in range(0, table.num_rows, chunk_rows):
        part = table.slice(offset, chunk_rows)
        cur.execute(statement, [col.to_pylist() for col in part.columns])
    return table.num_rows


def copy_upsert(cur, target: TableName, table: pa.Table, keys: Sequence[str],
                epoch_column: str | None = None) -> int:
    """Upsert ``table`` (at most one row per key: :func:`dedup_last`) into ``target``: COPY
    into a temporary table of the same columns, then one ``INSERT ... SELECT ... ON
    CONFLICT``. The temporary table lives until the transaction ends; a transaction that
    used it cannot be PREPAREd (use :func:`upsert_rows` there). Returns the row count."""
    from psycopg import sql

    if table.num_rows == 0:
        return 0
    cols = sql.SQL(", ").join(sql.Identifier(n) for n in table.schema.names)
    # the target's column types, none of its constraints; emptied for each call
    cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DROP AS "
                        "SELECT {} FROM {} WITH NO DATA").format(STAGE.sql(), cols,
                                                                 target.sql()))
    cur.execute(sql.SQL("TRUNCATE {}").format(STAGE.sql()))
    stream = CopyStream(cur, STAGE, table.schema.names)
    stream.write(table)
    stream.finish()
    cur.execute(upsert_statement(target, table.schema, keys, epoch_column, source=STAGE))
    return table.num_rows

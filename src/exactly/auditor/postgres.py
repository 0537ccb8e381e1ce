"""A PostgreSQL table or view for the audit, streamed with ``COPY ... TO STDOUT``.

The rows travel as CSV through one ``COPY`` and are parsed by Arrow's CSV reader with the
column types PostgreSQL reports, a block at a time, straight into the audit's database: the
table is never held in memory. Integers, floats, booleans, text, dates and timestamps keep
their type; ``numeric`` becomes a float (compared with the tolerance); everything else is
compared as text. A column ``exactly_epoch`` (the 2PC and upsert sinks' epoch column, or the
one named by ``epoch_column``) gives the per-epoch breakdown.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

from exactly.auditor.locations import PostgresLocation
from exactly.auditor.relation import EPOCH, Relation, first_line, ident, load_batches
from exactly.connectors.sql import pg_connect, redact_dsn
from exactly.errors import AuditInputError

# PostgreSQL type OIDs (pg_type) and the Arrow type their CSV text is parsed as
_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(), 20: pa.int64(), 21: pa.int64(), 23: pa.int64(), 26: pa.int64(),
    700: pa.float64(), 701: pa.float64(), 1700: pa.float64(),
    1082: pa.date32(), 1114: pa.timestamp("us"),
}


class _CopyStream(io.RawIOBase):
    """The bytes of a ``COPY TO STDOUT`` as a readable file for Arrow's CSV reader."""

    def __init__(self, copy) -> None:
        self._chunks = iter(copy)
        self._buffer = bytearray()

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while len(self._buffer) < len(target):
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        del self._buffer[:n]
        return n


def attach_postgres(con, name: str, location: PostgresLocation,
                    epoch_column: str = "exactly_epoch",
                    columns: list[str] | None = None) -> Relation:
    """Copy ``location``'s table into the DuckDB table ``name``: only ``columns`` and the
    epoch column when it has all of ``columns``, every column otherwise (so that an error
    about a missing column can list them)."""
    import psycopg
    from psycopg import sql

    relation = Relation(name, location.describe())
    # an unreachable server is a failure (DatabaseError, exit 3), not bad input
    with pg_connect(location.dsn, application="exactly-verify", autocommit=True) as conn:
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(location.table.sql()))
                described = [(c.name, c.type_code) for c in cur.description or []]
        except psycopg.errors.UndefinedTable:
            raise AuditInputError(f"table {location.table} does not exist in "
                                  f"{redact_dsn(location.dsn)}") from None
        except psycopg.Error as exc:
            raise AuditInputError(f"{location.describe()}: {first_line(exc)}") from None
        if columns is not None and set(columns) <= {n for n, _ in described}:
            described = [(n, oid) for n, oid in described
                         if n in columns or n == epoch_column]
        names = [n for n, _ in described]
        schema = pa.schema([(n, _TYPES.get(oid, pa.string())) for n, oid in described])
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT (FORMAT csv)").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in names), location.table.sql())
        raw = f"__x_raw_{name}"
        with conn.cursor() as cur, cur.copy(query) as copy:
            def tables() -> Iterator[pa.Table]:
                try:
                    reader = pacsv.open_csv(
                        _CopyStream(copy),
                        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 22),
                        parse_options=pacsv.ParseOptions(newlines_in_values=True),
                        convert_options=pacsv.ConvertOptions(
                            column_types=schema, strings_can_be_null=True,
                            quoted_strings_can_be_null=False, true_values=["t"],
                            false_values=["f"]))
                except pa.ArrowInvalid:  # "Empty CSV file": a table without rows
                    return
                for batch in reader:
                    yield pa.Table.from_batches([batch])

            # an empty table still has its columns: the DuckDB table gets them
            load_batches(con, raw, tables(), schema)
    epoch = "NULL::BIGINT"
    if epoch_column in names:
        epoch = f"CAST({ident(epoch_column)} AS BIGINT)"
        relation.epoch = True
        relation.order = [EPOCH]
    con.execute(f"CREATE VIEW {ident(name)} AS SELECT *, {epoch} AS {EPOCH} FROM {ident(raw)}")
    return relation


"""Replayable PostgreSQL table source: rows taken in order of a monotonically increasing key.

Options (``spark.readStream.format("exactly.postgres")``):

``dsn`` / ``dsnEnv`` / ``password``  the connection (see :mod:`exactly.spark.formats`)
``table``              the table to read (``name`` or ``schema.name``)
``keyColumn``          an integer column that only grows: a ``bigserial``/identity, an
                       ingestion sequence (default ``id``)
``maxRowsPerTrigger``  cap on rows per epoch (epoch sizing; default: all new rows)
``numPartitions``      read tasks per epoch (default 2; split by key range)
``columns``            comma-separated columns to read (default: all)

The offset of an epoch is ``{"key": K}``: epoch n reads the rows with ``start < key <= end``,
and both ends are in Spark's offset log before the epoch runs, so a replay reads exactly the
same rows. Supports ``Trigger.AvailableNow``. Admission control
(:mod:`exactly.connectors.admission`): no epoch (and no query) while paused or closed, and at
most ``max_rows`` rows per epoch on top of ``maxRowsPerTrigger``.

The key must be assigned in commit order. A ``bigserial`` filled by several concurrent
writers is not: a transaction that took key 10 may commit after one that took key 11, and if
an epoch ends at 11 in between, row 10 is never read. With concurrent writers, either have one
writer assign keys at commit, or read only rows older than the longest write transaction
(e.g. a view ``WHERE inserted_at < now() - interval '1 minute'``). Rows must not be updated or
deleted once written (a replay would read the new version).

Schema: the table's columns, mapped to Spark types (smallint -> short, integer -> int, bigint ->
long, real -> float, double precision -> double, numeric(p,s) -> decimal(p,s), boolean,
text/varchar/char -> string, bytea -> binary, date, timestamptz -> timestamp, timestamp ->
timestamp_ntz); other types are read as their text form (string).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from exactly import options as opt
from exactly.connectors.admission import current_admission
from exactly.connectors.sql import TableName, clean_error, pg_columns, pg_connect
from exactly.errors import ConfigError

_INTEGER_KEYS = ("smallint", "integer", "bigint")
_FETCH = 50_000


def spark_type(pg: str, precision: int | None, scale: int | None) -> tuple[DataType, bool]:
    """Spark type for a PostgreSQL type; the flag says the value is read as ``::text``."""
    simple: dict[str, DataType] = {
        "smallint": ShortType(), "integer": IntegerType(), "bigint": LongType(),
        "real": FloatType(), "double precision": DoubleType(), "boolean": BooleanType(),
        "text": StringType(), "character varying": StringType(), "character": StringType(),
        "bytea": BinaryType(), "date": DateType(),
        "timestamp with time zone": TimestampType(),
        "timestamp without time zone": TimestampNTZType(),
    }
    if pg in simple:
        return simple[pg], False
    if pg == "numeric" and precision is not None and precision <= 38:
        return DecimalType(precision, scale or 0), False
    return StringType(), True


@dataclass(frozen=True)
class KeyRange(InputPartition):
    low: int  # exclusive
    high: int  # inclusive


def _options(options: Mapping[str, str]) -> tuple[TableName, str, list[str] | None]:
    table = options.get(opt.TABLE)
    if not table:
        raise ConfigError("exactly.postgres source: set option table")
    columns = [c.strip() for c in options.get(opt.COLUMNS, "").split(",") if c.strip()] or None
    return TableName.parse(table), options.get(opt.KEY_COLUMN, opt.DEFAULT_KEY_COLUMN), columns


def table_schema(dsn: str, options: Mapping[str, str]) -> StructType:
    """The Spark schema of the source table (all columns, or option ``columns``)."""
    table, key, wanted = _options(options)
    with pg_connect(dsn, application="exactly-source", autocommit=True) as conn:
        cols = pg_columns(conn, table)
        if cols is None:
            raise ConfigError(f"exactly.postgres source: table {table} does not exist")
        meta = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT column_name, numeric_precision, numeric_scale FROM information_schema.columns"
            " WHERE table_schema = coalesce(%s, current_schema()) AND table_name = %s",
            (table.schema, table.name)).fetchall()}
    by_name = {c.name: c for c in cols}
    if key not in by_name or by_name[key].type not in _INTEGER_KEYS:
        raise ConfigError(f"exactly.postgres source: keyColumn {key!r} must be an integer column "
                          f"of {table} (found: {by_name[key].type if key in by_name else 'none'})")
    names = wanted or [c.name for c in cols]
    fields = []
    for name in names:
        if name not in by_name:
            raise ConfigError(f"exactly.postgres source: column {name!r} is not in {table}")
        dtype, _ = spark_type(by_name[name].type, *meta[name])
        fields.append(StructField(name, dtype, by_name[name].nullable))
    return StructType(fields)


class PostgresTableStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads new rows of a table by key range; see the module docstring."""

    def __init__(self, dsn: str, options: Mapping[str, str], schema: StructType) -> None:
        opt.check_option_names("exactly.postgres", options, "source")
        self.dsn = dsn
        self.table, self.key, _ = _options(options)
        raw = options.get(opt.MAX_ROWS_PER_TRIGGER)
        self.max_rows = int(raw) if raw else None
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError("exactly.postgres source: maxRowsPerTrigger must be >= 1")
        self.partitions_n = max(1, int(options.get(opt.NUM_PARTITIONS, 2)))
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._target: int | None = None

    def __repr__(self) -> str:
        return f"PostgresTableStreamReader(table={self.table}, key={self.key})"

    def _query(self, sql_text, params: tuple = ()) -> list[tuple]:
        try:
            with pg_connect(self.dsn, application="exactly-source", autocommit=True) as conn:
                return conn.execute(sql_text, params).fetchall()
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"reading {self.table}") from None

    def initialOffset(self) -> dict:
        return {"key": None}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        from psycopg import sql

        budget = current_admission().row_budget(bounded_run=self._target is not None)
        if budget == 0:  # paused or closed: no epoch now (and no query to the table)
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is not None:
            max_rows = budget if max_rows is None else min(max_rows, budget)
        low = start["key"]
        where: sql.Composable = sql.SQL("")
        params: tuple = ()
        if low is not None:
            where = sql.SQL("WHERE {} > %s").format(sql.Identifier(self.key))
            params = (int(low),)
        if self._target is not None:
            where = sql.SQL("{} {} {} <= %s").format(
                where, sql.SQL("AND" if low is not None else "WHERE"), sql.Identifier(self.key))
            params = (*params, self._target)
        if max_rows is not None:
            stmt = sql.SQL("SELECT max(k) FROM (SELECT {} AS k FROM {} {} ORDER BY {} LIMIT %s) s"
                           ).format(sql.Identifier(self.key), self.table.sql(), where,
                                    sql.Identifier(self.key))
            params = (*params, max_rows)
        else:
            stmt = sql.SQL("SELECT max({}) FROM {} {}").format(
                sql.Identifier(self.key), self.table.sql(), where)
        end = self._query(stmt, params)[0][0]
        return start if end is None else {"key": int(end)}

    def prepareForTriggerAvailableNow(self) -> None:
        from psycopg import sql

        top = self._query(sql.SQL("SELECT max({}) FROM {}").format(
            sql.Identifier(self.key), self.table.sql()))[0][0]
        self._target = int(top) if top is not None else -(2**63)

    def partitions(self, start: dict, end: dict) -> list[KeyRange]:
        if end["key"] is None:
            return []
        high = int(end["key"])
        if start["key"] is None:
            from psycopg import sql

            first = self._query(sql.SQL("SELECT min({}) FROM {}").format(
                sql.Identifier(self.key), self.table.sql()))[0][0]
            low = int(first) - 1 if first is not None else high
        else:
            low = int(start["key"])
        if high <= low:
            return []
        n = min(self.partitions_n, high - low)
        bounds = np.linspace(low, high, n + 1).round().astype(np.int64)
        bounds[0], bounds[-1] = low, high
        return [KeyRange(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]

    def read(self, partition: KeyRange):  # type: ignore[override]
        from psycopg import sql

        cols = sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(f.name))
            if _as_text(f) else sql.Identifier(f.name) for f in self.schema.fields)
        stmt = sql.SQL("SELECT {} FROM {} WHERE {} > %s AND {} <= %s ORDER BY {}").format(
            cols, self.table.sql(), sql.Identifier(self.key), sql.Identifier(self.key),
            sql.Identifier(self.key))
        try:
            with pg_connect(self.dsn, application="exactly-source") as conn, \
                    conn.cursor(name="exactly_read") as cur:
                cur.execute(stmt, (partition.low, partition.high))
                while True:
                    rows = cur.fetchmany(_FETCH)
                    if not rows:
                        break
                    columns = list(zip(*rows, strict=True))
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(list(c), type=f.type)
                         for c, f in zip(columns, self.arrow_schema, strict=True)],
                        schema=self.arrow_schema)
        except (pa.ArrowException, ConfigError):
            raise
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"reading {self.table}") from None

    def commit(self, end: dict) -> None:
        pass


def _as_text(field: StructField) -> bool:
    """String columns are read as ``::text``: also types without a mapping (json, uuid, ...)."""
    return isinstance(field.dataType, StringType)

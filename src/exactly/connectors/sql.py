"""Shared SQL plumbing of the database sinks: connections, identifiers, type mapping, tables.

Type mapping (Arrow type of the DataFrame column -> PostgreSQL / SQLite column type):

==========================  ====================  =========
Spark / Arrow               PostgreSQL            SQLite
==========================  ====================  =========
byte, short (int8, int16)   smallint              INTEGER
int (int32)                 integer               INTEGER
long (int64)                bigint                INTEGER
float (float32)             real                  REAL
double (float64)            double precision      REAL
decimal(p, s)               numeric(p, s)         TEXT
boolean                     boolean               INTEGER
string                      text                  TEXT
binary                      bytea                 BLOB
date                        date                  TEXT (ISO)
timestamp (UTC)             timestamp with tz     TEXT (ISO)
timestamp_ntz               timestamp             TEXT (ISO)
==========================  ====================  =========

Other types (arrays, maps, structs) are refused with an error naming the column. A table
that does not exist is created from the DataFrame's schema; a table that exists is validated:
every DataFrame column must be there with a compatible type (extra table columns must be
nullable or have a default). Identifiers are always quoted, so any name is safe.

Passwords in DSNs never appear in errors or logs: :func:`redact_dsn` hides them in both the
URL form (``postgresql://user:secret@host/db``) and the key/value form (``password=secret``).
"""

from __future__ import annotations

import io
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from exactly.errors import ConfigError, ExactlyError
from exactly.logs import redact
from exactly.retry import retry_call

T = TypeVar("T")

_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_dsn(text: Any) -> str:
    """``text`` with every DSN password replaced by ``***``."""
    return _KV_PASSWORD.sub(r"\1***", redact(str(text)))


def _secret_of(dsn: str) -> str | None:
    m = re.search(r"://[^:/@\s]+:([^@\s]+)@", dsn) or _KV_PASSWORD.search(dsn)
    if m is None:
        return None
    return m.group(m.lastindex or 1).strip("'")


class DatabaseError(ExactlyError):
    """A database call failed; the message names the operation and hides DSN passwords."""


def clean_error(exc: BaseException, dsn: str, doing: str) -> DatabaseError:
    """A :class:`DatabaseError` for ``exc`` that says what was being done, without secrets."""
    text = redact_dsn(f"{type(exc).__name__}: {exc}")
    secret = _secret_of(dsn)
    if secret:
        text = text.replace(secret, "***")
    return DatabaseError(f"{doing}: {text}")


# -- PostgreSQL connections -------------------------------------------------------------
def pg_connect(dsn: str, *, application: str, autocommit: bool = False,
               lock_timeout_ms: int | None = None, connect_timeout: int = 10):
    """A psycopg connection; errors come back as :class:`DatabaseError` without secrets."""
    import psycopg

    try:
        conn = psycopg.connect(dsn, autocommit=autocommit, application_name=application,
                               connect_timeout=connect_timeout)
    except psycopg.Error as exc:
        raise clean_error(exc, dsn, f"connecting to PostgreSQL ({redact_dsn(dsn)})") from None
    if lock_timeout_ms is not None:
        with conn.cursor() as cur:
            cur.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
        if not autocommit:
            conn.commit()
    return conn


class NoAnswerError(DatabaseError):
    """PostgreSQL did not answer a statement within the sink's ``commitTimeoutMs``; the
    connection was closed. The statement may or may not have taken effect: the caller
    resolves that from the target's own record (a retry does, and so does recovery)."""


@contextmanager
def answer_deadline(conn, seconds: float | None, *, what: str) -> Iterator[None]:
    """Bound how long the statements run inside the block wait for PostgreSQL's answer.

    libpq has no client-side statement timeout, and nothing else bounds a wait for an answer
    that was lost on the way (measured through a proxy that swallows it: psycopg waits until
    the connection is reset, however long): ``statement_timeout`` runs in the server, which
    already answered; ``connect_timeout`` covers only connecting; TCP keepalives and
    ``tcp_user_timeout`` notice a peer that stops acknowledging, not a path that drops one
    answer. When ``seconds`` pass, the connection's socket is shut down -- the waiting call
    fails at once -- and :class:`NoAnswerError` names ``what`` went unanswered. The
    connection is unusable afterwards: close it. ``seconds`` None or 0: no bound.
    """
    if not seconds:
        yield
        return
    fd = conn.fileno()
    lock = threading.Lock()
    state = {"open": True, "expired": False}

    def expire() -> None:
        with lock:
            if not state["open"]:
                return
            state["expired"] = True
            try:
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)  # the waiting recv() returns at once
            except OSError:
                pass  # already closed: the statement's own error stands

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        with lock:
            state["open"] = False
        if state["expired"]:
            raise NoAnswerError(
                f"{what}: no answer from PostgreSQL within {seconds:g} s (option "
                "commitTimeoutMs); the connection was closed. The answer was lost or the "
                "server or the network hung; whether the statement took effect is resolved "
                "from the target's own record by the retry or, failing that, by the recovery "
                "of the next run. Raise commitTimeoutMs if the server is only slow to "
                "answer.") from None
        raise
    finally:
        timer.cancel()
        with lock:
            state["open"] = False


class KeptConnection:
    """One driver-side PostgreSQL connection (autocommit, application ``exactly-commit``),
    opened on first use and kept across calls and epochs: a sink's commit steps are a few
    short statements, and opening a connection costs more than they do.

    :meth:`use` hands it out with its statements bounded by ``seconds``
    (:func:`answer_deadline`); any failure inside closes and forgets it, so the next use (a
    retry of an idempotent step, the next epoch) connects afresh -- after a server restart, a
    dropped connection or a statement left unanswered. A connection the server closed while
    it sat idle is noticed at its next use the same way: the statement fails as transient and
    the retry reconnects. One thread uses it at a time; a pickled copy (an executor's sink)
    carries no connection."""

    def __init__(self, dsn: str, seconds: float | None) -> None:
        self.dsn = dsn
        self.seconds = seconds
        self._conn: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "seconds": self.seconds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dsn"], state["seconds"])  # type: ignore[misc]

    def __repr__(self) -> str:  # never show the DSN's password
        return f"KeptConnection({redact_dsn(self.dsn)!r})"

    @contextmanager
    def use(self, *, what: str) -> Iterator[Any]:
        """The kept connection (opened when there is none or it is closed or broken)."""
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                conn = self._conn = pg_connect(self.dsn, application="exactly-commit",
                                               autocommit=True)
            try:
                with answer_deadline(conn, self.seconds, what=what):
                    yield conn
            except BaseException:
                self._drop()
                raise

    def close(self) -> None:
        """Close the kept connection (the next use opens a new one)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):  # a broken connection: nothing left to close
                conn.close()


def is_transient(exc: BaseException) -> bool:
    """A lost connection or a server restart: retrying an idempotent step is safe."""
    import psycopg

    if isinstance(exc, NoAnswerError):
        return True
    if isinstance(exc, DatabaseError):
        return "OperationalError" in str(exc) or "connecting to PostgreSQL" in str(exc)
    return isinstance(exc, (psycopg.OperationalError, psycopg.errors.AdminShutdown,
                            psycopg.errors.CannotConnectNow))


def retrying(step: Callable[[], T], *, seconds: float, what: str, dsn: str) -> T:
    """Run an idempotent ``step``, retrying transient database failures (:func:`is_transient`)
    for up to ``seconds`` under the package's retry policy (:mod:`exactly.retry`).

    A failure that is not transient, or the last one, is raised: exactly's own errors as
    they are, driver errors as a :class:`DatabaseError` saying ``what`` failed, without
    secrets.
    """
    try:
        return retry_call(step, what=what, transient=is_transient, seconds=seconds,
                          describe=lambda exc: str(clean_error(exc, dsn, what)))
    except Exception as exc:
        if isinstance(exc, ExactlyError) or not _is_driver_error(exc):
            raise
        raise clean_error(exc, dsn, what) from None


def _is_driver_error(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.Error)


# -- identifiers --------------------------------------------------------------------
@dataclass(frozen=True)
class TableName:
    """A possibly schema-qualified table name, parsed from ``schema.table`` or ``table``.

    Quote a part with double quotes to keep dots or capitals: ``"my.schema"."Odd Table"``.
    """

    schema: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        parts = _split_identifier(text)
        if len(parts) == 1:
            return cls(None, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ConfigError(f"table name {text!r}: use table or schema.table (quote names that "
                          "contain dots with double quotes)")

    def sql(self):
        from psycopg import sql

        if self.schema:
            return sql.Identifier(self.schema, self.name)
        return sql.Identifier(self.name)

    def sqlite(self) -> str:
        return quote_sqlite(self.name)

    def with_name(self, name: str) -> TableName:
        return TableName(self.schema, name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


def _split_identifier(text: str) -> list[str]:
    parts, buf, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if quoted and i + 1 < len(text) and text[i + 1] == '"':
                buf.append('"')
                i += 1
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    if quoted or any(not p for p in parts):
        raise ConfigError(f"table name {text!r} is malformed")
    return parts


def quote_sqlite(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- types --------------------------------------------------------------------------
def pg_type(field: pa.Field) -> str:
    """PostgreSQL column type for an Arrow field (see the module table)."""
    t = field.type
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "integer"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    raise ConfigError(f"column {field.name!r}: type {t} has no PostgreSQL mapping in exactly's "
                      "database sinks; cast it (e.g. to_json(col) for arrays/structs)")


def sqlite_type(field: pa.Field) -> str:
    t = field.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "REAL"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BLOB"
    pg_type(field)  # refuses unsupported types with the same message
    return "TEXT"


#: PostgreSQL types that accept values of the left-hand type without loss
_PG_COMPATIBLE = {
    "smallint": {"smallint", "integer", "bigint", "numeric", "double precision", "real"},
    "integer": {"integer", "bigint", "numeric", "double precision"},
    "bigint": {"bigint", "numeric"},
    "real": {"real", "double precision"},
    "double precision": {"double precision"},
    "numeric": {"numeric"},
    "boolean": {"boolean"},
    "text": {"text", "character varying", "character", "json", "jsonb"},
    "bytea": {"bytea"},
    "date": {"date", "timestamp without time zone", "timestamp with time zone"},
    "timestamp with time zone": {"timestamp with time zone"},
    "timestamp without time zone": {"timestamp without time zone"},
}


def pg_compatible(wanted: str, actual: str) -> bool:
    base = wanted.split("(")[0]
    return actual in _PG_COMPATIBLE.get(base, {base})


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    has_default: bool


def pg_relation_exists(conn, table: TableName) -> bool:
    """Whether ``table`` (a table or view) exists in PostgreSQL."""
    return conn.execute("SELECT to_regclass(%s)",
                        (table.sql().as_string(conn),)).fetchone()[0] is not None


def create_pg_table(conn, table: TableName, columns: str) -> None:
    """``CREATE TABLE IF NOT EXISTS table (columns)``, its schema first; committed.
    ``columns`` is SQL the caller writes (no user input)."""
    from psycopg import sql

    with conn.cursor() as cur:
        if table.schema:
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(table.schema)))
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + columns + ")").format(
            table.sql()))
    conn.commit()


def pg_columns(conn, table: TableName) -> list[Column] | None:
    """The columns of ``table`` in order, or None when it does not exist."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.column_name, c.data_type, c.is_nullable = 'YES', "
            "       c.column_default IS NOT NULL OR c.is_identity = 'YES' "
            "FROM information_schema.columns c "
            "WHERE c.table_schema = coalesce(%s, current_schema()) AND c.table_name = %s "
            "ORDER BY c.ordinal_position", (table.schema, table.name))
        rows = cur.fetchall()
    if not rows:
        return None
    return [Column(r[0], r[1], bool(r[2]), bool(r[3])) for r in rows]


def ensure_pg_table(conn, table: TableName, schema: pa.Schema, *,
                    extra: Sequence[tuple[str, str]] = (),
                    primary_key: Sequence[str] = (), sink: str) -> None:
    """Create ``table`` from ``schema`` (plus ``extra`` columns) when absent, else validate it.

    Raises ConfigError naming the column when an existing table does not fit.
    """
    from psycopg import sql

    wanted = [(f.name, pg_type(f)) for f in schema] + list(extra)
    existing = pg_columns(conn, table)
    if existing is None:
        parts = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in wanted]
        if primary_key:
            parts.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(sql.Identifier(k) for k in primary_key)))
        with conn.cursor() as cur:
            if table.schema:
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(table.schema)))
            cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                table.sql(), sql.SQL(", ").join(parts)))
        conn.commit()
        return
    by_name = {c.name: c for c in existing}
    problems = []
    for name, typ in wanted:
        col = by_name.get(name)
        if col is None:
            problems.append(f"column {name!r} ({typ}) is missing")
        elif not pg_compatible(typ.removesuffix(" NOT NULL"), col.type):
            problems.append(f"column {name!r} is {col.type}, the stream writes "
                            f"{typ.removesuffix(' NOT NULL')}")
    wanted_names = {n for n, _ in wanted}
    for col in existing:
        if col.name not in wanted_names and not col.nullable and not col.has_default:
            problems.append(f"column {col.name!r} is NOT NULL without a default and the stream "
                            "does not write it")
    if primary_key:
        problems += _check_unique_key(conn, table, primary_key)
    if problems:
        raise ConfigError(f"{sink} sink: table {table} does not fit the stream: "
                          + "; ".join(problems)
                          + ". Alter the table, or write to a new table name and let the sink "
                            "create it.")
    conn.commit()


def _check_unique_key(conn, table: TableName, key: Sequence[str]) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique GROUP BY i.indexrelid",
            (table.sql().as_string(conn),))
        uniques = [sorted(r[0]) for r in cur.fetchall()]
    if sorted(key) not in uniques:
        return [f"no PRIMARY KEY or UNIQUE index on ({', '.join(key)}), which an upsert needs"]
    return []


# -- COPY -----------------------------------------------------------------------------
#: rows per CSV chunk handed to COPY (a chunk is encoded while the previous one is sent)
COPY_CHUNK_ROWS = 50_000


def copy_ready(table: pa.Table) -> pa.Table:
    """``table`` with the columns Arrow's CSV writer would render slowly or in a form
    PostgreSQL does not read turned into text PostgreSQL reads:

    * timezone-aware timestamps: the UTC wall time with ``+00`` (Arrow renders them through a
      time zone lookup per value, ~7x the cost of the cast; a ``timestamp with time zone``
      column, the only one such a column maps to, reads the instant unchanged);
    * booleans as ``true``/``false``; binary as ``\\x``-hex for ``bytea``.
    """
    for i, field in enumerate(table.schema):
        column = table.column(i)
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            utc = pc.cast(column.cast(pa.timestamp(field.type.unit)), pa.string())
            text = pc.binary_join_element_wise(utc, pa.scalar("+00"), "")
            table = table.set_column(i, field.name, text)
        elif pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            hexed = pa.array([None if v is None else "\\x" + v.hex()
                              for v in column.to_pylist()], pa.string())
            table = table.set_column(i, field.name, hexed)
        elif pa.types.is_boolean(field.type):
            table = table.set_column(i, field.name, pc.cast(column, pa.string()))
    return table


def csv_chunks(batch: pa.RecordBatch | pa.Table,
               chunk_rows: int = COPY_CHUNK_ROWS) -> Iterator[bytes]:
    """``batch`` as CSV for ``COPY ... FROM STDIN (FORMAT csv)``: unquoted empty = NULL,
    ``""`` = empty string (:func:`copy_ready` for the columns that need converting)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    table = copy_ready(table)
    options = pacsv.WriteOptions(include_header=False)
    for offset in range(0, table.num_rows, chunk_rows):
        buf = io.BytesIO()
        pacsv.write_csv(table.slice(offset, chunk_rows), buf, options)
        yield buf.getvalue()


class CopyStream:
    """One ``COPY table (columns) FROM STDIN (FORMAT csv)`` kept open across batches, so a
    write task sends its rows in one statement however many Arrow batches Spark hands it.

    :meth:`write` sends a batch (its columns must be the ``columns`` given);
    :meth:`finish` ends the COPY, where the server reports a bad row. After an error the
    transaction is unusable: close the connection (which rolls it back).
    """

    def __init__(self, cur, table: TableName, columns: Sequence[str]) -> None:
        from psycopg import sql

        stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table.sql(), sql.SQL(", ").join(sql.Identifier(n) for n in columns))
        self._context = cur.copy(stmt)
        self._copy = self._context.__enter__()
        self.rows = 0

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        for chunk in csv_chunks(batch):
            self._copy.write(chunk)
        self.rows += batch.num_rows

    def finish(self) -> int:
        """End the COPY; returns the rows sent."""
        self._context.__exit__(None, None, None)
        return self.rows


def copy_into(cur, table: TableName, batch: pa.RecordBatch | pa.Table) -> int:
    """COPY the rows of ``batch`` into ``table`` (columns by name); returns the row count."""
    if batch.num_rows == 0:
        return 0
    stream = CopyStream(cur, table, batch.schema.names)
    stream.write(batch)
    return stream.finish()


@contextmanager
def sqlite_connect(path: str):
    """A SQLite connection in autocommit mode (transactions are explicit BEGIN/COMMIT)."""
    import sqlite3

    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        yield conn
    finally:
        conn.close()


def sqlite_value_columns(table: pa.Table) -> list[list[Any]]:
    """Rows of ``table`` as SQLite-storable values (ISO text for dates and timestamps)."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        values = column.to_pylist()
        t = field.type
        if pa.types.is_timestamp(t) or pa.types.is_date(t):
            values = [None if v is None else v.isoformat() for v in values]
        elif pa.types.is_decimal(t):
            values = [None if v is None else str(v) for v in values]
        elif pa.types.is_boolean(t):
            values = [None if v is None else int(v) for v in values]
        columns.append(values)
    return [list(row) for row in zip(*columns, strict=True)] if columns else []


def ensure_sqlite_table(conn, table: TableName, schema: pa.Schema, *, sink: str) -> None:
    existing = conn.execute(f"PRAGMA table_info({table.sqlite()})").fetchall()
    if not existing:
        cols = ", ".join(f"{quote_sqlite(f.name)} {sqlite_type(f)}" for f in schema)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table.sqlite()} ({cols})")
        return
    names = {row[1] for row in existing}
    missing = [f.name for f in schema if f.name not in names]
    if missing:
        raise ConfigError(f"{sink} sink: SQLite table {table} lacks column(s) "
                          f"{', '.join(repr(m) for m in missing)} that the stream writes; alter "
                          "the table or write to a new one")

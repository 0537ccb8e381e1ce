"""Write-ahead sink: rows staged as Parquet beside the checkpoint, loaded at commit with a marker.

Guarantee: exactly once in ``exactly_once`` mode -- every row of epoch n is loaded into the
table exactly once, all of epoch n in one database transaction; at least once in
``at_least_once`` mode (each task loads its rows at once, without a marker; a replay loads
them again).

This is Flink's ``GenericWriteAheadSink`` without the flaw the seeds note: there the data is
committed to the database and *then* the checkpoint records that it was, so a crash between
the two re-sends the epoch and duplicates it. Here the transaction that loads epoch n also
inserts ``(query, table, epoch n)`` into a marker table; "epoch n is loaded" and "its rows are
in the table" become true in the same commit, so a repeated load finds the marker and does
nothing.

Executor side: each task writes its rows to ``<log dir>/wal/<epoch>/<attempt>/rows.parquet``
(fsynced on a disk, one completed upload on object storage; the handle names the file). Driver
side: ``publish_epoch`` opens one transaction, inserts the marker (a conflict means the epoch
is already loaded: roll back, done), loads every staged file of the epoch, commits, then
removes the staged files. Works with any transactional store; PostgreSQL (COPY) and SQLite
(embedded, no server) are built in. The log location must be reachable from the executors and
the driver: local disk for ``local`` mode and one-host clusters, a shared mount or an ``s3://``
prefix otherwise (:mod:`exactly.protocol.staging`).

Target state (restores, :mod:`exactly.protocol.target_state`): several queries may load into
one table (their markers are kept apart by query), so the table records lineage as edges: a
restore inserts ``(target, new query, parent query, parent epoch)`` into the lineage table
``<marker table>_lineage`` (created by the first restore). The progress of a line is the
newest marker of its newest query (before that query loaded any, the epoch it was restored
from). Loaded rows carry neither epoch nor query, so a rollback cannot ``retract``; ``keep``
loads the epochs after the savepoint again (they are then in the table twice).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exactly import options as opt
from exactly.connectors.sql import (
    KeptConnection,
    TableName,
    answer_deadline,
    clean_error,
    copy_into,
    create_pg_table,
    ensure_pg_table,
    ensure_sqlite_table,
    pg_connect,
    pg_relation_exists,
    quote_sqlite,
    redact_dsn,
    retrying,
    sqlite_connect,
    sqlite_value_columns,
)
from exactly.errors import ConfigError, DataLossError
from exactly.protocol.contract import (
    CommitOutcome,
    Edge,
    Handle,
    Lineage,
    Restored,
    RollbackSupport,
    TargetState,
)
from exactly.protocol.stages import open_stage
from exactly.protocol.staging import StagedTxn, StagingSink
from exactly.protocol.target_state import line_state

DEFAULT_MARKER_TABLE = opt.DEFAULT_WAL_MARKER_TABLE


class WalTarget(ABC):
    """A transactional store the write-ahead sink loads epochs into."""

    table: TableName
    markers: TableName

    @abstractmethod
    def prepare(self, schema: pa.Schema) -> None:
        """Create or validate the table and the marker table."""

    @abstractmethod
    def has_marker(self, query_id: str, epoch: int) -> bool:
        """True when epoch ``epoch`` of ``query_id`` has been loaded."""

    @abstractmethod
    def load(self, query_id: str, epoch: int, tables: Iterable[pa.Table]) -> bool:
        """In ONE transaction: insert the marker, load ``tables``. False (and nothing
        loaded) when the marker was already there."""

    @abstractmethod
    def append(self, table: pa.Table) -> None:
        """at_least_once: load rows at once, without a marker."""

    @abstractmethod
    def describe(self) -> str:
        """Where the rows go, without secrets."""

    @abstractmethod
    def last_epoch(self, query_id: str) -> int | None:
        """The newest epoch of ``query_id`` loaded into the table (None: none)."""

    @abstractmethod
    def edges(self) -> list[Edge]:
        """The hand-overs recorded for this table (none before the first restore)."""

    @abstractmethod
    def record_edge(self, edge: Edge) -> None:
        """Record a hand-over (idempotent: one row per new query)."""

    @property
    def lineage_table(self) -> TableName:
        """Where hand-overs are recorded: ``<marker table>_lineage``."""
        return self.markers.with_name(f"{self.markers.name}_lineage")


class PostgresWalTarget(WalTarget):
    def __init__(self, dsn: str, table: str, marker_table: str = DEFAULT_MARKER_TABLE,
                 retry_seconds: float = 60.0,
                 commit_timeout_ms: int = opt.DEFAULT_COMMIT_TIMEOUT_MS) -> None:
        self.dsn = dsn
        self.table = TableName.parse(table)
        self.markers = TableName.parse(marker_table) if "." in marker_table else \
            self.table.with_name(marker_table)
        self.retry_seconds = retry_seconds
        #: seconds to wait for the answer to a load's COMMIT or a marker lookup (0: no bound)
        self.commit_timeout = commit_timeout_ms / 1000
        #: the driver's connection for marker lookups, kept across epochs
        self._lookups = KeptConnection(dsn, self.commit_timeout)

    def describe(self) -> str:
        return f"PostgreSQL {redact_dsn(self.dsn)} table {self.table}"

    def prepare(self, schema: pa.Schema) -> None:
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-setup") as conn:
            ensure_pg_table(conn, self.table, schema, sink="wal")
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (query_id text NOT NULL, target text NOT NULL, "
                "epoch bigint NOT NULL, rows bigint NOT NULL, "
                "loaded_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (query_id, target, epoch))").format(self.markers.sql()))
            conn.commit()

    def has_marker(self, query_id: str, epoch: int) -> bool:
        from psycopg import sql

        def step() -> bool:
            with self._lookups.use(what="reading a marker") as conn:
                return conn.execute(sql.SQL(
                    "SELECT 1 FROM {} WHERE query_id = %s AND target = %s AND epoch = %s").format(
                    self.markers.sql()), (query_id, str(self.table), epoch)).fetchone() is not None

        return retrying(step, seconds=self.retry_seconds, dsn=self.dsn, what="reading a marker")

    def load(self, query_id: str, epoch: int, tables: Iterable[pa.Table]) -> bool:
        from psycopg import sql

        tables = list(tables)
        rows = sum(t.num_rows for t in tables)

        def step() -> bool:
            with pg_connect(self.dsn, application="exactly-commit") as conn:
                with conn.cursor() as cur:
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (query_id, target, epoch, rows) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING").format(self.markers.sql()),
                        (query_id, str(self.table), epoch, rows))
                    if cur.rowcount == 0:
                        conn.rollback()
                        return False  # loaded before: the marker committed with the rows
                    for table in tables:
                        copy_into(cur, self.table, table)
                # the ambiguous commit: applied, answer lost -> the retry meets the marker
                with answer_deadline(conn, self.commit_timeout,
                                     what=f"COMMIT of epoch {epoch}'s load"):
                    conn.commit()
                return True

        return retrying(step, seconds=self.retry_seconds, dsn=self.dsn,
                        what=f"loading epoch {epoch} into {self.table}")

    def last_epoch(self, query_id: str) -> int | None:
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-restore", autocommit=True) as conn:
            if not pg_relation_exists(conn, self.markers):
                return None
            row = conn.execute(sql.SQL("SELECT max(epoch) FROM {} WHERE query_id = %s AND "
                                       "target = %s").format(self.markers.sql()),
                               (query_id, str(self.table))).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def edges(self) -> list[Edge]:
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-restore", autocommit=True) as conn:
            if not pg_relation_exists(conn, self.lineage_table):
                return []
            rows = conn.execute(sql.SQL(
                "SELECT query_id, parent_query_id, parent_epoch, restored_at FROM {} "
                "WHERE target = %s").format(self.lineage_table.sql()),
                (str(self.table),)).fetchall()
        return [Edge(r[0], Restored(r[1], int(r[2])), float(r[3])) for r in rows]

    def record_edge(self, edge: Edge) -> None:
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-restore") as conn:
            # its schema too: a fork may come before the job made it
            create_pg_table(conn, self.lineage_table,
                            "target text NOT NULL, query_id text NOT NULL, "
                            "parent_query_id text NOT NULL, parent_epoch bigint NOT NULL, "
                            "restored_at double precision NOT NULL, "
                            "PRIMARY KEY (target, query_id)")
            conn.execute(sql.SQL(
                "INSERT INTO {} (target, query_id, parent_query_id, parent_epoch, restored_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (target, query_id) DO UPDATE SET "
                "parent_query_id = excluded.parent_query_id, "
                "parent_epoch = excluded.parent_epoch, restored_at = excluded.restored_at"
            ).format(self.lineage_table.sql()),
                (str(self.table), edge.query_id, edge.parent.query_id, edge.parent.epoch,
                 edge.at))
            conn.commit()

    def append(self, table: pa.Table) -> None:
        try:
            with pg_connect(self.dsn, application="exactly-write") as conn:
                with conn.cursor() as cur:
                    copy_into(cur, self.table, table)
                conn.commit()
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"COPY into {self.table}") from None


class SqliteWalTarget(WalTarget):
    """SQLite: an embedded file database, no server. The driver is its only writer."""

    def __init__(self, path: str, table: str, marker_table: str = DEFAULT_MARKER_TABLE) -> None:
        self.path = str(Path(path).absolute())
        self.table = TableName.parse(table)
        if self.table.schema:
            raise ConfigError(f"wal sink: SQLite has no schemas; table {table!r} must be a "
                              "plain name")
        self.markers = TableName(None, marker_table)

    def describe(self) -> str:
        return f"SQLite {self.path} table {self.table}"

    def prepare(self, schema: pa.Schema) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with sqlite_connect(self.path) as conn:
            ensure_sqlite_table(conn, self.table, schema, sink="wal")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.markers.sqlite()} (query_id TEXT "
                         "NOT NULL, target TEXT NOT NULL, epoch INTEGER NOT NULL, rows INTEGER "
                         "NOT NULL, loaded_at TEXT DEFAULT CURRENT_TIMESTAMP, "
                         "PRIMARY KEY (query_id, target, epoch))")

    def has_marker(self, query_id: str, epoch: int) -> bool:
        with sqlite_connect(self.path) as conn:
            return conn.execute(f"SELECT 1 FROM {self.markers.sqlite()} WHERE query_id = ? AND "
                                "target = ? AND epoch = ?",
                                (query_id, str(self.table), epoch)).fetchone() is not None

    def _insert(self, conn, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        cols = ", ".join(quote_sqlite(n) for n in table.schema.names)
        marks = ", ".join("?" for _ in table.schema.names)
        conn.executemany(f"INSERT INTO {self.table.sqlite()} ({cols}) VALUES ({marks})",
                         sqlite_value_columns(table))

    def load(self, query_id: str, epoch: int, tables: Iterable[pa.Table]) -> bool:
        tables = list(tables)
        with sqlite_connect(self.path) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cur = conn.execute(f"INSERT OR IGNORE INTO {self.markers.sqlite()} (query_id, "
                                   "target, epoch, rows) VALUES (?, ?, ?, ?)",
                                   (query_id, str(self.table), epoch,
                                    sum(t.num_rows for t in tables)))
                if cur.rowcount == 0:
                    conn.execute("ROLLBACK")
                    return False
                for table in tables:
                    self._insert(conn, table)
                conn.execute("COMMIT")
                return True
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def append(self, table: pa.Table) -> None:
        with sqlite_connect(self.path) as conn:
            conn.execute("BEGIN IMMEDIATE")
            self._insert(conn, table)
            conn.execute("COMMIT")

    def _has_table(self, conn, table: TableName) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (table.name,)).fetchone() is not None

    def last_epoch(self, query_id: str) -> int | None:
        if not Path(self.path).exists():
            return None
        with sqlite_connect(self.path) as conn:
            if not self._has_table(conn, self.markers):
                return None
            row = conn.execute(f"SELECT max(epoch) FROM {self.markers.sqlite()} WHERE "
                               "query_id = ? AND target = ?",
                               (query_id, str(self.table))).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def edges(self) -> list[Edge]:
        if not Path(self.path).exists():
            return []
        with sqlite_connect(self.path) as conn:
            if not self._has_table(conn, self.lineage_table):
                return []
            rows = conn.execute(f"SELECT query_id, parent_query_id, parent_epoch, restored_at "
                                f"FROM {self.lineage_table.sqlite()} WHERE target = ?",
                                (str(self.table),)).fetchall()
        return [Edge(r[0], Restored(r[1], int(r[2])), float(r[3])) for r in rows]

    def record_edge(self, edge: Edge) -> None:
        table = self.lineage_table.sqlite()
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)  # a fork comes first
        with sqlite_connect(self.path) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (target TEXT NOT NULL, query_id "
                         "TEXT NOT NULL, parent_query_id TEXT NOT NULL, parent_epoch INTEGER "
                         "NOT NULL, restored_at REAL NOT NULL, PRIMARY KEY (target, query_id))")
            conn.execute(f"INSERT OR REPLACE INTO {table} (target, query_id, parent_query_id, "
                         "parent_epoch, restored_at) VALUES (?, ?, ?, ?, ?)",
                         (str(self.table), edge.query_id, edge.parent.query_id,
                          edge.parent.epoch, edge.at))
            conn.execute("COMMIT")


def target_from_options(options: Mapping[str, str], dsn: str | None) -> WalTarget:
    """PostgreSQL when a DSN is given, else SQLite at option ``path`` / ``sqlite:PATH``."""
    table = options.get(opt.TABLE)
    if not table:
        raise ConfigError("wal sink: set option table")
    marker = options.get(opt.MARKER_TABLE, opt.DEFAULT_WAL_MARKER_TABLE)
    if dsn and dsn.startswith("sqlite:"):
        return SqliteWalTarget(dsn.removeprefix("sqlite:").removeprefix("//"), table, marker)
    if dsn:
        return PostgresWalTarget(
            dsn, table, marker,
            float(options.get(opt.RETRY_SECONDS, opt.DEFAULT_RETRY_SECONDS)),
            int(options.get(opt.COMMIT_TIMEOUT_MS, opt.DEFAULT_COMMIT_TIMEOUT_MS)))
    path = options.get(opt.PATH)
    if not path:
        raise ConfigError("wal sink: set option dsn (PostgreSQL) or path (a SQLite database "
                          "file, the embedded default)")
    return SqliteWalTarget(path, table, marker)


class WriteAheadSink(StagingSink):
    """Exactly-once rows in any transactional table: staged files + marker-guarded load."""

    name = "wal"
    recover_before_first_epoch = True

    def __init__(self, target: WalTarget, log_dir: str | Path) -> None:
        self.target = target
        self.stage = open_stage(log_dir, "wal", "rows.parquet")

    def __repr__(self) -> str:
        return f"WriteAheadSink({self.target.describe()})"

    @property
    def log_directory(self) -> Path | str:
        return self.stage.root

    @property
    def staging(self) -> Path | str:
        return self.stage.base

    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        self.target.prepare(schema)

    # -- executor side -----------------------------------------------------------------
    def write(self, txn: StagedTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if txn.writer is None:
            txn.writer = pq.ParquetWriter(self.stage.open_output(txn), batch.schema)
        txn.writer.write_batch(batch)
        txn.rows += batch.num_rows

    def commit_visible(self, handle: Handle) -> None:
        for table in self._tables([handle]):
            self.target.append(table)
        self.stage.discard(handle)

    # -- driver side -------------------------------------------------------------------
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """A staged file only becomes visible with its whole epoch (``publish_epoch``);
        here it is checked to be there, or recognised as loaded by the epoch's marker."""
        staged = self.stage.staged_file(handle)
        if staged.exists() if staged is not None else self.stage.has_attempt(handle):
            return CommitOutcome.COMMITTED
        if self.target.has_marker(handle.query_id, handle.epoch):
            return CommitOutcome.ALREADY_COMMITTED
        raise DataLossError(
            f"epoch {handle.epoch} partition {handle.partition}: the staged rows "
            f"{staged or self.stage.describe(handle)} named "
            f"by the commit intent are gone and the epoch's marker is not in "
            f"{self.target.describe()}; something outside exactly removed them"
        )

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Load every staged file of the epoch and the marker in one transaction."""
        if not handles:
            return
        query_id = handles[0].query_id
        if not self.target.has_marker(query_id, epoch):
            self.target.load(query_id, epoch, self._tables(handles))
        for handle in handles:
            self.stage.discard(handle)

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return self.target.describe()

    def target_state(self, query_id: str) -> TargetState:
        return line_state(self.describe_target(), self.target.edges(), query_id,
                          self.target.last_epoch)

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        return RollbackSupport(
            retract="the write-ahead sink loads rows without their epoch or query, so a "
                    "loaded epoch cannot be told apart in the table",
            keep="their rows stay and the restored job loads those epochs again: the table "
                 "then holds them twice")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Record ``to_query`` <- ``lineage[0]`` in the lineage table. Nothing else is the
        target's: staged rows live beside each query's checkpoint and are not visible."""
        parent = lineage[0]
        self.target.record_edge(Edge(to_query, parent, time.time()))
        return {"lineage_recorded": f"{to_query} <- {parent.query_id}@{parent.epoch}"}

    def _tables(self, handles: Sequence[Handle]) -> Iterator[pa.Table]:
        for handle in handles:
            staged = self.stage.staged_file(handle)
            if staged is not None:
                try:
                    source = staged.open()
                except FileNotFoundError:
                    raise DataLossError(f"epoch {handle.epoch}: staged rows {staged} vanished "
                                        "before the epoch was loaded") from None
                with source:
                    yield pq.read_table(source)

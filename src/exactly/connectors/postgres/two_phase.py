"""PostgreSQL two-phase-commit sink: ``BEGIN; COPY; PREPARE TRANSACTION``, then ``COMMIT PREPARED``.

Guarantee: exactly once in ``exactly_once`` mode -- each row of each epoch becomes visible in
the table exactly once, all rows of an epoch's task together, and nothing of epoch n before
the commit intent of epoch n is durable; at least once in ``at_least_once`` mode (each task
commits its prepared transaction itself; a replay after a crash adds the rows again).

What a reader sees. PostgreSQL commits prepared transactions one at a time, so a plain
``SELECT`` on the table sees each task's rows as soon as its ``COMMIT PREPARED`` runs: for a
moment, part of an epoch. For epoch-atomic reads the sink keeps

* the epoch of every row in a column (option ``epochColumn``, default ``exactly_epoch``,
  nullable ``bigint``);
* one row per target table in the epochs table (option ``epochsTable``, default
  ``exactly_2pc_epochs`` in the table's schema): the last epoch whose every ``COMMIT
  PREPARED`` has run, written by ``publish_epoch`` after them (idempotently, so recovery of a
  commit intent records it too), and the query that owns the table;
* a view (option ``viewName``, default ``<table>_committed``) that shows the rows of epochs
  up to that one, plus rows with a NULL epoch (written by something else). One statement
  reads the view in one snapshot, so it sees every epoch whole or not at all.

A table is bound to the first query that completes an epoch into it (epochs restart at 0 in
a new checkpoint, so the view could not tell two queries' epochs apart): a task of another
query fails before ``PREPARE`` with a ConfigError that names the fix.

Executor side, per task attempt: a connection, ``BEGIN``, the rows with their epoch (``COPY``
in ``append`` mode; ``INSERT ... ON CONFLICT (key) DO UPDATE`` in ``upsert`` mode), one row
into the marker table naming the transaction, ``PREPARE TRANSACTION 'gid'``. The prepared
transaction survives crashes of the task, of the driver and of the database server (it is in
PostgreSQL's WAL).

Driver side: ``COMMIT PREPARED 'gid'``. A committed prepared transaction leaves no trace in
``pg_prepared_xacts``; its marker row (committed with the data) tells "already committed" from
"lost": gid not prepared + marker present = already committed; neither = DataLossError.
Transient failures (dropped connection, server restart) are retried, which is safe because
every driver-side step is idempotent.

Transaction ids (gids): ``exactly:<query id>:<epoch>:<partition>:<run id>:<attempt>``, so
recovery lists a query's pre-commits with one query on ``pg_prepared_xacts``.

Server requirement: ``max_prepared_transactions`` at least the number of write tasks of an
epoch (plus room for a failed attempt); checked when the sink starts.

Target state (restores, :mod:`exactly.protocol.target_state`): the epochs table's row of the
table names its owner, the owner's last complete epoch (the line's progress: epoch numbers
continue across restores) and, in column ``lineage`` (JSON, parent first), the queries the
owner was restored from. A restore hands the row over to the new query (after aborting the
prepared transactions the superseded queries left, which would hold row locks for good). An
epochs table made before lineages has no ``lineage`` column; it is read as "never restored"
and the column is added by the first hand-over (``ALTER TABLE ... ADD COLUMN IF NOT
EXISTS``). ``retract`` (append mode only) deletes the rows of epochs after the savepoint and
sets the recorded epoch back, in one transaction; in upsert mode rows were overwritten in
place and ``keep`` converges instead (see :meth:`PostgresTwoPhaseSink.rollback_support`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from exactly import options as opt
from exactly.connectors.postgres.upsert_sql import dedup_last, upsert_rows, upsert_statement
from exactly.connectors.sql import (
    CopyStream,
    KeptConnection,
    TableName,
    answer_deadline,
    clean_error,
    create_pg_table,
    ensure_pg_table,
    pg_columns,
    pg_connect,
    pg_relation_exists,
    redact_dsn,
    retrying,
)
from exactly.errors import ConfigError, DataLossError, SavepointError
from exactly.logs import log_event
from exactly.protocol.contract import (
    CommitOutcome,
    Handle,
    Lineage,
    Payload,
    RollbackSupport,
    TargetState,
    TaskInfo,
    TwoPhaseCommitSink,
)
from exactly.protocol.target_state import lineage_from_json, lineage_to_json

logger = logging.getLogger("exactly.connectors.postgres.two_phase")

GID_TAG = "exactly"
DEFAULT_MARKER_TABLE = opt.DEFAULT_2PC_MARKER_TABLE
DEFAULT_EPOCHS_TABLE = opt.DEFAULT_EPOCHS_TABLE
DEFAULT_EPOCH_COLUMN = opt.DEFAULT_EPOCH_COLUMN
VIEW_SUFFIX = "_committed"
#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1 bytes)
MAX_IDENTIFIER_BYTES = 63
WRITE_MODES = ("append", "upsert")
#: markers of epochs older than (committed epoch - this) are deleted
MARKER_RETAIN_EPOCHS = 20
#: the epochs table's column holding the owner's lineage (JSON, parent first)
LINEAGE_COLUMN = "lineage"
#: test hook: path of a file; the driver waits before COMMIT PREPARED while it exists


def make_gid(task: TaskInfo) -> str:
    return (f"{GID_TAG}:{task.query_id}:{task.epoch}:{task.partition}:{task.run_id}:"
            f"{task.attempt}")


def parse_gid(gid: str) -> TaskInfo | None:
    parts = gid.split(":")
    if len(parts) != 6 or parts[0] != GID_TAG:
        return None
    try:
        return TaskInfo(parts[1], parts[4], int(parts[2]), int(parts[3]), int(parts[5]))
    except ValueError:
        return None


def check_prepared_capacity(conn, partitions: int | None, *, sink: str = "postgres") -> int:
    """Fail clearly when the server cannot hold an epoch's prepared transactions.

    Returns ``max_prepared_transactions``. ``partitions`` (write tasks per epoch) is checked
    when known; each task holds one prepared transaction until the epoch commits, and a failed
    attempt may hold one more until recovery aborts it.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('max_prepared_transactions')::int")
        limit = int(cur.fetchone()[0])
    need = max(2 * (partitions or 1), 2)
    if limit == 0 or (partitions is not None and limit < partitions):
        now = "0 (prepared transactions disabled)" if limit == 0 else str(limit)
        raise ConfigError(
            f"{sink} sink: the PostgreSQL server has max_prepared_transactions = {now}, but "
            f"two-phase commit needs one per write task"
            + (f" ({partitions} per epoch)" if partitions else "")
            + f". Set max_prepared_transactions = {need} (or more) in postgresql.conf (or "
            "ALTER SYSTEM SET max_prepared_transactions = ...) and restart the server; it "
            "cannot change without a restart. Or use the write-ahead sink (exactly.wal), "
            "which needs no prepared transactions."
        )
    return limit


@dataclass(frozen=True)
class PreparedPayload(Payload):
    """A pre-commit of the 2PC sink: the global id of its prepared transaction."""

    gid: str = ""


@dataclass
class PgTxn:
    task: TaskInfo
    gid: str
    conn: Any
    rows: int = 0
    pending: list[pa.RecordBatch] = field(default_factory=list)
    #: append mode: the task's one COPY, open from its first batch to pre-commit
    copy: CopyStream | None = None


class PostgresTwoPhaseSink(TwoPhaseCommitSink[PgTxn]):
    """Exactly-once rows in a PostgreSQL table through prepared transactions (2PC)."""

    name = "postgres"
    payload_type = PreparedPayload
    recover_before_first_epoch = True  # a leftover prepared transaction holds row locks

    def __init__(self, dsn: str, table: str, log_dir: str | Path, *,
                 write_mode: str = "append", key_columns: Sequence[str] = (),
                 marker_table: str = DEFAULT_MARKER_TABLE,
                 retry_seconds: float = opt.DEFAULT_RETRY_SECONDS,
                 lock_timeout_ms: int = opt.DEFAULT_LOCK_TIMEOUT_MS,
                 epoch_column: str = DEFAULT_EPOCH_COLUMN,
                 epochs_table: str = DEFAULT_EPOCHS_TABLE, view_name: str | None = None,
                 commit_timeout_ms: int = opt.DEFAULT_COMMIT_TIMEOUT_MS) -> None:
        if not dsn:
            raise ConfigError("postgres sink: set option dsn (a libpq connection string or "
                              "postgresql:// URL)")
        if not table:
            raise ConfigError("postgres sink: set option table (table or schema.table)")
        if write_mode not in WRITE_MODES:
            raise ConfigError(f"postgres sink: writeMode {write_mode!r} is not one of "
                              f"{' | '.join(WRITE_MODES)}")
        if write_mode == "upsert" and not key_columns:
            raise ConfigError("postgres sink: writeMode upsert needs option keyColumns "
                              "(comma-separated key column names)")
        self.dsn = dsn
        self.table = TableName.parse(table)
        self.markers = TableName.parse(marker_table) if "." in marker_table else \
            self.table.with_name(marker_table)
        if not epoch_column:
            raise ConfigError("postgres sink: option epochColumn must name a column (the "
                              f"default is {DEFAULT_EPOCH_COLUMN!r})")
        self.epoch_column = epoch_column
        self.epochs = TableName.parse(epochs_table) if "." in epochs_table else \
            self.table.with_name(epochs_table)
        self.view = (TableName.parse(view_name) if view_name and "." in view_name else
                     self.table.with_name(view_name or self.table.name + VIEW_SUFFIX))
        for what, name in ((opt.VIEW_NAME, self.view), (opt.EPOCHS_TABLE, self.epochs),
                           (opt.MARKER_TABLE, self.markers)):
            if len(name.name.encode()) > MAX_IDENTIFIER_BYTES:
                raise ConfigError(
                    f"postgres sink: the {what} {name.name!r} is longer than PostgreSQL's "
                    f"{MAX_IDENTIFIER_BYTES}-byte identifier limit and would be truncated; set "
                    f"option {what} to a shorter name")
            if name == self.table:
                raise ConfigError(f"postgres sink: option {what} names the target table "
                                  f"{self.table} itself; choose another name")
        self.write_mode = write_mode
        self.key_columns = tuple(key_columns)
        self.retry_seconds = retry_seconds
        self.lock_timeout_ms = lock_timeout_ms
        #: seconds to wait for the answer to a commit-path statement (0: no bound)
        self.commit_timeout = commit_timeout_ms / 1000
        self._log_dir: Path | str = (log_dir if str(log_dir).startswith(("s3://", "s3a://"))
                                     else Path(log_dir))
        #: the driver side's connection, kept across its steps and epochs
        self._commit_conn = KeptConnection(dsn, self.commit_timeout)

    def __repr__(self) -> str:  # never show the DSN's password
        return f"PostgresTwoPhaseSink(dsn={redact_dsn(self.dsn)!r}, table={self.table})"

    @property
    def log_directory(self) -> Path | str:
        return self._log_dir

    # -- setup (driver, at start) ------------------------------------------------------
    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        """Check ``max_prepared_transactions``; create or validate the table (with the epoch
        column), the marker table, the epochs table and the committed view. Raises
        ConfigError with the fix when something does not fit."""
        if self.epoch_column in schema.names:
            raise ConfigError(f"postgres sink: the stream already has a column named "
                              f"{self.epoch_column!r}, where the sink records each row's "
                              "epoch; choose another name with option epochColumn")
        with pg_connect(self.dsn, application="exactly-setup") as conn:
            check_prepared_capacity(conn, partitions)
            missing = self._missing_epoch_column(conn)
            try:
                ensure_pg_table(conn, self.table, schema, sink="postgres",
                                extra=[] if missing else [(self.epoch_column, "bigint")],
                                primary_key=self.key_columns if self.write_mode == "upsert"
                                else ())
            except ConfigError as exc:
                if missing:
                    raise ConfigError(f"{exc} Also: {missing}") from None
                raise
            if missing:
                raise ConfigError(f"postgres sink: {missing}")
            ensure_marker_table(conn, self.markers)
            ensure_epochs_table(conn, self.epochs)
            ensure_committed_view(conn, self.view, self.table, self.epochs, self.epoch_column)

    def _missing_epoch_column(self, conn) -> str | None:
        """Why an existing table without the epoch column is refused, with the statement
        that adds it (None when the column is there or the table is new).

        The sink does not alter a table it did not create: an added column changes the shape
        every other writer and reader of the table sees (``INSERT ... VALUES`` without a
        column list, ``SELECT *``), needs the table's owner and an ACCESS EXCLUSIVE lock --
        a decision for the table's owner, made with one statement."""
        from psycopg import sql

        columns = pg_columns(conn, self.table)
        if columns is None or any(c.name == self.epoch_column for c in columns):
            return None
        alter = sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint").format(
            self.table.sql(), sql.Identifier(self.epoch_column)).as_string(conn)
        return (
            f"table {self.table} has no column {self.epoch_column!r}, where the sink records "
            f"each row's epoch for the epoch-consistent view {self.view}. Add it (nullable; "
            f"rows already there have no epoch and stay visible in the view): {alter}; or "
            "name an existing bigint column with option epochColumn; or write to a new "
            "table, which the sink creates with the column."
        )

    # -- executor side -----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> PgTxn:
        conn = pg_connect(self.dsn, application="exactly-write",
                          lock_timeout_ms=self.lock_timeout_ms)
        return PgTxn(task, make_gid(task), conn)

    def write(self, txn: PgTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.append_column(self.epoch_column,
                                    pa.repeat(pa.scalar(txn.task.epoch, pa.int64()),
                                              batch.num_rows))
        if self.write_mode == "upsert":
            txn.pending.append(batch)  # one statement per task: a key's last row wins
            txn.rows += batch.num_rows
            return
        try:
            if txn.copy is None:
                txn.copy = CopyStream(txn.conn.cursor(), self.table, batch.schema.names)
            txn.copy.write(batch)
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"COPY into {self.table}") from None
        txn.rows += batch.num_rows

    def pre_commit(self, txn: PgTxn) -> PreparedPayload:
        from psycopg import sql

        if txn.copy is not None:
            try:
                txn.copy.finish()  # where the server reports a row it refuses
            except Exception as exc:
                _close(txn.conn)
                raise clean_error(exc, self.dsn, f"COPY into {self.table}") from None
        try:
            with txn.conn.cursor() as cur:
                self._check_owner(cur, txn.task.query_id)
                if txn.pending:
                    table = dedup_last(pa.Table.from_batches(txn.pending), self.key_columns)
                    upsert_rows(cur, upsert_statement(self.table, table.schema,
                                                      self.key_columns, self.epoch_column),
                                table)
                    txn.pending.clear()
                cur.execute(sql.SQL(
                    "INSERT INTO {} (gid, query_id, epoch, partition, rows) "
                    "VALUES (%s, %s, %s, %s, %s)").format(self.markers.sql()),
                    (txn.gid, txn.task.query_id, txn.task.epoch, txn.task.partition, txn.rows))
                with answer_deadline(txn.conn, self.commit_timeout,
                                     what=f"PREPARE TRANSACTION {txn.gid!r}"):
                    cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(
                        sql.Literal(txn.gid)))
        except ConfigError:
            raise
        except Exception as exc:
            text = str(exc)
            if "prepared transactions" in text and ("maximum" in text or "disabled" in text):
                raise ConfigError(
                    f"postgres sink: PREPARE TRANSACTION failed: {text.splitlines()[0]}. Raise "
                    "max_prepared_transactions on the server (to at least twice the write "
                    "tasks per epoch) and restart it."
                ) from None
            raise clean_error(exc, self.dsn, f"preparing the transaction of {txn.gid}") from None
        finally:
            _close(txn.conn)
        return PreparedPayload(txn.rows, txn.gid)

    def _check_owner(self, cur, query_id: str) -> None:
        """Refuse (before PREPARE) to write rows of a query other than the table's own."""
        from psycopg import sql

        cur.execute(sql.SQL("SELECT query_id, epoch FROM {} WHERE relid = {}::regclass").format(
            self.epochs.sql(), sql.Literal(self.table.sql().as_string(cur))))
        row = cur.fetchone()
        if row is None or row[0] == query_id:
            return
        forget = sql.SQL("UPDATE {} SET {} = NULL; DELETE FROM {} WHERE relid = {}::regclass"
                         ).format(self.table.sql(), sql.Identifier(self.epoch_column),
                                  self.epochs.sql(),
                                  sql.Literal(self.table.sql().as_string(cur))).as_string(cur)
        raise ConfigError(
            f"postgres sink: table {self.table} belongs to query {row[0]} (last complete "
            f"epoch {row[1]} in {self.epochs}), and this is query {query_id}, a new checkpoint "
            f"whose epochs restart at 0: the view {self.view} could not tell the two queries' "
            "epochs apart, so nothing was written. Write to a new table, or resume the old "
            "checkpoint; or, if the old query is gone for good, release the table (its rows "
            f"stay visible in the view as rows without an epoch): {forget}"
        )

    def abort_transaction(self, txn: PgTxn) -> None:
        _close(txn.conn)  # closing an open transaction rolls it back

    # -- driver side -------------------------------------------------------------------
    @contextlib.contextmanager
    def _driver_connection(self, what: str) -> Iterator[Any]:
        """The driver side's autocommit connection (kept across steps and epochs,
        :class:`KeptConnection`: a failure closes it and the retry reconnects), whose
        statements wait at most ``commitTimeoutMs`` for their answers
        (:func:`answer_deadline`): every driver-side step is small and idempotent, so a lost
        answer becomes a retry that reads the target's record."""
        with self._commit_conn.use(what=what) as conn:
            yield conn

    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """``COMMIT PREPARED``; when the gid is not prepared (any more) the marker row that
        committed with the data decides: already committed, or lost (DataLossError).

        The ambiguous commit -- the server committed, the answer was lost (the connection
        broke, or no answer within ``commitTimeoutMs``) -- is a transient failure: the retry
        finds the gid gone and the marker there, ALREADY_COMMITTED. Without retries left the
        error is raised and the epoch's intent is finished by the next run's recovery."""
        gid = handle.payload.gid

        def step() -> CommitOutcome:
            import psycopg
            from psycopg import sql

            with self._driver_connection(f"COMMIT PREPARED {gid!r}") as conn:
                try:
                    conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                    return CommitOutcome.COMMITTED
                except psycopg.errors.UndefinedObject:
                    pass  # not prepared (any more): committed before, or lost
                row = conn.execute(sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(
                    self.markers.sql()), (gid,)).fetchone()
            if row is not None:
                return CommitOutcome.ALREADY_COMMITTED
            raise DataLossError(
                f"epoch {handle.epoch} partition {handle.partition}: prepared transaction "
                f"{gid!r} named by the commit intent is neither prepared nor committed in "
                f"{self.table}'s database; someone rolled it back (ROLLBACK PREPARED) or the "
                "database was restored from an older backup"
            )

        return retrying(step, seconds=self.retry_seconds, dsn=self.dsn,
                        what=f"COMMIT PREPARED {gid}")

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """After every ``COMMIT PREPARED`` of the epoch: record it complete in the epochs
        table, which makes its rows visible in the committed view all at once. Idempotent
        (the recorded epoch only grows), so recovery of a commit intent records it too.
        Then forget markers of old epochs: only an unfinished intent ever needs them (the
        epochs table keeps one row per table and is never pruned)."""
        query_id = handles[0].query_id if handles else None
        if query_id is None:
            return  # no task wrote anything: no row to show
        from psycopg import sql

        def record() -> int:
            with self._driver_connection(f"recording epoch {epoch} complete") as conn:
                return conn.execute(sql.SQL(
                    "INSERT INTO {e} AS e (relid, query_id, epoch) VALUES ({t}::regclass, %s, %s) "
                    "ON CONFLICT (relid) DO UPDATE SET epoch = greatest(e.epoch, excluded.epoch), "
                    "committed_at = now() WHERE e.query_id = excluded.query_id").format(
                    e=self.epochs.sql(), t=sql.Literal(self.table.sql().as_string(conn))),
                    (query_id, epoch)).rowcount

        if retrying(record, seconds=self.retry_seconds, dsn=self.dsn,
                    what=f"recording epoch {epoch} complete in {self.epochs}") == 0:
            log_event(logger, "epochs_table_owned_by_another_query", logging.WARNING,
                      table=str(self.table), epochs_table=str(self.epochs), query_id=query_id,
                      epoch=epoch)
        if epoch < MARKER_RETAIN_EPOCHS or epoch % 10:
            return

        def prune() -> None:
            with self._driver_connection("pruning markers") as conn:
                conn.execute(sql.SQL("DELETE FROM {} WHERE query_id = %s AND epoch < %s").format(
                    self.markers.sql()), (query_id, epoch - MARKER_RETAIN_EPOCHS))

        retrying(prune, seconds=self.retry_seconds, dsn=self.dsn, what="pruning markers")

    def abort(self, handle: Handle) -> None:
        gid = handle.payload.gid

        def step() -> None:
            import psycopg
            from psycopg import sql

            with self._driver_connection(f"ROLLBACK PREPARED {gid!r}") as conn, \
                    contextlib.suppress(psycopg.errors.UndefinedObject):  # already gone
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))

        retrying(step, seconds=self.retry_seconds, dsn=self.dsn,
                 what=f"ROLLBACK PREPARED {gid}")

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        prefix = f"{GID_TAG}:{query_id}:"

        def step() -> list[str]:
            with self._driver_connection("listing prepared transactions") as conn:
                rows = conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                    "AND left(gid, %s) = %s ORDER BY gid", (len(prefix), prefix)).fetchall()
            return [r[0] for r in rows]

        found = []
        for gid in retrying(step, seconds=self.retry_seconds, dsn=self.dsn,
                            what="listing prepared transactions"):
            task = parse_gid(gid)
            if task is not None:
                found.append(Handle(task, PreparedPayload(0, gid)))
        return found


    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return f"table {self.table}"

    def _regclass(self, conn):
        from psycopg import sql

        return sql.SQL("{}::regclass").format(sql.Literal(self.table.sql().as_string(conn)))

    def target_state(self, query_id: str) -> TargetState:
        """The owner, its lineage and its last complete epoch, from the epochs table; a
        fresh target when the table, the epochs table or the table's row is missing."""
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-restore", autocommit=True) as conn:
            if not (pg_relation_exists(conn, self.table)
                    and pg_relation_exists(conn, self.epochs)):
                return TargetState(self.describe_target())
            lineage = (sql.Identifier(LINEAGE_COLUMN) if has_lineage_column(conn, self.epochs)
                       else sql.SQL("NULL"))
            row = conn.execute(sql.SQL("SELECT query_id, epoch, {} FROM {} WHERE relid = {}")
                               .format(lineage, self.epochs.sql(), self._regclass(conn))
                               ).fetchone()
        if row is None:
            return TargetState(self.describe_target())
        where = f"{self.epochs} (the row of {self.table}, column {LINEAGE_COLUMN})"
        return TargetState(self.describe_target(), str(row[0]),
                           lineage_from_json(row[2], where), int(row[1]))

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        if self.write_mode == "upsert":
            return RollbackSupport(
                retract="in upsert mode the sink overwrote rows in place, so the values "
                        "those epochs replaced cannot be restored",
                keep="rows those epochs wrote keep their values until the restored job "
                     "writes their keys again at an epoch as new (the epoch guard never moves "
                     "a value back): for the same input the table converges to the restored "
                     "job's values once its epochs pass the target's newest")
        return RollbackSupport(
            retract=None,
            keep="their rows stay and the restored job writes those epochs again: the "
                 "table then holds them twice")

    def retract_after(self, state: TargetState, epoch: int) -> dict[str, Any]:
        """Append mode: abort the line's prepared transactions, then, in one transaction,
        delete the rows whose epoch column is > ``epoch`` and record ``epoch`` as the last
        complete one (the committed view shows the same rows as the table again)."""
        from psycopg import sql

        reason = self.rollback_support(state, epoch).retract
        if reason is not None:
            raise SavepointError(f"--sink-rollback retract: {reason}")
        aborted = self.abort_pre_commits(state.members)
        with pg_connect(self.dsn, application="exactly-restore") as conn:
            deleted = conn.execute(sql.SQL("DELETE FROM {} WHERE {} > %s").format(
                self.table.sql(), sql.Identifier(self.epoch_column)), (epoch,)).rowcount
            conn.execute(sql.SQL("UPDATE {} SET epoch = %s WHERE relid = {}").format(
                self.epochs.sql(), self._regclass(conn)), (epoch,))
            conn.commit()
        return {"aborted_pre_commits": aborted, "retracted_rows": deleted}

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Abort the prepared transactions the superseded queries left (they would hold row
        locks for good), then move the table's row in the epochs table to ``to_query`` with
        its lineage (adding the ``lineage`` column to an epochs table made before it). The
        recorded epoch goes back to the savepoint's when the table is ahead of it (``keep``):
        the view shows the restored query's epochs from there on only once each is
        complete, as it shows every epoch; the kept rows of later epochs show again as the
        restored query completes their numbers. A fork into a table without a row records
        one at the savepoint's epoch; into a table that does not exist yet, nothing (the
        job creates it; a later restore then finds that query's output without lineage)."""
        from psycopg import sql

        aborted = self.abort_pre_commits(state.superseded(lineage))
        with pg_connect(self.dsn, application="exactly-restore") as conn:
            if not pg_relation_exists(conn, self.table):
                return {"aborted_pre_commits": aborted,
                        "lineage_recorded": "no: the table does not exist yet"}
            ensure_epochs_table(conn, self.epochs)
            add_lineage_column(conn, self.epochs)
            conn.execute(sql.SQL(
                "INSERT INTO {e} AS e (relid, query_id, epoch, {l}) VALUES ({t}, %s, %s, %s) "
                "ON CONFLICT (relid) DO UPDATE SET query_id = excluded.query_id, "
                "{l} = excluded.{l}, epoch = least(e.epoch, excluded.epoch)").format(
                e=self.epochs.sql(), l=sql.Identifier(LINEAGE_COLUMN), t=self._regclass(conn)),
                (to_query, lineage[0].epoch, json.dumps(lineage_to_json(lineage))))
            conn.commit()
        return {"aborted_pre_commits": aborted}


def has_lineage_column(conn, epochs: TableName) -> bool:
    row = conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND "
                       "attname = %s AND NOT attisdropped",
                       (epochs.sql().as_string(conn), LINEAGE_COLUMN)).fetchone()
    return row is not None


def add_lineage_column(conn, epochs: TableName) -> None:
    """Give an epochs table made before lineages its ``lineage`` column (no lock taken when
    it is there)."""
    from psycopg import sql

    if not has_lineage_column(conn, epochs):
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
            epochs.sql(), sql.Identifier(LINEAGE_COLUMN)))


def ensure_marker_table(conn, markers: TableName) -> None:
    create_pg_table(conn, markers,
                  "gid text PRIMARY KEY, query_id text NOT NULL, epoch bigint NOT NULL, "
                  "partition integer NOT NULL, rows bigint NOT NULL, "
                  "prepared_at timestamptz NOT NULL DEFAULT now()")


def ensure_epochs_table(conn, epochs: TableName) -> None:
    """One row per target table: the last epoch whose every COMMIT PREPARED has run.

    Keyed by the table's OID (``regclass``): a table dropped and created again under the same
    name starts without a record, and the row shows the table's name when read. Column
    ``lineage`` holds the owner's lineage (an epochs table made before it lacks it until a
    restore hands the table over: :func:`add_lineage_column`).
    """
    create_pg_table(conn, epochs,
                  "relid regclass PRIMARY KEY, query_id text NOT NULL, epoch bigint NOT NULL, "
                  "committed_at timestamptz NOT NULL DEFAULT now(), lineage text")


def committed_view_sql(conn, view: TableName, table: TableName, epochs: TableName,
                       epoch_column: str):
    from psycopg import sql

    return sql.SQL(
        "CREATE OR REPLACE VIEW {view} AS SELECT t.* FROM {table} AS t WHERE t.{col} IS NULL "
        "OR t.{col} <= (SELECT e.epoch FROM {epochs} AS e WHERE e.relid = {name}::regclass)"
    ).format(view=view.sql(), table=table.sql(), col=sql.Identifier(epoch_column),
             epochs=epochs.sql(), name=sql.Literal(table.sql().as_string(conn)))


def ensure_committed_view(conn, view: TableName, table: TableName, epochs: TableName,
                          epoch_column: str) -> None:
    """Create (or redefine) the view showing only rows of completely committed epochs."""
    import psycopg

    with conn.cursor() as cur:
        cur.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)",
                    (view.sql().as_string(conn),))
        row = cur.fetchone()
        if row is not None and row[0] != "v":
            raise ConfigError(
                f"postgres sink: {view} exists and is not a view; the sink creates its "
                f"epoch-consistent view of {table} under that name. Set option viewName to a "
                "free name, or rename the existing relation.")
        if view.schema:
            cur.execute(psycopg.sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                psycopg.sql.Identifier(view.schema)))
        try:
            cur.execute(committed_view_sql(conn, view, table, epochs, epoch_column))
        except psycopg.errors.InvalidTableDefinition as exc:  # its columns changed
            conn.rollback()
            raise ConfigError(
                f"postgres sink: cannot redefine the view {view} over {table}: "
                f"{str(exc).splitlines()[0]}. Drop the view (DROP VIEW "
                f"{view.sql().as_string(conn)}); the sink creates it again at start."
            ) from None
    conn.commit()


def prepared_count(conn, query_id: str | None = None) -> int:
    """Prepared transactions left in the server (of ``query_id``'s sink when given)."""
    if query_id is None:
        return int(conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0])
    prefix = f"{GID_TAG}:{query_id}:"
    return int(conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE left(gid, %s) = %s",
                            (len(prefix), prefix)).fetchone()[0])


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # a dead connection: the server rolls the transaction back itself
        log_event(logger, "close_failed", logging.DEBUG)

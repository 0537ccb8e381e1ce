"""Idempotent upsert sink: rows upserted by key, guarded by the epoch that wrote them.

Guarantee: the table converges to exactly-once results for keyed data -- after recovery each
key holds the value of the newest epoch that wrote it, as a crash-free run would leave it --
and a visible value never moves back to an older epoch's value (the "jump back" the seeds
warn about for idempotent sinks). Values become visible when a task finishes, before the
epoch's checkpoint completes (no transaction spans the epoch), so a reader may see part of an
epoch; a replay rewrites the same values.

Each task upserts its rows in one transaction, each Arrow batch COPYed into a temporary
table and then moved in one statement::

    INSERT INTO t (k, v, exactly_epoch) SELECT ... FROM stage ON CONFLICT (k) DO UPDATE
        SET v = excluded.v, exactly_epoch = excluded.exactly_epoch
        WHERE t.exactly_epoch <= excluded.exactly_epoch

so a replay of epoch n rewrites what epoch n wrote (same values) and a stale write from an
older epoch (a restored older checkpoint, a straggling task) changes nothing. Keys must be
unique within an epoch's output -- true for a streaming aggregation in update mode; for raw
events the last row of a key in a task wins.

It runs under the generic committer like every sink (same fault points, same fencing), with
nothing to commit or abort on the driver side. Fencing therefore stops a second live
instance's commit (FencedError, no intent, no completion) but not its tasks' upserts, which
are visible when they finish: the epoch guard refuses its writes of an older epoch to keys a
newer epoch wrote, and a replay of the same epoch rewrites the same values when the pipeline
is deterministic. The 2PC sink's ``writeMode=upsert`` holds a fenced instance's writes back.

Target state (restores, :mod:`exactly.protocol.target_state`): the table records no owner and
no lineage -- the epoch guard compares epochs, whoever wrote them -- so every row counts as
output of the line being restored, and the newest epoch in the epoch column is its progress.
A rollback cannot ``retract`` (upserts overwrote rows in place); ``keep`` converges: rows
written by epochs after the savepoint keep their values until the restored job writes their
keys again at an epoch at least as new (:meth:`IdempotentUpsertSink.rollback_support`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from exactly import options as opt
from exactly.connectors.postgres.upsert_sql import copy_upsert, dedup_last
from exactly.connectors.sql import (
    TableName,
    answer_deadline,
    clean_error,
    ensure_pg_table,
    pg_connect,
    pg_relation_exists,
    redact_dsn,
)
from exactly.errors import ConfigError
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

DEFAULT_EPOCH_COLUMN = opt.DEFAULT_EPOCH_COLUMN


@dataclass
class UpsertTxn:
    task: TaskInfo
    conn: Any
    rows: int = 0


class IdempotentUpsertSink(TwoPhaseCommitSink[UpsertTxn]):
    """Upserts keyed rows into PostgreSQL; a replay never moves a value backwards."""

    name = "upsert"
    recover_before_first_epoch = True

    def __init__(self, dsn: str, table: str, key_columns: Sequence[str], log_dir: str | Path,
                 *, epoch_column: str = DEFAULT_EPOCH_COLUMN,
                 lock_timeout_ms: int = 60_000,
                 commit_timeout_ms: int = opt.DEFAULT_COMMIT_TIMEOUT_MS) -> None:
        if not dsn:
            raise ConfigError("upsert sink: set option dsn")
        if not table:
            raise ConfigError("upsert sink: set option table")
        if not key_columns:
            raise ConfigError("upsert sink: set option keyColumns (comma-separated key column "
                              "names; the table's primary key)")
        self.dsn = dsn
        self.table = TableName.parse(table)
        self.key_columns = tuple(key_columns)
        self.epoch_column = epoch_column
        self.lock_timeout_ms = lock_timeout_ms
        #: seconds a task waits for the answer to its COMMIT (0: no bound)
        self.commit_timeout = commit_timeout_ms / 1000
        self._log_dir: Path | str = (log_dir if str(log_dir).startswith(("s3://", "s3a://"))
                                     else Path(log_dir))

    def __repr__(self) -> str:
        return f"IdempotentUpsertSink(dsn={redact_dsn(self.dsn)!r}, table={self.table})"

    @property
    def log_directory(self) -> Path | str:
        return self._log_dir

    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        """Create the table (columns + the epoch column, primary key on the keys) or check
        that an existing one has them."""
        if self.epoch_column in schema.names:
            raise ConfigError(f"upsert sink: the stream already has a column named "
                              f"{self.epoch_column!r}; choose another with option epochColumn")
        missing = [k for k in self.key_columns if k not in schema.names]
        if missing:
            raise ConfigError(f"upsert sink: key column(s) {missing} are not in the stream's "
                              f"columns {schema.names}")
        with pg_connect(self.dsn, application="exactly-setup") as conn:
            ensure_pg_table(conn, self.table, schema, sink="upsert",
                            extra=[(self.epoch_column, "bigint NOT NULL")],
                            primary_key=self.key_columns)

    # -- executor side -----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> UpsertTxn:
        return UpsertTxn(task, pg_connect(self.dsn, application="exactly-write",
                                          lock_timeout_ms=self.lock_timeout_ms))

    def write(self, txn: UpsertTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        table = dedup_last(pa.Table.from_batches([batch]), self.key_columns)
        table = table.append_column(self.epoch_column,
                                    pa.array([txn.task.epoch] * table.num_rows, pa.int64()))
        try:
            with txn.conn.cursor() as cur:
                copy_upsert(cur, self.table, table, self.key_columns, self.epoch_column)
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"upserting into {self.table}") from None
        txn.rows += batch.num_rows

    def pre_commit(self, txn: UpsertTxn) -> Payload:
        """Commit the task's upserts: idempotent writes need no second phase.

        The answer is awaited at most ``commitTimeoutMs``; a lost answer fails the task
        (whether the upserts committed is unknown) and Spark's retry writes the same values
        again, which the epoch guard makes harmless."""
        try:
            with answer_deadline(txn.conn, self.commit_timeout,
                                 what=f"COMMIT of task {txn.task.partition}'s upserts"):
                txn.conn.commit()
        except Exception as exc:
            raise clean_error(exc, self.dsn, f"committing upserts into {self.table}") from None
        finally:
            txn.conn.close()
        return Payload(txn.rows)

    def abort_transaction(self, txn: UpsertTxn) -> None:
        with contextlib.suppress(Exception):  # the server rolls back a dead session itself
            txn.conn.close()

    def commit_visible(self, handle: Handle) -> None:
        """Nothing to do: the rows became visible in ``pre_commit``."""

    # -- driver side -------------------------------------------------------------------
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        return CommitOutcome.ALREADY_COMMITTED  # visible since the task finished

    def abort(self, handle: Handle) -> None:
        """Upserts cannot be taken back; a replay rewrites the same values."""

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        return []

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return f"table {self.table}"

    def target_state(self, query_id: str) -> TargetState:
        """No owner; progress = the newest epoch in the epoch column (None: an empty or
        missing table)."""
        from psycopg import sql

        with pg_connect(self.dsn, application="exactly-restore", autocommit=True) as conn:
            if not pg_relation_exists(conn, self.table):
                return TargetState(self.describe_target())
            row = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(
                sql.Identifier(self.epoch_column), self.table.sql())).fetchone()
        newest = row[0] if row else None
        return TargetState(self.describe_target(), None, (),
                           None if newest is None else int(newest))

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        return RollbackSupport(
            retract="upserts overwrote rows in place, so the values those epochs replaced "
                    "cannot be restored",
            keep="rows those epochs wrote keep their values until the restored job writes "
                 "their keys again at an epoch as new (the epoch guard never moves a value "
                 "back): for the same input the table converges to the restored job's values "
                 "once its epochs pass the target's newest")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        return {"sink": "nothing to take over (the table records no owner; its epoch guard "
                        "orders every writer's rows)"}

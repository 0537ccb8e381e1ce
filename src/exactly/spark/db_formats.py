"""Spark data sources of the database sinks and the PostgreSQL table source.

``exactly.postgres``  write: two-phase-commit sink (PREPARE TRANSACTION / COMMIT PREPARED);
                      read: replayable table source (see :mod:`exactly.connectors.postgres.source`)
``exactly.wal``       write: write-ahead sink into PostgreSQL or SQLite
``exactly.upsert``    write: idempotent upsert sink (epoch-guarded)

Connection options (all three): ``dsn`` (libpq string or ``postgresql://`` URL), or
``dsnEnv`` (name of an environment variable of the driver holding it; keeps the secret out of
query plans), and optionally ``password`` (Spark redacts options so named). The DSN is read
when the query starts, in the driver; executors get it with the sink. ``table`` (``name`` or
``schema.name``; quote parts with ``"``).

``exactly.postgres`` sink: ``writeMode`` (append | upsert), ``keyColumns`` (for upsert),
``markerTable``, ``partitions`` (write tasks per epoch, for the start-up capacity check of
``max_prepared_transactions``), ``lockTimeoutMs``, ``retrySeconds``; for epoch-consistent
reads ``epochColumn`` (default ``exactly_epoch``), ``epochsTable`` (default
``exactly_2pc_epochs``) and ``viewName`` (default ``<table>_committed``).
``exactly.wal`` sink: ``dsn`` for PostgreSQL, ``sqlite:PATH`` or ``path`` for SQLite;
``markerTable``. ``exactly.upsert`` sink: ``keyColumns`` (required), ``epochColumn``.
Every sink: ``mode``, ``exactly.logDir`` (set by ``exactly.spark.runner.start_query``), the fault
options of :mod:`exactly.protocol.faults`.
"""

from __future__ import annotations

import os

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from exactly.config import Mode
from exactly.errors import ConfigError
from exactly.protocol.contract import SinkSettings, TwoPhaseCommitSink
from exactly.protocol.faults import FaultSpec, fault_from
from exactly.spark.writer import TwoPhaseStreamWriter

#: (sink repr, schema) already prepared in this process (streamWriter runs twice per epoch)
_PREPARED: set[tuple[str, str]] = set()


def resolve_dsn(options: dict[str, str], *, required: bool = True, what: str = "sink") -> str:
    """The connection string from ``dsn`` / ``dsnEnv`` (+ ``password``)."""
    dsn = options.get("dsn")
    env = options.get("dsnEnv")
    if not dsn and env:
        dsn = os.environ.get(env)
        if not dsn:
            raise ConfigError(f"{what}: option dsnEnv names environment variable {env!r}, "
                              "which is not set in the driver")
    if not dsn:
        if required:
            raise ConfigError(f"{what}: set option dsn (or dsnEnv, the name of an environment "
                              "variable holding the connection string)")
        return ""
    password = options.get("password")
    if password and not dsn.startswith("sqlite:"):
        from psycopg.conninfo import make_conninfo

        dsn = make_conninfo(dsn, password=password)
    return dsn


def _key_columns(options: dict[str, str]) -> tuple[str, ...]:
    return tuple(k.strip() for k in options.get("keyColumns", "").split(",") if k.strip())


class DatabaseStreamWriter(TwoPhaseStreamWriter):
    """The generic writer, plus target preparation and early recovery at query start."""

    def __init__(self, sink: TwoPhaseCommitSink, settings: SinkSettings,
                 fault: FaultSpec | None, schema: StructType,
                 partitions: int | None = None) -> None:
        super().__init__(sink, settings, fault)
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow: pa.Schema = to_arrow_schema(schema, timezone="UTC")
        key = (repr(sink), str(arrow))
        if key not in _PREPARED:
            sink.prepare_target(arrow, partitions)  # type: ignore[attr-defined]
            _PREPARED.add(key)
        if settings.mode is Mode.EXACTLY_ONCE:
            from exactly.protocol.recovery import recover_on_new_driver

            recover_on_new_driver(sink, settings, fault)


class PostgresDataSource(DataSource):
    """``format("exactly.postgres")``: 2PC sink and replayable table source."""

    @classmethod
    def name(cls) -> str:
        return "exactly.postgres"

    def schema(self) -> StructType:
        from exactly.connectors.postgres.source import table_schema

        return table_schema(resolve_dsn(self.options, what="exactly.postgres source"),
                            self.options)

    def streamReader(self, schema: StructType):
        from exactly.connectors.postgres.source import PostgresTableStreamReader

        return PostgresTableStreamReader(
            resolve_dsn(self.options, what="exactly.postgres source"), self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        from exactly.connectors.postgres.two_phase import (
            DEFAULT_EPOCH_COLUMN,
            DEFAULT_EPOCHS_TABLE,
            PostgresTwoPhaseSink,
        )

        options = self.options
        settings = SinkSettings.from_options(options)
        sink = PostgresTwoPhaseSink(
            resolve_dsn(options, what="exactly.postgres sink"), options.get("table", ""),
            settings.require_log_dir("exactly.postgres"),
            write_mode=options.get("writeMode", "append"), key_columns=_key_columns(options),
            marker_table=options.get("markerTable", "exactly_2pc_markers"),
            retry_seconds=float(options.get("retrySeconds", 60)),
            lock_timeout_ms=int(options.get("lockTimeoutMs", 60_000)),
            epoch_column=options.get("epochColumn", DEFAULT_EPOCH_COLUMN),
            epochs_table=options.get("epochsTable", DEFAULT_EPOCHS_TABLE),
            view_name=options.get("viewName") or None)
        partitions = int(options["partitions"]) if options.get("partitions") else None
        return DatabaseStreamWriter(sink, settings, fault_from(options), schema, partitions)


class WalDataSource(DataSource):
    """``format("exactly.wal")``: write-ahead sink into PostgreSQL or SQLite."""

    @classmethod
    def name(cls) -> str:
        return "exactly.wal"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        from exactly.connectors.wal import WriteAheadSink, target_from_options

        options = self.options
        settings = SinkSettings.from_options(options)
        target = target_from_options(options, resolve_dsn(options, required=False))
        sink = WriteAheadSink(target, settings.require_log_dir("exactly.wal"))
        return DatabaseStreamWriter(sink, settings, fault_from(options), schema)


class UpsertDataSource(DataSource):
    """``format("exactly.upsert")``: idempotent, epoch-guarded upserts into PostgreSQL."""

    @classmethod
    def name(cls) -> str:
        return "exactly.upsert"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        from exactly.connectors.postgres.upsert import DEFAULT_EPOCH_COLUMN, IdempotentUpsertSink

        options = self.options
        settings = SinkSettings.from_options(options)
        sink = IdempotentUpsertSink(
            resolve_dsn(options, what="exactly.upsert sink"), options.get("table", ""),
            _key_columns(options), settings.require_log_dir("exactly.upsert"),
            epoch_column=options.get("epochColumn", DEFAULT_EPOCH_COLUMN),
            lock_timeout_ms=int(options.get("lockTimeoutMs", 60_000)))
        return DatabaseStreamWriter(sink, settings, fault_from(options), schema)


DB_DATA_SOURCES = (PostgresDataSource, WalDataSource, UpsertDataSource)

"""Every Spark data source of exactly, registered in one place by :func:`register`.

``exactly.files``     read: replayable directory source; write: two-phase-commit file sink
``exactly.datagen``   read: deterministic generator
``exactly.postgres``  write: two-phase-commit sink (PREPARE TRANSACTION / COMMIT PREPARED);
                      read: replayable table source (:mod:`exactly.connectors.postgres.source`)
``exactly.wal``       write: write-ahead sink into PostgreSQL or SQLite
``exactly.upsert``    write: idempotent upsert sink (epoch-guarded)
``exactly.kafka``     write: transactional Kafka sink (:mod:`exactly.connectors.kafka.sink`)

A data source only turns options into a sink or reader of :mod:`exactly.connectors` and
hands sinks to :class:`~exactly.spark.writer.TwoPhaseStreamWriter`.

Database options:

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
from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from exactly import options as opt
from exactly.config import Mode
from exactly.connectors.files.sink import FileSink
from exactly.connectors.kafka.options import (
    KafkaSinkOptions,
    broker_transaction_max_timeout_ms,
    check_schema,
    check_transaction_timeout,
)
from exactly.connectors.kafka.sink import KafkaSink  # also registers kafka.in_transaction
from exactly.errors import ConfigError
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import fault_from
from exactly.spark.writer import TwoPhaseStreamWriter


class FilesDataSource(DataSource):
    """``format("exactly.files")``: replayable file source and exactly-once file sink.

    Sink options: ``path``, ``format`` (parquet | json), ``compression`` (Parquet codec),
    ``mode`` (exactly_once | at_least_once), ``exactly.fault`` (fault injection).
    Source options: see :mod:`exactly.connectors.files.source`.
    """

    @classmethod
    def name(cls) -> str:
        return "exactly.files"

    def schema(self) -> StructType | str:
        if (self.options.get(opt.FORMAT, opt.DEFAULT_FORMAT).lower() == "parquet"
                and self.options.get(opt.PATH)):
            from exactly.connectors.files.source import infer_parquet_schema

            return infer_parquet_schema(self.options[opt.PATH])
        raise ConfigError("exactly.files source: give the schema of the rows with "
                          "spark.readStream.format('exactly.files').schema('id long, ...')")

    def streamReader(self, schema: StructType):
        from exactly.connectors.files.source import FilesStreamReader

        return FilesStreamReader(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        options = self.options
        sink = FileSink(options.get(opt.PATH, ""), options.get(opt.FORMAT, opt.DEFAULT_FORMAT),
                        options.get(opt.COMPRESSION, opt.DEFAULT_COMPRESSION))
        return TwoPhaseStreamWriter(sink, SinkSettings.from_options(options),
                                    fault_from(options))


class DatagenDataSource(DataSource):
    """``format("exactly.datagen")``: deterministic, replayable rows with a unique ``id``."""

    @classmethod
    def name(cls) -> str:
        return "exactly.datagen"

    def schema(self) -> str:
        from exactly.connectors.datagen import SCHEMA

        return SCHEMA

    def streamReader(self, schema: StructType):
        from exactly.connectors.datagen import DatagenStreamReader

        return DatagenStreamReader(self.options)



def resolve_dsn(options: Mapping[str, str], *, required: bool = True, what: str = "sink") -> str:
    """The connection string from ``dsn`` / ``dsnEnv`` (+ ``password``)."""
    dsn = options.get(opt.DSN)
    env = options.get(opt.DSN_ENV)
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
    password = options.get(opt.PASSWORD)
    if password and not dsn.startswith("sqlite:"):
        from psycopg.conninfo import make_conninfo

        dsn = make_conninfo(dsn, password=password)
    return dsn


def _key_columns(options: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(k.strip() for k in options.get(opt.KEY_COLUMNS, "").split(",") if k.strip())


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
            PostgresTwoPhaseSink,
        )

        options = self.options
        settings = SinkSettings.from_options(options)
        sink = PostgresTwoPhaseSink(
            resolve_dsn(options, what="exactly.postgres sink"), options.get(opt.TABLE, ""),
            settings.require_log_dir("exactly.postgres"),
            write_mode=options.get(opt.WRITE_MODE, opt.DEFAULT_WRITE_MODE),
            key_columns=_key_columns(options),
            marker_table=options.get(opt.MARKER_TABLE, opt.DEFAULT_2PC_MARKER_TABLE),
            retry_seconds=float(options.get(opt.RETRY_SECONDS, opt.DEFAULT_RETRY_SECONDS)),
            lock_timeout_ms=int(options.get(opt.LOCK_TIMEOUT_MS, opt.DEFAULT_LOCK_TIMEOUT_MS)),
            epoch_column=options.get(opt.EPOCH_COLUMN, opt.DEFAULT_EPOCH_COLUMN),
            epochs_table=options.get(opt.EPOCHS_TABLE, opt.DEFAULT_EPOCHS_TABLE),
            view_name=options.get(opt.VIEW_NAME) or None)
        partitions = int(options[opt.PARTITIONS]) if options.get(opt.PARTITIONS) else None
        return TwoPhaseStreamWriter(sink, settings, fault_from(options), schema, partitions)


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
        return TwoPhaseStreamWriter(sink, settings, fault_from(options), schema)


class UpsertDataSource(DataSource):
    """``format("exactly.upsert")``: idempotent, epoch-guarded upserts into PostgreSQL."""

    @classmethod
    def name(cls) -> str:
        return "exactly.upsert"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        from exactly.connectors.postgres.upsert import IdempotentUpsertSink

        options = self.options
        settings = SinkSettings.from_options(options)
        sink = IdempotentUpsertSink(
            resolve_dsn(options, what="exactly.upsert sink"), options.get(opt.TABLE, ""),
            _key_columns(options), settings.require_log_dir("exactly.upsert"),
            epoch_column=options.get(opt.EPOCH_COLUMN, opt.DEFAULT_EPOCH_COLUMN),
            lock_timeout_ms=int(options.get(opt.LOCK_TIMEOUT_MS, opt.DEFAULT_LOCK_TIMEOUT_MS)))
        return TwoPhaseStreamWriter(sink, settings, fault_from(options), schema)


class KafkaDataSource(DataSource):
    """``format("exactly.kafka")``: the transactional Kafka sink (options: module docstring).

    At start (exactly_once) it checks ``kafka.transaction.timeout.ms`` against the broker's
    ``transaction.max.timeout.ms`` and the checkpoint interval, and fails the query with the
    fix when it is wrong. Read Kafka with :func:`exactly.connectors.kafka.source.read_kafka`.
    """

    @classmethod
    def name(cls) -> str:
        return "exactly.kafka"

    def schema(self) -> str:
        raise ConfigError("exactly.kafka is a sink; read Kafka with Spark's built-in source, "
                          "e.g. exactly.connectors.kafka.source.read_kafka(spark, ...)")

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        settings = SinkSettings.from_options(self.options)
        options = KafkaSinkOptions.from_options(self.options, settings.mode)
        check_schema(schema, options.topic)
        if settings.mode is Mode.EXACTLY_ONCE:
            check_transaction_timeout(options.transaction_timeout_ms,
                                      broker_transaction_max_timeout_ms(options.client_conf()),
                                      options.checkpoint_interval_ms)
        return TwoPhaseStreamWriter(KafkaSink(options, settings), settings,
                                    fault_from(self.options))


DATA_SOURCES = (FilesDataSource, DatagenDataSource, PostgresDataSource, WalDataSource,
                UpsertDataSource, KafkaDataSource)


def register(spark: SparkSession) -> None:
    """Make every ``format("exactly.*")`` of :data:`DATA_SOURCES` available in ``spark``."""
    for source in DATA_SOURCES:
        spark.dataSource.register(source)

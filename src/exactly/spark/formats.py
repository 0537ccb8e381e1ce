"""Every Spark data source of exactly, registered in one place by :func:`register`.

``exactly.files``     read: replayable directory source; write: two-phase-commit file sink
``exactly.datagen``   read: deterministic generator
``exactly.postgres``  write: two-phase-commit sink (PREPARE TRANSACTION / COMMIT PREPARED);
                      read: replayable table source (:mod:`exactly.connectors.postgres.source`)
``exactly.wal``       write: write-ahead sink into PostgreSQL or SQLite
``exactly.upsert``    write: idempotent upsert sink (epoch-guarded)
``exactly.kafka``     write: transactional Kafka sink (:mod:`exactly.connectors.kafka.sink`);
                      read: replayable reader honouring exactly's admission control
                      (:mod:`exactly.connectors.kafka.reader`)
``exactly.delta``     write: Delta Lake sink, one Delta commit per epoch, on local disk or
                      object storage (:mod:`exactly.connectors.delta.sink`)
``exactly.iceberg``   write: Iceberg sink, one snapshot per epoch, SQL or REST catalog, files
                      on local disk or object storage (:mod:`exactly.connectors.iceberg.sink`)

A data source only turns options into a sink or reader of :mod:`exactly.connectors` and
hands sinks to :class:`~exactly.spark.writer.TwoPhaseStreamWriter`. Sinks are built in one
place, :func:`sink_for`, which ``streamWriter``, ``start_query``'s :func:`check_sink` (before
Spark starts) and its ``foreachBatch`` path (output mode update) share. Every format reads
only the option names declared in :mod:`exactly.options` (``SOURCE_OPTIONS`` /
``SINK_OPTIONS``); any other name is refused with the closest known one.

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
Every sink: ``mode``, ``exactly.logDir`` (set by ``exactly.ops.query.start_query``), the fault
options of :mod:`exactly.protocol.faults`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource
from pyspark.sql.types import StructType

from exactly import options as opt
from exactly.config import Mode
from exactly.connectors.files.sink import FileSink
from exactly.connectors.kafka.broker import (
    BROKER_CHECK_SECONDS,
    START_CHECK_SECONDS,
    broker_transaction_max_timeout_ms,
)
from exactly.connectors.kafka.options import (
    KafkaSinkOptions,
    check_schema,
    check_transaction_timeout,
)
from exactly.connectors.kafka.sink import KafkaSink  # also registers kafka.in_transaction
from exactly.errors import ConfigError
from exactly.protocol.contract import SinkSettings, TwoPhaseCommitSink
from exactly.protocol.faults import FaultSpec, fault_from
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
        return stream_writer(self.name(), self.options, schema)


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
        return stream_writer(self.name(), self.options, schema)


class WalDataSource(DataSource):
    """``format("exactly.wal")``: write-ahead sink into PostgreSQL or SQLite."""

    @classmethod
    def name(cls) -> str:
        return "exactly.wal"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        return stream_writer(self.name(), self.options, schema)


class UpsertDataSource(DataSource):
    """``format("exactly.upsert")``: idempotent, epoch-guarded upserts into PostgreSQL."""

    @classmethod
    def name(cls) -> str:
        return "exactly.upsert"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        return stream_writer(self.name(), self.options, schema)


class KafkaDataSource(DataSource):
    """``format("exactly.kafka")``: the transactional Kafka sink (options: module docstring)
    and a replayable Kafka reader that honours exactly's admission control
    (:mod:`exactly.connectors.kafka.reader`).

    At start (exactly_once) the sink checks ``kafka.transaction.timeout.ms`` against the
    broker's ``transaction.max.timeout.ms`` and the checkpoint interval, and fails the query
    with the fix when it is wrong.
    """

    @classmethod
    def name(cls) -> str:
        return "exactly.kafka"

    def schema(self) -> str:
        from exactly.connectors.kafka.reader import SCHEMA

        return SCHEMA

    def streamReader(self, schema: StructType):
        from exactly.connectors.kafka.reader import KafkaStreamReader, check_read_schema

        check_read_schema(schema)
        return KafkaStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        return stream_writer(self.name(), self.options, schema)


class DeltaDataSource(DataSource):
    """``format("exactly.delta")``: exactly-once appends to a Delta Lake table (options:
    :mod:`exactly.connectors.delta.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "exactly.delta"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        return stream_writer(self.name(), self.options, schema)


class IcebergDataSource(DataSource):
    """``format("exactly.iceberg")``: exactly-once appends to an Iceberg table (options:
    :mod:`exactly.connectors.iceberg.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "exactly.iceberg"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        return stream_writer(self.name(), self.options, schema)


DATA_SOURCES = (FilesDataSource, DatagenDataSource, PostgresDataSource, WalDataSource,
                UpsertDataSource, KafkaDataSource, DeltaDataSource, IcebergDataSource)


def register(spark: SparkSession) -> None:
    """Make every ``format("exactly.*")`` of :data:`DATA_SOURCES` available in ``spark``, and
    release a query's sink leases when its run ends (:mod:`exactly.spark.run_end`)."""
    from exactly.spark.run_end import watch_run_ends

    for source in DATA_SOURCES:
        spark.dataSource.register(source)
    watch_run_ends(spark)


# -- building sinks: one factory for streamWriter, foreachBatch and the start-time checks ----
@dataclass(frozen=True)
class BuiltSink:
    """A sink built from ``writeStream`` options, with what a writer around it needs."""

    sink: TwoPhaseCommitSink
    settings: SinkSettings
    fault: FaultSpec | None
    #: write tasks per epoch (option ``partitions``), for ``prepare_target``'s checks
    partitions: int | None = None


SinkBuilder = Callable[[Mapping[str, str], SinkSettings, StructType | None], TwoPhaseCommitSink]


def _files_sink(options: Mapping[str, str], settings: SinkSettings,
                schema: StructType | None) -> TwoPhaseCommitSink:
    return FileSink(options.get(opt.PATH, ""), options.get(opt.FORMAT, opt.DEFAULT_FORMAT),
                    options.get(opt.COMPRESSION, opt.DEFAULT_COMPRESSION))


def _postgres_sink(options: Mapping[str, str], settings: SinkSettings,
                   schema: StructType | None) -> TwoPhaseCommitSink:
    from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink

    return PostgresTwoPhaseSink(
        resolve_dsn(options, what="exactly.postgres sink"), options.get(opt.TABLE, ""),
        settings.require_log_location("exactly.postgres"),
        write_mode=options.get(opt.WRITE_MODE, opt.DEFAULT_WRITE_MODE),
        key_columns=_key_columns(options),
        marker_table=options.get(opt.MARKER_TABLE, opt.DEFAULT_2PC_MARKER_TABLE),
        retry_seconds=float(options.get(opt.RETRY_SECONDS, opt.DEFAULT_RETRY_SECONDS)),
        lock_timeout_ms=int(options.get(opt.LOCK_TIMEOUT_MS, opt.DEFAULT_LOCK_TIMEOUT_MS)),
        epoch_column=options.get(opt.EPOCH_COLUMN, opt.DEFAULT_EPOCH_COLUMN),
        epochs_table=options.get(opt.EPOCHS_TABLE, opt.DEFAULT_EPOCHS_TABLE),
        view_name=options.get(opt.VIEW_NAME) or None,
        commit_timeout_ms=int(options.get(opt.COMMIT_TIMEOUT_MS, opt.DEFAULT_COMMIT_TIMEOUT_MS)))


def _wal_sink(options: Mapping[str, str], settings: SinkSettings,
              schema: StructType | None) -> TwoPhaseCommitSink:
    from exactly.connectors.wal import WriteAheadSink, target_from_options

    target = target_from_options(options, resolve_dsn(options, required=False))
    return WriteAheadSink(target, settings.require_log_location("exactly.wal"))


def _upsert_sink(options: Mapping[str, str], settings: SinkSettings,
                 schema: StructType | None) -> TwoPhaseCommitSink:
    from exactly.connectors.postgres.upsert import IdempotentUpsertSink

    return IdempotentUpsertSink(
        resolve_dsn(options, what="exactly.upsert sink"), options.get(opt.TABLE, ""),
        _key_columns(options), settings.require_log_location("exactly.upsert"),
        epoch_column=options.get(opt.EPOCH_COLUMN, opt.DEFAULT_EPOCH_COLUMN),
        lock_timeout_ms=int(options.get(opt.LOCK_TIMEOUT_MS, opt.DEFAULT_LOCK_TIMEOUT_MS)),
        commit_timeout_ms=int(options.get(opt.COMMIT_TIMEOUT_MS, opt.DEFAULT_COMMIT_TIMEOUT_MS)))


def _kafka_sink(options: Mapping[str, str], settings: SinkSettings,
                schema: StructType | None) -> TwoPhaseCommitSink:
    kafka = KafkaSinkOptions.from_options(options, settings.mode)
    if schema is not None:
        check_schema(schema, kafka.topic)
    return KafkaSink(kafka, settings)


def _delta_sink(options: Mapping[str, str], settings: SinkSettings,
                schema: StructType | None) -> TwoPhaseCommitSink:
    from exactly.connectors.delta.sink import DeltaSink

    prefix = opt.STORAGE_PREFIX
    storage = {key[len(prefix):]: value for key, value in options.items()
               if key.lower().startswith(prefix)}
    return DeltaSink(options.get(opt.PATH, ""),
                     settings.require_log_location("exactly.delta"),
                     storage_options=storage,
                     compression=options.get(opt.COMPRESSION, opt.DEFAULT_COMPRESSION))


def _iceberg_sink(options: Mapping[str, str], settings: SinkSettings,
                  schema: StructType | None) -> TwoPhaseCommitSink:
    from exactly.connectors.iceberg.catalog import CatalogSpec
    from exactly.connectors.iceberg.sink import IcebergSink

    prefix = opt.CATALOG_PREFIX
    catalog = {key[len(prefix):]: value for key, value in options.items()
               if key.lower().startswith(prefix)}
    return IcebergSink(options.get(opt.TABLE) or options.get(opt.PATH, ""),
                       settings.require_log_location("exactly.iceberg"),
                       catalog=CatalogSpec.from_options(catalog, options.get(opt.WAREHOUSE)),
                       partition_by=options.get(opt.PARTITION_BY, ""),
                       compression=options.get(opt.COMPRESSION) or None)


#: format -> how its sink is built from options (no connection to the target)
SINK_BUILDERS: dict[str, SinkBuilder] = {
    "exactly.files": _files_sink,
    "exactly.postgres": _postgres_sink,
    "exactly.wal": _wal_sink,
    "exactly.upsert": _upsert_sink,
    "exactly.kafka": _kafka_sink,
    "exactly.delta": _delta_sink,
    "exactly.iceberg": _iceberg_sink,
}

#: sinks that change a key's row in place, as output mode ``update`` needs; for
#: ``exactly.postgres`` only with ``writeMode=upsert``. ``exactly.kafka`` writes each update
#: as a new record (a changelog), as Spark's own Kafka sink does.
UPDATE_SINKS = ("exactly.postgres", "exactly.upsert", "exactly.kafka")


def sink_for(sink_format: str, options: Mapping[str, str],
             schema: StructType | None = None) -> BuiltSink:
    """Build the sink of ``format(sink_format)`` from its ``writeStream`` options.

    Names compare case-insensitively, as in Spark. Connects to nothing: the checks that
    need the target are :func:`check_target`'s. Raises ConfigError, naming the fix, for an
    unknown option name, a missing or invalid option, or a format that is not an exactly sink.
    """
    fmt = sink_format.lower()
    builder = SINK_BUILDERS.get(fmt)
    if builder is None:
        raise ConfigError(f"{sink_format!r} is not an exactly sink; use one of "
                          f"{', '.join(SINK_BUILDERS)}")
    opt.check_option_names(fmt, options, "sink")
    opts = CaseInsensitiveDict(options)
    settings = SinkSettings.from_options(opts)
    sink = builder(opts, settings, schema)
    raw = opts.get(opt.PARTITIONS)
    try:
        partitions = int(raw) if raw else None
    except ValueError:
        raise ConfigError(f"{fmt} sink: option {opt.PARTITIONS}={raw!r} is not a whole "
                          "number (write tasks per epoch)") from None
    return BuiltSink(sink, settings, fault_from(opts), partitions)


def check_target(built: BuiltSink, seconds: float = BROKER_CHECK_SECONDS) -> None:
    """The sink checks that need its target: for ``exactly.kafka`` in exactly_once mode,
    ``kafka.transaction.timeout.ms`` against the broker's ``transaction.max.timeout.ms``
    and the checkpoint interval. Raises ConfigError naming the fix, or KafkaSinkError when
    the broker stays unreachable for ``seconds``."""
    if isinstance(built.sink, KafkaSink) and built.settings.mode is Mode.EXACTLY_ONCE:
        kafka = built.sink.options
        broker_max = broker_transaction_max_timeout_ms(kafka.connection_conf(), seconds)
        check_transaction_timeout(kafka.transaction_timeout_ms, broker_max,
                                  kafka.checkpoint_interval_ms)


def stream_writer(sink_format: str, options: Mapping[str, str],
                  schema: StructType) -> TwoPhaseStreamWriter:
    """What every exactly DataSource's ``streamWriter`` returns."""
    built = sink_for(sink_format, options, schema)
    check_target(built)
    return TwoPhaseStreamWriter(built.sink, built.settings, built.fault, schema,
                                built.partitions)


def check_sink(sink_format: str, path: str | None, options: Mapping[str, str] | None,
               schema: StructType | None = None) -> BuiltSink | None:
    """Before a query starts: build the sink of ``sink_format`` exactly as its writer will
    (``path`` is the ``start(path)`` argument) and run :func:`check_target`, so a wrong
    setting fails now, in one line, instead of after the first epoch. Returns the sink;
    ``None`` for formats that are not exactly sinks."""
    if sink_format.lower() not in SINK_BUILDERS:
        return None
    from pyspark.sql.utils import to_str  # the strings writeStream.options() passes on

    merged = {key: str(to_str(value)) for key, value in (options or {}).items()
              if value is not None}
    if path:
        merged[opt.PATH] = path
    built = sink_for(sink_format, merged, schema)
    check_target(built, START_CHECK_SECONDS)
    return built


def check_output_mode(sink_format: str, output_mode: str,
                      options: Mapping[str, str] | None) -> None:
    """Refuse output mode ``update`` into a sink that cannot change a row in place."""
    fmt = sink_format.lower()
    if output_mode.lower() != "update" or fmt not in SINK_BUILDERS:
        return
    opts = CaseInsensitiveDict(options or {})
    if fmt == "exactly.postgres" and opts.get(opt.WRITE_MODE, opt.DEFAULT_WRITE_MODE) != "upsert":
        raise ConfigError(
            f"exactly.postgres sink: output_mode='update' rewrites a key's row, but "
            f"{opt.WRITE_MODE}={opts.get(opt.WRITE_MODE, opt.DEFAULT_WRITE_MODE)} appends a "
            f"row per update; set options {opt.WRITE_MODE}=upsert and {opt.KEY_COLUMNS}=KEYS")
    if fmt not in UPDATE_SINKS:
        what = ("files are append-only" if fmt == "exactly.files"
                else "it appends every update as a new row")
        raise ConfigError(
            f"{fmt} sink: output_mode='update' needs a sink that updates a key's row in "
            f"place, and {what}; write aggregates to exactly.postgres "
            f"({opt.WRITE_MODE}=upsert, {opt.KEY_COLUMNS}=KEYS) or exactly.upsert, or use "
            "output_mode='append' (with a watermark) or 'complete'")


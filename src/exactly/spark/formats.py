"""The Spark-facing data sources of exactly, registered by :func:`register`.

``exactly.files``    read: replayable directory source; write: two-phase-commit file sink
``exactly.datagen``  read: deterministic generator
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from exactly.connectors.files.sink import FileSink
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
        if self.options.get("format", "parquet").lower() == "parquet" and self.options.get("path"):
            from exactly.connectors.files.source import infer_parquet_schema

            return infer_parquet_schema(self.options["path"])
        raise ConfigError("exactly.files source: give the schema of the rows with "
                          "spark.readStream.format('exactly.files').schema('id long, ...')")

    def streamReader(self, schema: StructType):
        from exactly.connectors.files.source import FilesStreamReader

        return FilesStreamReader(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        options = self.options
        sink = FileSink(options.get("path", ""), options.get("format", "parquet"),
                        options.get("compression", "snappy"))
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


from exactly.connectors.kafka.sink import KafkaDataSource  # noqa: E402  (exactly.kafka sink)
from exactly.spark.db_formats import DB_DATA_SOURCES  # noqa: E402  (PostgreSQL / SQLite sinks)

DATA_SOURCES = (FilesDataSource, DatagenDataSource, *DB_DATA_SOURCES, KafkaDataSource)


def register(spark: SparkSession) -> None:
    """Make ``format("exactly.files")`` and ``format("exactly.datagen")`` available."""
    for source in DATA_SOURCES:
        spark.dataSource.register(source)

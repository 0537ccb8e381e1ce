"""The demo pipeline: a directory of JSON-lines events -> a transformation -> an exactly sink:
the 2PC file sink (``sink="files"``), the Delta Lake sink (``sink="delta"``, the output a
table path or ``s3://`` URI) or the Iceberg sink (``sink="iceberg"``, the output an
``iceberg:CATALOG?table=NS.NAME`` address: :data:`exactly.connectors.iceberg.catalog.ADDRESS_FORM`);
S3 settings from the ``AWS_*`` environment variables.

Every input event becomes exactly one output row with the same ``id``. It runs in
``availableNow`` mode: it drains what the input directory holds, in epochs of
``max_files_per_epoch`` files, then stops. Progress is printed as one JSON object a line.

``writer``: ``start_query`` (the sink commits in the driver, through ``foreachBatch``) or
``datasource`` (PySpark's own ``writeStream.format(...).start()``: the sink's data source
writer, committed in Spark's commit process). ``fault`` arms a crash point (``exactly
pipeline --fault``), passed to the sink as its ``exactly.fault`` options.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.ops.query import start_query, with_sink_log_dir
from exactly.protocol.faults import FaultSpec
from exactly.testing.chaos import report_progress

EVENT_SCHEMA = "id long not null, key string, amount double, event_time timestamp"


@dataclass(frozen=True)
class PipelineSpec:
    input_dir: str
    output_dir: str
    checkpoint_dir: str
    mode: str = "exactly_once"
    output_format: str = "parquet"
    max_files_per_epoch: int = 2
    dead_letter_dir: str | None = None
    sink: str = "files"  #: files | delta | iceberg
    writer: str = "start_query"  #: start_query | datasource
    fault: FaultSpec | None = None


def build(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """Read the events and derive a few columns; the ``id`` passes through unchanged.

    (No ``upper``/``lower``: the first of them in a JVM builds Spark's Unicode title-case
    table, ~1.6 CPU-s on every driver start: docs/performance.md.)"""
    reader = (spark.readStream.format("exactly.files").schema(EVENT_SCHEMA)
              .option("format", "json")
              .option("maxFilesPerTrigger", spec.max_files_per_epoch))
    if spec.dead_letter_dir:
        reader = reader.option("deadLetterPath", spec.dead_letter_dir)
    events = reader.load(spec.input_dir)
    return events.select(
        "id",
        "key",
        F.concat("key", F.lit(":"), F.col("id").cast("string")).alias("key_id"),
        F.round(F.col("amount") * 100).cast("long").alias("amount_cents"),
        "event_time",
    )


def run(spark: SparkSession, spec: PipelineSpec, out=sys.stdout) -> None:
    """Drain the input into the sink, printing progress; raises if the query fails."""
    config = CheckpointConfig(mode=spec.mode, storage=spec.checkpoint_dir)
    options = {opt.FORMAT: spec.output_format} if spec.sink == "files" else {}
    path: str | None = spec.output_dir
    if spec.sink == "iceberg":  # the output is a table in a catalog, not a path
        from exactly.connectors.iceberg.catalog import IcebergAddress

        options.update(IcebergAddress.parse(spec.output_dir).sink_options())
        path = None
    if spec.fault is not None:
        options.update(spec.fault.options())
    sink_format = f"exactly.{spec.sink}"
    if spec.writer == "datasource":  # PySpark's own form: Spark runs the sink's commit
        for key, value in config.spark_conf().items():
            spark.conf.set(key, value)
        query = (build(spark, spec).writeStream.format(sink_format)
                 .option(opt.CHECKPOINT_LOCATION, spec.checkpoint_dir)
                 .option(opt.MODE, spec.mode)
                 .options(**with_sink_log_dir(spec.checkpoint_dir, options))
                 .trigger(availableNow=True).start(path))
    else:
        query = start_query(build(spark, spec), sink_format=sink_format,
                            path=path, options=options, checkpoint=config,
                            available_now=True).query
    report_progress(query, out)

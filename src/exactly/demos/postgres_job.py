"""A PostgreSQL pipeline run as its own process, for crash tests, the demo and the benchmark.

``python -m exactly.demos.postgres_job --sink 2pc --table events --checkpoint DIR ...``

The connection string comes from the environment variable ``EXACTLY_PG_DSN`` (never from the
command line, where ``ps`` would show its password). Pipelines:

``append``     every input row becomes one output row with the same ``id`` (audit by id)
``aggregate``  per-key running ``count``/``sum`` (Spark streaming aggregation, update mode)
``keyed``      the same per-key running totals kept by ``transformWithStateInPandas``
               (ValueState, RocksDB state store), update mode

Sinks: ``2pc`` (exactly.postgres), ``wal`` (exactly.wal, PostgreSQL or ``--sqlite PATH``),
``upsert`` (exactly.upsert). ``append`` goes through ``start_query`` (``--writer
start_query``: the sink's format, committed in the driver) or PySpark's own
``writeStream.format(...).start()`` (``--writer datasource``: the sink's data source writer,
committed in Spark's commit process); ``aggregate`` and ``keyed`` need update mode and build
:class:`TwoPhaseForeachBatch` themselves (``--writer foreachbatch`` forces that path for
``append`` too). Sources: ``datagen`` (deterministic generator) or ``table``
(``exactly.postgres`` table source on ``--source-table``). The job drains its input
(``availableNow``) and prints one JSON object per committed epoch.
Fault injection: ``--fault POINT[@EPOCH]`` (``--fault-marker``, ``--fault-action``), as for
``exactly run``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exactly import options as opt
from exactly.checkpoint.layout import SINK_LOG_DIR
from exactly.demos.fault_flags import add_fault_flags, fault_of
from exactly.testing.chaos import report_progress

DSN_ENV = "EXACTLY_PG_DSN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exactly.demos.postgres_job")
    p.add_argument("--sink", choices=["2pc", "wal", "upsert"], default="2pc")
    p.add_argument("--pipeline", choices=["append", "aggregate", "keyed"], default="append")
    p.add_argument("--writer", choices=["start_query", "datasource", "foreachbatch"],
                   default=None)
    p.add_argument("--source", choices=["datagen", "table"], default="datagen")
    p.add_argument("--source-table", default="exactly_source")
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True,
                   help="a directory, or s3a://bucket/prefix (AWS_* environment variables)")
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--rows-per-epoch", type=int, default=2_500)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--keys", type=int, default=50)
    p.add_argument("--mode", choices=["exactly_once", "at_least_once"], default="exactly_once")
    p.add_argument("--sqlite", default=None, help="wal sink: load into this SQLite file")
    p.add_argument("--master", default=None,
                   help="default: local[2] (EXACTLY_SPARK_MASTER), none on a Spark Connect "
                        "server (SPARK_REMOTE): the server has its own")
    add_fault_flags(p)
    return p.parse_args(argv)


def source_frame(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    if args.source == "table":
        df = (spark.readStream.format("exactly.postgres").option(opt.DSN_ENV, DSN_ENV)
              .option("table", args.source_table).option("keyColumn", "id")
              .option("maxRowsPerTrigger", args.rows_per_epoch)
              .option("numPartitions", args.partitions).load())
    else:
        df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", args.rows).option("maxRowsPerTrigger", args.rows_per_epoch)
              .option("numPartitions", args.partitions).option("keys", args.keys).load())
    return df.select("id", "key", F.round(F.col("amount") * 100).cast("long")
                     .alias("amount_cents"), "event_time")


def aggregate_frame(df, args: argparse.Namespace):
    from pyspark.sql import functions as F

    if args.pipeline == "aggregate":
        return df.groupBy("key").agg(F.count(F.lit(1)).alias("events"),
                                     F.sum("amount_cents").alias("total_cents"))
    return keyed_state_frame(df)


def keyed_state_frame(df):
    """Running per-key totals kept in ValueState by ``transformWithStateInPandas``."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    state_schema = StructType([StructField("events", LongType()),
                               StructField("total_cents", LongType())])

    class RunningTotals(StatefulProcessor):
        def init(self, handle) -> None:
            self.totals = handle.getValueState("totals", state_schema)

        def handleInputRows(self, key, rows, timerValues):
            events, total = self.totals.get() if self.totals.exists() else (0, 0)
            for chunk in rows:
                events += len(chunk)
                total += int(chunk["amount_cents"].sum())
            self.totals.update((events, total))
            yield pd.DataFrame({"key": [key[0]], "events": [events], "total_cents": [total]})

        def close(self) -> None:
            pass

    out = StructType([StructField("key", StringType()), StructField("events", LongType()),
                      StructField("total_cents", LongType())])
    return df.groupBy("key").transformWithStateInPandas(
        RunningTotals(), outputStructType=out, outputMode="Update", timeMode="None")


def build_sink(args: argparse.Namespace, log_dir: Path, dsn: str, keys: tuple[str, ...]):
    """The sink object for the foreachBatch path."""
    from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink
    from exactly.connectors.postgres.upsert import IdempotentUpsertSink
    from exactly.connectors.wal import PostgresWalTarget, SqliteWalTarget, WriteAheadSink

    if args.sink == "2pc":
        return PostgresTwoPhaseSink(dsn, args.table, log_dir,
                                    write_mode="upsert" if keys else "append", key_columns=keys)
    if args.sink == "wal":
        target = (SqliteWalTarget(args.sqlite, args.table) if args.sqlite
                  else PostgresWalTarget(dsn, args.table))
        return WriteAheadSink(target, log_dir)
    return IdempotentUpsertSink(dsn, args.table, keys or ("id",), log_dir)


def start(spark, args: argparse.Namespace):
    """Start the query; returns the StreamingQuery."""
    import os

    from exactly.config import CheckpointConfig, Mode
    from exactly.ops.query import start_query, with_sink_log_dir
    from exactly.protocol.contract import SinkSettings
    from exactly.spark.foreach_batch import TwoPhaseForeachBatch

    stateful = args.pipeline != "append"
    backend = "rocksdb" if args.pipeline == "keyed" else "hashmap"
    config = CheckpointConfig(mode=args.mode, storage=args.checkpoint, state_backend=backend)
    df = source_frame(spark, args)
    if stateful:
        df = aggregate_frame(df, args)
    if stateful and args.sink == "wal":
        raise SystemExit("the wal sink appends rows; use --sink 2pc or upsert for aggregates")
    if stateful and args.writer == "datasource":
        raise SystemExit("Python data source sinks refuse update mode: aggregates need "
                         "--writer foreachbatch (the default for them)")
    keys = ("key",) if stateful else (("id",) if args.sink == "upsert" else ())
    fault = fault_of(args)
    writer = args.writer or ("foreachbatch" if stateful else "start_query")
    if writer != "foreachbatch":
        fmt = {"2pc": "exactly.postgres", "wal": "exactly.wal", "upsert": "exactly.upsert"}
        options = {"table": args.table}
        if args.sink == "2pc":  # write tasks per epoch: the prepared-transaction capacity check
            options[opt.PARTITIONS] = str(args.partitions)
        if args.sink == "wal" and args.sqlite:
            options["path"] = args.sqlite
        else:
            options[opt.DSN_ENV] = DSN_ENV
        if keys:
            options["keyColumns"] = ",".join(keys)
        if fault is not None:
            options.update(fault.options())
        if writer == "start_query":
            return start_query(df, sink_format=fmt[args.sink], checkpoint=config,
                               options=options, available_now=True).query
        for key, value in config.spark_conf().items():  # PySpark's own form
            spark.conf.set(key, value)
        return (df.writeStream.format(fmt[args.sink]).outputMode("append")
                .option(opt.CHECKPOINT_LOCATION, args.checkpoint).option(opt.MODE, args.mode)
                .options(**with_sink_log_dir(args.checkpoint, options))
                .trigger(availableNow=True).start())
    for key, value in config.spark_conf().items():
        spark.conf.set(key, value)
    log_dir = Path(args.checkpoint) / SINK_LOG_DIR
    sink = build_sink(args, log_dir, os.environ.get(DSN_ENV, ""), keys)
    # the checkpoint names the query where the foreachBatch process cannot see it (Connect)
    settings = SinkSettings(mode=Mode(args.mode), log_dir=str(log_dir),
                            checkpoint_location=args.checkpoint)
    return (df.writeStream.outputMode("update" if stateful else "append")
            .option(opt.CHECKPOINT_LOCATION, args.checkpoint)
            .foreachBatch(TwoPhaseForeachBatch(sink, settings, fault))
            .trigger(availableNow=True).start())


def run(args: argparse.Namespace, out=sys.stdout) -> None:
    from exactly.spark.session import spark_session

    conf = {"spark.sql.shuffle.partitions": str(args.partitions)}
    spark = spark_session(master=args.master, app_name="exactly-postgres-job", conf=conf,
                          s3a=args.checkpoint.startswith("s3a://"))
    try:
        report_progress(start(spark, args), out)
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    from exactly.logs import configure

    configure()
    args = parse_args(argv)
    try:
        run(args)
    except Exception as exc:
        from exactly.connectors.sql import redact_dsn

        print(f"postgres job failed: {redact_dsn(exc)}", file=sys.stderr)
        sys.exit(3)


def command(*args: str) -> list[str]:
    """The command line that runs this job with this interpreter."""
    return [sys.executable, "-m", "exactly.demos.postgres_job", *args]


if __name__ == "__main__":
    main()

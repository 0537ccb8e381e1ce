"""A two-input pipeline run as its own driver process, for the multi-input crash tests.

``python tests/chaos/multi_input_job.py --variant union|join --input DIR --table NAME
--output DIR --checkpoint DIR``

Inputs (both replayable): a directory of JSON-lines *orders* read by the ``exactly.files``
source (``--files-per-epoch`` files an epoch), and a PostgreSQL table of *payments* read by the
``exactly.postgres`` table source by its increasing key ``id`` (``--rows-per-epoch`` rows an
epoch). The connection string comes from the environment variable ``EXACTLY_PG_DSN``.

``union``  every order and every payment becomes one output row (``id``, ``origin``, ...)
``join``   stream-stream inner join of orders and payments on ``order_id = id``, both sides
           with a watermark and the join bounded in event time: one output row per pair

The output goes to the 2PC file sink (``exactly.files``, Parquet). The job drains what both
inputs hold at start (``availableNow``) and prints one JSON line per finished epoch
(:func:`exactly.testing.chaos.report_progress`). Faults are armed with the flags of every
exactly job (``--fault POINT@EPOCH --fault-marker FILE``). The transformations are plain
functions of two DataFrames, so a test can apply them to batch DataFrames of the same input
for a crash-free reference.
"""

from __future__ import annotations

import argparse
import sys

from exactly.demos.fault_flags import add_fault_flags, fault_of

DSN_ENV = "EXACTLY_PG_DSN"
ORDER_SCHEMA = "id long not null, key string, amount double, event_time timestamp"
PAYMENTS_DDL = ("(id bigint PRIMARY KEY, order_id bigint NOT NULL, key text, "
                "amount double precision, event_time timestamptz NOT NULL)")
WATERMARK = "1 hour"


def union_frame(orders, payments):
    """Every order and every payment, one row each; ``id`` passes through unchanged."""
    from pyspark.sql import functions as F

    def shape(df, origin: str):
        return df.select("id", F.lit(origin).alias("origin"), "key",
                         F.round(F.col("amount") * 100).cast("long").alias("amount_cents"),
                         F.unix_micros("event_time").alias("event_us"))

    return shape(orders, "files").unionByName(shape(payments, "table"))


def join_frame(orders, payments):
    """Each order with its payment (paid within the hour after the order), both watermarked."""
    from pyspark.sql import functions as F

    o = orders.withWatermark("event_time", WATERMARK).alias("o")
    p = (payments.withColumnRenamed("event_time", "paid_at")
         .withColumnRenamed("id", "payment_id").withColumnRenamed("key", "payment_key")
         .withColumnRenamed("amount", "paid").withWatermark("paid_at", WATERMARK).alias("p"))
    cond = ((F.col("o.id") == F.col("p.order_id"))
            & (F.col("p.paid_at") >= F.col("o.event_time"))
            & (F.col("p.paid_at") <= F.col("o.event_time") + F.expr(f"INTERVAL {WATERMARK}")))
    return o.join(p, cond, "inner").select(
        F.col("o.id").alias("id"), "payment_id", "key",
        F.round(F.col("amount") * 100).cast("long").alias("amount_cents"),
        F.round(F.col("paid") * 100).cast("long").alias("paid_cents"),
        F.unix_micros(F.col("o.event_time")).alias("event_us"),
        F.unix_micros("paid_at").alias("paid_us"))


TRANSFORMS = {"union": union_frame, "join": join_frame}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="multi_input_job")
    p.add_argument("--variant", choices=sorted(TRANSFORMS), required=True)
    p.add_argument("--input", required=True, help="directory of JSON-lines orders")
    p.add_argument("--table", required=True, help="PostgreSQL table of payments")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--files-per-epoch", type=int, default=1)
    p.add_argument("--rows-per-epoch", type=int, default=60)
    p.add_argument("--master", default="local[2]")
    add_fault_flags(p)
    return p.parse_args(argv)


def build(spark, args: argparse.Namespace):
    orders = (spark.readStream.format("exactly.files").schema(ORDER_SCHEMA)
              .option("format", "json").option("maxFilesPerTrigger", args.files_per_epoch)
              .load(args.input))
    payments = (spark.readStream.format("exactly.postgres").option("dsnEnv", DSN_ENV)
                .option("table", args.table).option("keyColumn", "id")
                .option("maxRowsPerTrigger", args.rows_per_epoch)
                .option("numPartitions", 2).load())
    return TRANSFORMS[args.variant](orders, payments)


def run(args: argparse.Namespace) -> None:
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query
    from exactly.spark.session import spark_session
    from exactly.testing.chaos import report_progress

    fault = fault_of(args)
    spark = spark_session(master=args.master, app_name=f"exactly-multi-input-{args.variant}")
    try:
        query = start_query(build(spark, args), sink_format="exactly.files", path=args.output,
                            options={"format": "parquet",
                                     **(fault.options() if fault is not None else {})},
                            checkpoint=CheckpointConfig(storage=args.checkpoint),
                            available_now=True)
        report_progress(query.query)
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

        print(f"multi-input job failed: {redact_dsn(exc)}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()

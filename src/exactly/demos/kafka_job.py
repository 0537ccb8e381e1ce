"""The Kafka end-to-end job: Kafka -> stateful transformation -> Kafka, drained then stopped.

Run as ``python -m exactly.demos.kafka_job --bootstrap HOST:PORT --input IN --output OUT
--checkpoint DIR [--sink exactly|spark]``; it is the job that the chaos tests, the Kafka demo
and the benchmark restart under faults (:func:`exactly.testing.chaos.run_with_crashes`).

Input records are JSON ``{"id", "key", "amount"}`` with unique ids. Per ``key`` the job keeps
state (a running count and sum, ``applyInPandasWithState``) and emits one record per input
record: key = ``key``, value = JSON ``{"id", "key", "seq", "total"}`` where ``seq`` is the
record's 1-based position among its key's records (in id order within an epoch). Exactly once
end to end means: every id once in the output, and per key the ``seq`` values are exactly
1..n (state was neither lost nor applied twice).

``--sink exactly``  the ``exactly.kafka`` transactional sink through ``start_query`` (committed
                    in the driver), or with ``--writer datasource`` through PySpark's own
                    ``writeStream.format("exactly.kafka")`` (committed by the sink's data
                    source writer in Spark's commit process).
``--sink spark``    Spark's own Kafka writer, in ``foreachBatch`` so that the same crash
                    points exist: the batch's records are written, then the driver points
                    and ``kafka.in_transaction`` fire, before Spark's commit log (the window
                    in which Spark's Kafka sink duplicates). ``in_write`` kills the Python
                    worker of a ``mapInArrow`` step feeding the writer after its first batch.

Faults are armed with the flags ``--fault POINT@EPOCH`` (and the once-marker
``--fault-marker FILE``), which :func:`exactly.testing.chaos.run_with_crashes` appends per
attempt; ``POINT`` may be the Kafka sink's own ``kafka.in_transaction``.

Progress goes to stdout as one JSON object a line (``{"event": "epoch", ...}``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.connectors.kafka.source import read_kafka
from exactly.demos.fault_flags import add_fault_flags, fault_of
from exactly.ops.query import start_query, with_sink_log_dir
from exactly.protocol.faults import DRIVER_POINTS, FaultPoint, FaultSpec, maybe_crash
from exactly.testing.chaos import report_progress

EVENT_SCHEMA = "id long, key string, amount double"
OUTPUT_SCHEMA = "id long, key string, seq long, total double"
STATE_SCHEMA = "count long, total double"


def running_totals(key: tuple, frames: Iterator[pd.DataFrame],
                   state: GroupState) -> Iterator[pd.DataFrame]:
    """Per key: number each record (seq) and keep a running total, in id order."""
    count, total = state.get if state.exists else (0, 0.0)
    batch = pd.concat(list(frames)).sort_values("id")
    seq = count + pd.RangeIndex(1, len(batch) + 1).to_numpy()
    totals = total + batch["amount"].cumsum().to_numpy()
    state.update((int(seq[-1]), float(totals[-1])))
    yield pd.DataFrame({"id": batch["id"].to_numpy(), "key": key[0], "seq": seq,
                        "total": totals})


def build(spark: SparkSession, bootstrap: str, input_topic: str,
          max_offsets_per_trigger: int) -> DataFrame:
    """The job's DataFrame, ready for a Kafka sink: columns ``key`` and ``value``."""
    source = read_kafka(spark, bootstrap, topics=input_topic,
                        max_offsets_per_trigger=max_offsets_per_trigger)
    events = (source.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
                            .alias("e")).select("e.*"))
    numbered = events.groupBy("key").applyInPandasWithState(
        running_totals, OUTPUT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
    return numbered.select(F.col("key"),
                           F.to_json(F.struct("id", "key", "seq", "total")).alias("value"))


def _crash_in_write(fault: FaultSpec | None, epoch: int):
    def step(batches: Iterator) -> Iterator:
        for i, batch in enumerate(batches):
            yield batch
            if i == 0:
                maybe_crash(fault, FaultPoint.IN_WRITE, epoch)
    return step


def spark_sink_writer(bootstrap: str, output_topic: str, fault: FaultSpec | None):
    """``foreachBatch`` function: Spark's Kafka writer, then the driver crash points."""

    def write(batch: DataFrame, epoch: int) -> None:
        if fault is not None and fault.point == FaultPoint.IN_WRITE:
            batch = batch.mapInArrow(_crash_in_write(fault, epoch), batch.schema)
        (batch.write.format("kafka").option(opt.KAFKA_BOOTSTRAP, bootstrap)
         .option("topic", output_topic).save())
        # all after the write, before Spark's commit log; kafka.in_transaction: same window
        for point in (*DRIVER_POINTS, IN_TRANSACTION):
            maybe_crash(fault, point, epoch)
    return write


def run(args: argparse.Namespace, out=sys.stdout) -> None:
    spark = _session(args.checkpoint)
    try:
        df = build(spark, args.bootstrap, args.input, args.max_offsets_per_trigger)
        config = CheckpointConfig(mode=args.mode, storage=args.checkpoint,
                                  interval=f"{args.interval_ms}ms")
        fault = fault_of(args)
        options = {opt.KAFKA_BOOTSTRAP: args.bootstrap, opt.TOPIC: args.output,
                   opt.TRANSACTIONAL_ID_PREFIX: args.prefix,
                   opt.KAFKA_TRANSACTION_TIMEOUT_MS: str(args.txn_timeout_ms),
                   opt.CHECKPOINT_INTERVAL_MS: str(args.interval_ms),
                   opt.KAFKA_PUBLISH_SHARES: str(args.publish_shares),
                   **(fault.options() if fault is not None else {})}
        if args.sink == "exactly" and args.writer == "start_query":
            query = start_query(df, sink_format="exactly.kafka", checkpoint=config,
                                available_now=not args.continuous, options=options).query
        elif args.sink == "exactly":  # PySpark's own form: Spark runs the sink's commit
            for key, value in config.spark_conf().items():
                spark.conf.set(key, value)
            writer = (df.writeStream.format("exactly.kafka")
                      .option(opt.CHECKPOINT_LOCATION, args.checkpoint)
                      .option(opt.MODE, args.mode)
                      .options(**with_sink_log_dir(args.checkpoint, options)))
            writer = (writer.trigger(processingTime=f"{args.interval_ms} milliseconds")
                      if args.continuous else writer.trigger(availableNow=True))
            query = writer.start()
        else:
            for key, value in config.spark_conf().items():
                spark.conf.set(key, value)
            writer = (df.writeStream
                      .foreachBatch(spark_sink_writer(args.bootstrap, args.output, fault))
                      .option(opt.CHECKPOINT_LOCATION, args.checkpoint))
            writer = (writer.trigger(processingTime=f"{args.interval_ms} milliseconds")
                      if args.continuous else writer.trigger(availableNow=True))
            query = writer.start()
        report_progress(query, out, poll_seconds=0.25)
    finally:
        spark.stop()


def _session(checkpoint: str) -> SparkSession:
    """Spark's Kafka connector loaded into this job's driver; on a Spark Connect server
    (``SPARK_REMOTE``) the server must have been started with it (`exactly packages --kafka`),
    a client cannot add jars to it."""
    from exactly.spark.connect import remote_url
    from exactly.spark.session import spark_session

    return spark_session(app_name="exactly-kafka-job", kafka=remote_url() is None,
                         s3a=checkpoint.startswith("s3a://"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exactly.demos.kafka_job",
                                description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True, help="input topic")
    p.add_argument("--output", required=True, help="output topic")
    p.add_argument("--checkpoint", required=True,
                   help="a directory, or s3a://bucket/prefix (AWS_* environment variables); "
                        "the sink's log and staging go beside it")
    p.add_argument("--sink", choices=("exactly", "spark"), default="exactly")
    p.add_argument("--writer", choices=("start_query", "datasource"), default="start_query",
                   help="--sink exactly: committed in the driver (start_query) or by the "
                        "sink's data source writer in Spark's commit process")
    p.add_argument("--mode", choices=("exactly_once", "at_least_once"), default="exactly_once")
    p.add_argument("--prefix", default="exactly-kafka-job", help="transactional id prefix")
    p.add_argument("--max-offsets-per-trigger", type=int, default=500)
    p.add_argument("--interval-ms", type=int, default=1000)
    p.add_argument("--txn-timeout-ms", type=int, default=60_000)
    p.add_argument("--publish-shares", type=int, default=1,
                   help="exactly.kafka.publishShares: publish each epoch in N shares")
    p.add_argument("--continuous", action="store_true",
                   help="keep running with a processing-time trigger (bench latency)")
    add_fault_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from exactly.logs import configure

    configure()
    try:
        run(parse_args(argv))
    except Exception as exc:  # the query's error; the harness shows stderr
        print(f"kafka job failed: {exc}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()

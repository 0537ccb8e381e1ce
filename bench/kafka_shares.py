"""``exactly.kafka`` publishing in shares on a cluster: records/s and the driver's CPU per
record for ``exactly.kafka.publishShares`` N = 1, 2, 4, beside Spark's own Kafka sink.

The test kit's standalone cluster (a master and ``--workers`` workers of one core each, on
this machine) runs every variant; this process is the driver (``start_query``, whose commit
runs here). Each variant drains the same input: ``exactly.datagen`` (``--records`` rows in
``--epochs`` epochs of ``numPartitions = --partitions`` tasks, ``trigger(availableNow)``),
each row turned into a ~70-byte JSON ``value`` with its ``key``, into a fresh topic of
``--topic-partitions`` partitions on a single broker on 127.0.0.1:

``shares_1``      exactly_once, the whole epoch published by the driver's one producer
``shares_2``      exactly_once, each epoch in 2 shares, one task each on the executors
``shares_4``      exactly_once, 4 shares
``spark_kafka``   Spark's built-in Kafka sink (Java producers in the tasks, at least once)

Every producer gets the same client settings (:data:`harness.KAFKA_CLIENT`; Spark's sink as
``kafka.*`` options). Measured per run: wall seconds from the query's start to its end,
records/s, and the **driver's CPU** -- user + system seconds of this process and every
process below it (its JVM and the Python workers it starts; the executors are the workers'
children, not counted) -- per million records, and of it the CPU of this Python process
alone (where the one producer of N = 1 produces). Reported: per variant the median and range
over the repetitions, and per repetition pair the ratios shares_N / shares_1 of the
driver's CPU per record (goal for N = 2: <= 0.2) and of records/s, and shares_N /
spark_kafka of records/s. Each output topic is read back ``read_committed`` and checked by
id (every input id exactly once). The rules (>= 1 M rows, a warm-up, alternating order, >= 3
repetitions) are :mod:`harness`'s; the load is printed with every run.

    .venv/bin/python bench/kafka_shares.py [--records 1000000] [--epochs 4] [--repeat 3]
        [--workers 2] [--partitions 4] [--topic-partitions 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly import options as opt
from exactly.testing.kafka_broker import broker_or_configured, consume_all, create_topic

VARIANTS = ("shares_1", "shares_2", "shares_4", "spark_kafka")
CLIENT = h.KAFKA_CLIENT


def driver_cpu_s() -> tuple[float, float]:
    """User + system CPU seconds of this process (with what its reaped children used) and
    of every process below it now (its JVM, the Python workers it starts)."""
    me = psutil.Process()
    python = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    below = 0.0
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
            below += times.user + times.system
        except psutil.Error:
            continue
    return python, below


def source(spark: Any, records: int, epochs: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
          .option("totalRows", str(records)).option("numPartitions", str(partitions))
          .option("maxRowsPerTrigger", str(max(1, records // epochs))).load())
    return df.select(F.col("key"), F.to_json(F.struct("id", "key", "amount")).alias("value"))


def run_variant(spark: Any, kind: str, bootstrap: str, records: int, epochs: int,
                partitions: int, topic_partitions: int, workdir: Path) -> dict[str, Any]:
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query

    topic = f"shares-{kind}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, topic_partitions)
    checkpoint = workdir / f"ck-{topic}"
    df = source(spark, records, epochs, partitions)
    client = {f"kafka.{k}": v for k, v in CLIENT.items()}
    cpu_before, started = driver_cpu_s(), time.perf_counter()
    if kind.startswith("shares_"):
        shares = kind.removeprefix("shares_")
        query = start_query(df, sink_format="exactly.kafka", available_now=True,
                            checkpoint=CheckpointConfig(storage=str(checkpoint)),
                            options={opt.KAFKA_BOOTSTRAP: bootstrap, opt.TOPIC: topic,
                                     opt.TRANSACTIONAL_ID_PREFIX: f"bench-{topic}",
                                     opt.CHECKPOINT_INTERVAL_MS: "1000",
                                     opt.KAFKA_PUBLISH_SHARES: shares, **client}).query
    else:
        query = (df.writeStream.option("checkpointLocation", str(checkpoint)).format("kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
                 .options(**client).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    cpu_after = driver_cpu_s()
    python_cpu, jvm_cpu = (a - b for a, b in zip(cpu_after, cpu_before, strict=True))
    cpu = python_cpu + jvm_cpu
    if query.exception() is not None:
        raise RuntimeError(f"{kind}: {query.exception()}")
    ids = [json.loads(v)["id"] for _, _, _, v in consume_all(bootstrap, topic, timeout=60)]
    error = h.check_ids(ids, records, kind)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"seconds": seconds, "records_s": records / seconds,
            "driver_cpu_s_per_m": cpu / records * 1e6,
            "driver_python_s_per_m": python_cpu / records * 1e6, "error": error}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--warmup", type=int, default=100_000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=4, help="read tasks per epoch")
    p.add_argument("--topic-partitions", type=int, default=4)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"a subset of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)

    from exactly.spark.session import spark_session
    from exactly.testing.spark_cluster import StandaloneCluster

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-kafka-shares-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(h.machine())
    note = h.sizes_note(args.records, args.warmup, args.repeat)
    if note:
        print(note)
    print(f"{args.records:,} records in {args.epochs} epochs of {args.partitions} tasks, "
          f"{args.workers} workers of 1 core, topics of {args.topic_partitions} partitions")
    runs: list[h.Run] = []
    with broker_or_configured(workdir / "broker") as bootstrap, \
            StandaloneCluster(workdir / "cluster", workers=args.workers, cores=1,
                              memory="1g") as cluster:
        # the executors import exactly as this process does (a checkout on PYTHONPATH too)
        python_path = {"spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"]} \
            if os.environ.get("PYTHONPATH") else {}
        spark = spark_session(master=cluster.url, app_name="bench-kafka-shares", kafka=True,
                              conf={"spark.executor.memory": "768m",
                                    "spark.executor.cores": "1", **python_path})
        try:
            variants = [v for v in VARIANTS if v in args.variants.split(",")]
            for kind in variants:  # warm-up: every variant once, small, not reported
                run_variant(spark, kind, bootstrap, args.warmup, args.epochs, args.partitions,
                            args.topic_partitions, workdir)
            for rep, kind in h.schedule(variants, args.repeat):
                values = run_variant(spark, kind, bootstrap, args.records, args.epochs,
                                     args.partitions, args.topic_partitions, workdir)
                error = values.pop("error")
                runs.append(h.Run(rep, kind, values, [error] if error else []))
                print(f"rep {rep} {kind:12s} {values['seconds']:7.2f} s "
                      f"{values['records_s'] / 1000:7.0f} k records/s, driver CPU "
                      f"{values['driver_cpu_s_per_m']:6.2f} s per M records (its Python "
                      f"process {values['driver_python_s_per_m']:5.2f}), {h.load()}"
                      f"{'  ERROR ' + error if error else ''}", flush=True)
        finally:
            spark.stop()
    rows = []
    for kind in VARIANTS:
        mine = [r for r in runs if r.variant == kind]
        rows.append([kind, h.spread([r.values["records_s"] / 1000 for r in mine], ".0f"),
                     h.spread([r.values["driver_cpu_s_per_m"] for r in mine]),
                     h.spread([r.values["driver_python_s_per_m"] for r in mine])])
    print(h.table(["variant", "k records/s", "driver CPU s / M records (all)",
                   "of it: the committing Python process"], rows))
    ratios = []
    for n in ("shares_2", "shares_4"):
        ratios.append([f"{n} / shares_1",
                       h.spread(h.paired(runs, "driver_cpu_s_per_m", n, "shares_1")),
                       h.spread(h.paired(runs, "driver_python_s_per_m", n, "shares_1")),
                       h.spread(h.paired(runs, "records_s", n, "shares_1"))])
    for n in ("shares_1", "shares_2", "shares_4"):
        ratios.append([f"{n} / spark_kafka",
                       h.spread(h.paired(runs, "driver_cpu_s_per_m", n, "spark_kafka")), "-",
                       h.spread(h.paired(runs, "records_s", n, "spark_kafka"))])
    print(h.table(["pair (per repetition)", "driver CPU per record (all)",
                   "committing Python process", "records/s"], ratios))
    for key, what in (("driver_cpu_s_per_m", "the whole driver (its JVM too)"),
                      ("driver_python_s_per_m", "the committing Python process")):
        verdict = h.at_most(h.paired(runs, key, "shares_2", "shares_1"), 0.2)
        print(f"driver CPU per record of {what}, shares_2 / shares_1 <= 0.2: "
              f"{'met' if verdict else 'missed' if verdict is not None else 'unknown'}")
    errors = [e for r in runs for e in r.errors]
    for error in errors:
        print(f"ERROR {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

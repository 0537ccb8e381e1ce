"""Benchmark of the ``exactly.kafka`` sink against Spark's Kafka sink and a plain producer.

What is measured
----------------
``--records`` JSON records (``{"id", "key", "amount", "ts"}``, about 70 bytes) are produced
once into an input topic of 2 partitions on a single-node broker on 127.0.0.1 (started here
unless ``EXACTLY_KAFKA_BOOTSTRAP`` is set). Then, in one SparkSession (``local[2]``), each
sink drains that same input with Spark's Kafka source (``read_committed``,
``maxOffsetsPerTrigger = records / --epochs``, ``trigger(availableNow=True)``) through the
same projection (``key``, ``value`` passed through) into a fresh output topic:

``exactly_once``   ``exactly.kafka``, mode exactly_once: tasks stage Arrow files, the driver
                   side publishes each epoch in one Kafka transaction with its marker
``at_least_once``  ``exactly.kafka``, mode at_least_once: tasks produce directly
``spark_kafka``    Spark's built-in Kafka sink (Java producer in the tasks, at least once)
``noop``           Spark's ``noop`` sink: the cost of reading and running epochs

``plain_producer`` is one confluent-kafka producer in this process writing the same
records (the values read back from the input topic), idempotent, ``linger.ms=5``: the
physical limit of one Python client on this machine. Each sink's records/s is the input
size over the wall-clock time from ``start()`` to termination (JVM warm-up excluded: every
sink runs once on a small input first). Every output topic is read back with
``read_committed`` and must hold exactly ``--records`` records, else exit status 1.

Latency: the ``exactly_once`` job (then, for reference, the same job with Spark's Kafka sink,
whose records are visible to ``read_committed`` readers as soon as a task writes them) runs
with a processing-time trigger of ``--interval-ms`` (1 s) while a producer writes
``--rate`` records/s for ``--seconds`` into an input topic with
``message.timestamp.type=LogAppendTime``; the job passes each record's broker timestamp
through, and a ``read_committed`` consumer of the output records the time at which each
record became visible. Reported: p50 / p99 of visible - appended to the input topic (the
same clock: one machine). A producer or consumer thread starved of CPU by Spark on a busy
2-core machine still adds delay on the consumer side; compare the two sinks, not absolutes.
Measurement starts once two epochs with (warm-up) data have committed, so the first epoch's
start-up cost (Python workers, connections) is not counted.

Run from the repository root (after ``scripts/setup.sh``)::

    .venv/bin/python bench/kafka_sink.py [--records 200000] [--epochs 10]
        [--interval-ms 1000] [--rate 500] [--seconds 30] [--workdir DIR]

The table goes to stdout, the numbers to ``WORKDIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from exactly import options as opt
from exactly.testing.kafka_broker import broker_or_configured, consume_all, create_topic, quiet_conf


def produce_input(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({**quiet_conf(bootstrap), "linger.ms": 20, "enable.idempotence": True})
    for i in range(records):
        value = json.dumps({"id": i, "key": f"k{i % 100:02d}", "amount": i % 997 / 10,
                            "ts": 0.0})
        while True:
            try:
                p.produce(topic, value.encode(), f"k{i % 100:02d}".encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def plain_producer(bootstrap: str, source_topic: str, records: int) -> dict[str, float]:
    """One producer writing the input's records again: the physical limit."""
    from confluent_kafka import Producer

    rows = consume_all(bootstrap, source_topic, isolation_level="read_uncommitted")
    out = f"bench-plain-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, out, 2)
    p = Producer({**quiet_conf(bootstrap), "linger.ms": 5, "enable.idempotence": True,
                  "queue.buffering.max.messages": 500_000})
    started = time.perf_counter()
    for _, _, key, value in rows:
        while True:
            try:
                p.produce(out, value, key)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "records_per_s": records / seconds, "topic": out}


def run_sink(spark: Any, kind: str, bootstrap: str, source_topic: str, records: int,
             epochs: int, workdir: Path) -> dict[str, Any]:
    from exactly.config import CheckpointConfig
    from exactly.connectors.kafka.source import read_kafka
    from exactly.spark.runner import start_query

    out = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, out, 2)
    checkpoint = workdir / f"ck-{out}"
    df = read_kafka(spark, bootstrap, topics=source_topic,
                    max_offsets_per_trigger=max(1, records // epochs)).select("key", "value")
    started = time.perf_counter()
    if kind in ("exactly_once", "at_least_once"):
        query = start_query(df, sink_format="exactly.kafka", available_now=True,
                            checkpoint=CheckpointConfig(mode=kind, storage=str(checkpoint)),
                            options={opt.KAFKA_BOOTSTRAP: bootstrap, opt.TOPIC: out,
                                     opt.TRANSACTIONAL_ID_PREFIX: f"bench-{out}",
                                     opt.CHECKPOINT_INTERVAL_MS: "1000"}).query
    else:
        writer = df.writeStream.option("checkpointLocation", str(checkpoint))
        if kind == "spark_kafka":
            writer = (writer.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                      .option("topic", out))
        else:
            writer = writer.format("noop")
        query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{kind}: {query.exception()}")
    add_batch = [p["durationMs"].get("addBatch", 0) for p in query.recentProgress
                 if p["numInputRows"]]
    result = {"seconds": seconds, "records_per_s": records / seconds, "topic": out,
              "epochs": len(add_batch),
              "add_batch_p50_ms": float(np.median(add_batch)) if add_batch else 0.0}
    if kind != "noop":
        seen = len(consume_all(bootstrap, out, isolation_level="read_committed"))
        result["records_read_back"] = seen
    return result


def latency(spark: Any, bootstrap: str, workdir: Path, interval_ms: int, rate: int,
            seconds: float, kind: str = "exactly_once") -> dict[str, Any]:
    """p50/p99 from produce to read_committed visibility through sink ``kind``
    (``exactly_once`` or ``spark_kafka``)."""
    from confluent_kafka import Consumer, Producer

    from exactly.config import CheckpointConfig
    from exactly.connectors.kafka.source import read_kafka
    from exactly.spark.runner import start_query

    name = uuid.uuid4().hex[:6]
    source, out = f"lat-in-{name}", f"lat-out-{name}"
    # the broker stamps each input record when it appends it (LogAppendTime): latency is
    # measured from there, so a producer starved of CPU on a busy machine does not count
    create_topic(bootstrap, source, 2, **{"message.timestamp.type": "LogAppendTime"})
    create_topic(bootstrap, out, 2)
    df = read_kafka(spark, bootstrap, topics=source, starting_offsets="earliest").selectExpr(
        "key", "to_json(named_struct('ts', cast(timestamp as double))) as value")
    if kind == "exactly_once":
        query = start_query(df, sink_format="exactly.kafka",
                            checkpoint=CheckpointConfig(interval=f"{interval_ms}ms",
                                                        storage=str(workdir / f"ck-{out}")),
                            options={opt.KAFKA_BOOTSTRAP: bootstrap, opt.TOPIC: out,
                                     opt.TRANSACTIONAL_ID_PREFIX: f"lat-{name}",
                                     opt.CHECKPOINT_INTERVAL_MS: str(interval_ms)}).query
    else:
        query = (df.writeStream.format("kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
                 .option("checkpointLocation", str(workdir / f"ck-{out}"))
                 .trigger(processingTime=f"{interval_ms} milliseconds").start())
    delays: list[float] = []
    warm: list[int] = []
    stop = threading.Event()

    def consume() -> None:
        c = Consumer({**quiet_conf(bootstrap), "group.id": f"lat-{name}",
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        c.subscribe([out])
        while not stop.is_set():
            msg = c.poll(0.05)
            if msg is not None and msg.error() is None:
                if msg.key() == b"warm":
                    warm.append(1)
                else:
                    delays.append(time.time() - json.loads(msg.value())["ts"])
        c.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    p = Producer({**quiet_conf(bootstrap), "linger.ms": 0})
    # warm up until two epochs with data have committed: the first one after a start pays
    # for Python worker start-up and connections (over 10 s on a loaded 2-core machine)
    deadline = time.time() + 300
    while time.time() < deadline and sum(
            1 for pr in query.recentProgress if pr["numInputRows"]) < 2:
        p.produce(source, b"{}", b"warm")
        p.flush(10)
        time.sleep(interval_ms / 1000)
    while len(warm) == 0 and time.time() < deadline:
        time.sleep(0.1)
    sent = 0
    start = time.time()
    while time.time() - start < seconds:
        due = int((time.time() - start) * rate)
        while sent < due:
            p.produce(source, json.dumps({"id": sent}).encode(), b"k")
            sent += 1
        p.poll(0)
        time.sleep(0.002)
    p.flush(30)
    deadline = time.time() + 60
    while len(delays) < sent and time.time() < deadline:
        time.sleep(0.2)
    stop.set()
    reader.join(10)
    epochs = [pr["durationMs"].get("triggerExecution", 0) for pr in query.recentProgress
              if pr["numInputRows"]][2:]
    query.stop()
    arr = np.array(delays) * 1000
    return {"sink": kind, "records": sent, "seen": len(delays), "interval_ms": interval_ms,
            "epoch_p50_ms": float(np.median(epochs)) if epochs else float("nan"),
            "p50_ms": float(np.percentile(arr, 50)) if len(arr) else float("nan"),
            "p99_ms": float(np.percentile(arr, 99)) if len(arr) else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=500, help="records/s for the latency run")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the latency run")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)

    from exactly.connectors.kafka.source import spark_kafka_conf
    from exactly.logs import configure
    from exactly.spark.session import spark_session

    configure()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-kafka-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    results: dict[str, Any] = {"records": args.records, "epochs": args.epochs,
                               "cores": os.cpu_count()}
    with broker_or_configured(workdir / "broker") as bootstrap:
        source = f"bench-in-{uuid.uuid4().hex[:6]}"
        warm = f"bench-warm-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, source, 2)
        create_topic(bootstrap, warm, 2)
        produce_input(bootstrap, source, args.records)
        produce_input(bootstrap, warm, 2_000)
        spark = spark_session(app_name="exactly-bench-kafka", conf=spark_kafka_conf())
        try:
            kinds = ("noop", "exactly_once", "at_least_once", "spark_kafka")
            for kind in kinds:  # warm-up: JVM, Python workers, connector classes
                run_sink(spark, kind, bootstrap, warm, 2_000, 2, workdir)
            sinks = {kind: run_sink(spark, kind, bootstrap, source, args.records, args.epochs,
                                    workdir) for kind in kinds}
            plain = plain_producer(bootstrap, source, args.records)
            lat = {kind: latency(spark, bootstrap, workdir, args.interval_ms, args.rate,
                                 args.seconds, kind) for kind in ("exactly_once", "spark_kafka")}
        finally:
            spark.stop()
    results.update({"sinks": sinks, "plain_producer": plain, "latency": lat})
    (workdir / "results.json").write_text(json.dumps(results, indent=2))

    limit = plain["records_per_s"]
    spark_rate = sinks["spark_kafka"]["records_per_s"]
    print(f"\n{args.records} records, {args.epochs} epochs, local[2], "
          f"{os.cpu_count()} cores\n")
    print(f"{'sink':16} {'seconds':>9} {'records/s':>11} {'vs plain':>9} {'vs spark':>9} "
          f"{'addBatch p50':>13}")
    for kind, r in [*sinks.items(), ("plain_producer", plain)]:
        print(f"{kind:16} {r['seconds']:9.2f} {r['records_per_s']:11,.0f} "
              f"{r['records_per_s'] / limit:9.2f} {r['records_per_s'] / spark_rate:9.2f} "
              f"{r.get('add_batch_p50_ms', float('nan')):11.0f}ms")
    print(f"\nlatency produce -> read_committed visible, trigger {args.interval_ms} ms, "
          f"{args.rate} records/s for {args.seconds:.0f} s")
    for kind, r in lat.items():
        print(f"{kind:16} p50 {r['p50_ms']:7.0f} ms   p99 {r['p99_ms']:7.0f} ms   "
              f"epoch (triggerExecution) p50 {r['epoch_p50_ms']:5.0f} ms   "
              f"{r['seen']}/{r['records']} seen")
    bad = [k for k, r in sinks.items() if k != "noop" and r["records_read_back"] != args.records]
    if bad or any(r["seen"] < r["records"] for r in lat.values()):
        print(f"MISMATCH: {bad or 'latency run lost records'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

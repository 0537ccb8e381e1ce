"""A Kafka-to-Kafka job as a user writes it after ``pip install exactly``: Spark's Kafka
source (its connector asked for with ``spark_session(kafka=True)``: ``spark.jars.packages``,
resolved from Maven Central) into exactly's transactional Kafka sink, exactly once, then an
audit of the output against the input by id.

Needs only the installed wheel, Java and a reachable broker (no checkout, no test kit):

    python kafka_to_kafka_job.py --bootstrap HOST:PORT --workdir DIR [--records N]
        [--ivy DIR]

It creates two topics of its own, produces ``N`` records ``{"id": i}`` (unique ids), runs the
job to the end of the input (``availableNow``, at most ``N/4`` records an epoch, so several
epochs commit), reads the output with a ``read_committed`` consumer and prints one JSON line
(the last stdout line starting with ``{``; Spark's Ivy writes a line there too):
``{"ok", "records", "found", "missing", "duplicates", "unexpected", "epochs", "jars"}``
(``jars``: the jars the executors fetch from the driver). Exit status 0 only when every
input id is in the output exactly once and nothing else is. ``--ivy`` is Spark's Ivy
directory (``spark.jars.ivy``); an empty one proves the connector comes from Maven Central.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections import Counter
from pathlib import Path


def produce(bootstrap: str, topic: str, sink: str, records: int) -> None:
    """Create both topics (two partitions each), then write the input."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 1), NewTopic(sink, 2, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(records):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    if producer.flush(30):
        raise RuntimeError(f"could not produce the input to {topic}")


def consume_ids(bootstrap: str, topic: str, expected: int) -> list[int]:
    """Every id in ``topic``'s committed records, read to the end of each partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    ids: list[int] = []
    at_end: set[int] = set()
    try:
        while len(at_end) < len(partitions):
            message = consumer.poll(30)
            if message is None:
                raise RuntimeError(f"no record nor end of partition from {topic} in 30 s")
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise RuntimeError(str(message.error()))
            at_end.discard(message.partition())
            ids.append(int(json.loads(message.value())["id"]))
    finally:
        consumer.close()
    return ids


def run_job(bootstrap: str, source: str, sink: str, checkpoint: Path, records: int,
            ivy: str | None) -> tuple[int, list[str]]:
    """Run the job to the end of its input; returns (epochs committed, executors' jars)."""
    from pyspark.sql import functions as F

    from exactly.config import CheckpointConfig
    from exactly.connectors.kafka.source import read_kafka
    from exactly.ops.query import start_query
    from exactly.spark.session import spark_session

    conf = {"spark.jars.ivy": ivy} if ivy else {}
    spark = spark_session(app_name="exactly-kafka-to-kafka", kafka=True, conf=conf)
    try:
        # the jars the executors fetch from the driver
        jars = str(spark.sparkContext._jsc.sc().listJars().mkString(",")).split(",")
        events = read_kafka(spark, bootstrap, topics=source,
                            max_offsets_per_trigger=max(1, records // 4))
        out = events.select(F.col("key"), F.col("value"))
        query = start_query(out, sink_format="exactly.kafka", available_now=True,
                            checkpoint=CheckpointConfig(storage=str(checkpoint)),
                            options={"kafka.bootstrap.servers": bootstrap, "topic": sink,
                                     "transactionalIdPrefix": f"k2k-{uuid.uuid4().hex[:8]}"})
        query.await_termination()
        epochs = sum(1 for p in query.query.recentProgress if p["numInputRows"] > 0)
    finally:
        spark.stop()
    return epochs, [Path(j).name for j in jars]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--records", type=int, default=200)
    p.add_argument("--ivy", default=None, help="Spark's Ivy directory (spark.jars.ivy)")
    args = p.parse_args(argv)
    name = uuid.uuid4().hex[:8]
    source, sink = f"k2k-in-{name}", f"k2k-out-{name}"
    produce(args.bootstrap, source, sink, args.records)
    epochs, jars = run_job(args.bootstrap, source, sink, args.workdir / "checkpoint",
                           args.records, args.ivy)
    found = consume_ids(args.bootstrap, sink, args.records)
    counts = Counter(found)
    expected = set(range(args.records))
    report = {"records": args.records, "found": len(found),
              "missing": sorted(expected - set(counts)),
              "duplicates": sorted(i for i, n in counts.items() if n > 1),
              "unexpected": sorted(set(counts) - expected), "epochs": epochs, "jars": jars}
    report["ok"] = not (report["missing"] or report["duplicates"] or report["unexpected"])
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Run by test_kafka_source.py in its own process (Spark's connector, spark_session(kafka=True),
loads when the JVM starts): reads topics with
exactly.connectors.kafka.source.read_kafka and prints one JSON line of findings."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(bootstrap: str, topic: str, pattern: str, workdir: str) -> None:
    from exactly.connectors.kafka.source import read_kafka
    from exactly.spark.session import spark_session

    spark = spark_session(app_name="exactly-kafka-source-test", kafka=True)
    found: dict[str, object] = {}
    try:
        def drain(name: str, df, **_: object) -> list[int]:
            rows: list[int] = []

            def collect(batch, _epoch: int) -> None:
                rows.extend(r[0] for r in batch.selectExpr(
                    "cast(get_json_object(cast(value as string), '$.id') as long)").collect())

            ck = Path(workdir) / name
            q = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            found[f"{name}_batches"] = sum(1 for p in q.recentProgress if p["numInputRows"] > 0)
            offsets = sorted((p for p in (ck / "offsets").iterdir() if p.name.isdigit()),
                             key=lambda p: int(p.name))
            found[f"{name}_last_offsets"] = json.loads(offsets[-1].read_text().splitlines()[-1])
            return sorted(rows)

        found["committed"] = drain("committed", read_kafka(
            spark, bootstrap, topics=topic, max_offsets_per_trigger=5))
        found["uncommitted"] = drain("uncommitted", read_kafka(
            spark, bootstrap, topics=topic, isolation_level="read_uncommitted"))
        found["pattern"] = drain("pattern", read_kafka(spark, bootstrap, pattern=pattern))
        found["from_offsets"] = drain("from_offsets", read_kafka(
            spark, bootstrap, topics=topic, starting_offsets={topic: {"0": 3, "1": -2}}))
        found["timeout_error"] = bad_timeout(spark, bootstrap, topic, Path(workdir))
    finally:
        spark.stop()
    print(json.dumps(found))


def bad_timeout(spark, bootstrap: str, topic: str, workdir: Path) -> str:
    """Start an exactly.kafka query whose transaction timeout exceeds the broker's maximum:
    it must fail at start, with the seeds' advice, before any epoch commits."""
    from exactly.config import CheckpointConfig
    from exactly.connectors.kafka.source import read_kafka
    from exactly.ops.query import start_query

    df = read_kafka(spark, bootstrap, topics=topic).select("key", "value")
    try:
        q = start_query(df, sink_format="exactly.kafka", available_now=True,
                        checkpoint=CheckpointConfig(storage=str(workdir / "bad-timeout")),
                        options={"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                 "transactionalIdPrefix": "bad",
                                 "kafka.transaction.timeout.ms": str(10**9)})
        q.await_termination()
    except Exception as exc:
        return str(exc)
    return "no error"


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""Stateful test jobs for savepoints (used in-process by the tests and by ``exactly run``).

``JOB_KIND``:
* ``agg``: per-key count and sum (``groupBy().agg``, uid ``counts``) in update mode into
  PostgreSQL (the 2PC sink, ``writeMode=upsert`` by key; ``JOB_DSN``, ``JOB_TABLE``);
* ``tws``: a ``transformWithStateInPandas`` running count and sum per key (uid ``running``)
  that emits every input id with its key's running totals, into the file sink (``JOB_OUT``);
* ``rows``: the input rows as they come (no state), for sink-only savepoint tests.

``JOB_SINK=kafka`` writes the ``tws`` rows as JSON to ``JOB_TOPIC`` on ``JOB_BOOTSTRAP``;
``JOB_SINK=delta`` writes them to the Delta table ``JOB_OUT`` (a directory or ``s3://``
URI; ``JOB_STORAGE``: its storage options as JSON).
``JOB_VERSION``: ``v1``; ``v2`` adds a stateful step before the old one (``dropDuplicates``
on id, uid ``dedup``; ``JOB_DEDUP_KEY``: its columns, comma-separated, default ``id``).
``JOB_BACKEND``: hashmap | rocksdb | unset (the default: RocksDB with changelog
checkpointing for a new checkpoint); ``JOB_INCREMENTAL``: 1 | 0 | unset (RocksDB
changelog checkpointing on, off, or as the backend decides). Input: exactly.datagen with
``JOB_ROWS`` rows (``JOB_RATE`` per second, 0 = at once; ``JOB_MAX_ROWS`` per epoch) over
``JOB_KEYS`` keys. ``JOB_CHANGED_VALUE=1`` adds a max to the aggregation (a changed value
schema for the same uid: a new nullable buffer field); ``JOB_ADDED_COUNT=1`` adds a
``count(amount)`` (a new non-nullable buffer field). ``JOB_TWS_ADDED=1`` gives the ``tws``
state a new nullable field ``biggest`` (the largest amount since it appeared), written out
as a column of that name.
"""

from __future__ import annotations

import json
import os

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

import exactly
from exactly import CheckpointConfig, Job

SPARK_CONF = {"spark.sql.shuffle.partitions": os.environ.get("JOB_PARTITIONS", "2")}
TWS_OUT = StructType([StructField("id", LongType()), StructField("key", StringType()),
                      StructField("n", LongType()), StructField("total", DoubleType())])
TWS_ADDED_OUT = StructType([*TWS_OUT.fields, StructField("biggest", DoubleType())])


class RunningTotalsAdded(StatefulProcessor):
    """:class:`RunningTotals` whose state gained a nullable field ``biggest``: the largest
    amount of the rows seen since the field was added (None in state restored from before)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.acc = handle.getValueState("acc", StructType([
            StructField("n", LongType()), StructField("total", DoubleType()),
            StructField("biggest", DoubleType(), True)]))

    def handleInputRows(self, key, rows, timerValues):
        state = self.acc.get()
        n, total = (state[0], state[1]) if state is not None else (0, 0.0)
        biggest = state[2] if state is not None and len(state) > 2 else None
        out = []
        for pdf in rows:
            for i, amount in zip(pdf["id"].tolist(), pdf["amount"].tolist(), strict=True):
                n += 1
                total += amount
                biggest = amount if biggest is None else max(biggest, amount)
                out.append((i, key[0], n, total, biggest))
        self.acc.update((n, total, biggest))
        if out:
            yield pd.DataFrame(out, columns=["id", "key", "n", "total", "biggest"])

    def close(self) -> None:
        pass


class RunningTotals(StatefulProcessor):
    """Per key: how many rows and their amount so far; every row goes out with them."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.acc = handle.getValueState("acc", StructType([StructField("n", LongType()),
                                                           StructField("total", DoubleType())]))

    def handleInputRows(self, key, rows, timerValues):
        n, total = self.acc.get() or (0, 0.0)
        out = []
        for pdf in rows:
            for i, amount in zip(pdf["id"].tolist(), pdf["amount"].tolist(), strict=True):
                n += 1
                total += amount
                out.append((i, key[0], n, total))
        self.acc.update((n, total))
        if out:
            yield pd.DataFrame(out, columns=["id", "key", "n", "total"])

    def close(self) -> None:
        pass


def events(spark):
    reader = (spark.readStream.format("exactly.datagen")
              .option("rowsPerSecond", os.environ.get("JOB_RATE", "0"))
              .option("totalRows", os.environ.get("JOB_ROWS", "3000"))
              .option("keys", os.environ.get("JOB_KEYS", "10")))
    if os.environ.get("JOB_MAX_ROWS"):
        reader = reader.option("maxRowsPerTrigger", os.environ["JOB_MAX_ROWS"])
    rows = reader.load()
    if os.environ.get("JOB_VERSION", "v1") == "v2":
        columns = os.environ.get("JOB_DEDUP_KEY", "id").split(",")
        rows = exactly.uid("dedup", rows.dropDuplicates(columns))
    return rows


def stateful(spark):
    rows = events(spark)
    if os.environ.get("JOB_KIND", "agg") == "rows":
        return rows.select("id", "key", "amount")
    if os.environ.get("JOB_KIND", "agg") == "tws" and os.environ.get("JOB_TWS_ADDED"):
        return exactly.uid("running", rows.groupBy("key").transformWithStateInPandas(
            RunningTotalsAdded(), TWS_ADDED_OUT, "Update", "None"))
    if os.environ.get("JOB_KIND", "agg") == "tws":
        return exactly.uid("running", rows.groupBy("key").transformWithStateInPandas(
            RunningTotals(), TWS_OUT, "Update", "None"))
    aggregates = [F.count("*").alias("n"), F.sum("amount").alias("total")]
    if os.environ.get("JOB_CHANGED_VALUE"):
        aggregates.append(F.max("amount").alias("biggest"))
    if os.environ.get("JOB_ADDED_COUNT"):
        aggregates.append(F.count("amount").alias("amounts"))
    return exactly.uid("counts", rows.groupBy("key").agg(*aggregates))


def build(spark):
    incremental = os.environ.get("JOB_INCREMENTAL")
    checkpoint = CheckpointConfig(interval=os.environ.get("JOB_INTERVAL", "1s"),
                                  state_backend=os.environ.get("JOB_BACKEND") or None,
                                  incremental=None if not incremental else incremental == "1")
    df = stateful(spark)
    if os.environ.get("JOB_SINK") == "kafka":
        values = df.select(F.to_json(F.struct(*df.columns)).alias("value"))
        return Job(values, sink_format="exactly.kafka", checkpoint=checkpoint,
                   options={"kafka.bootstrap.servers": os.environ["JOB_BOOTSTRAP"],
                            "topic": os.environ["JOB_TOPIC"],
                            "transactionalIdPrefix": f"sp-{os.environ['JOB_TOPIC']}"})
    if os.environ.get("JOB_SINK") == "delta":
        storage = json.loads(os.environ.get("JOB_STORAGE") or "{}")
        return Job(df, sink_format="exactly.delta", path=os.environ["JOB_OUT"],
                   options={f"storage.{k}": v for k, v in storage.items()},
                   checkpoint=checkpoint)
    if os.environ.get("JOB_KIND", "agg") in ("tws", "rows"):
        return Job(df, sink_format="exactly.files", path=os.environ["JOB_OUT"],
                   options={"format": "parquet"}, checkpoint=checkpoint)
    return Job(df, sink_format="exactly.postgres", output_mode="update",
               options={"dsn": os.environ["JOB_DSN"], "table": os.environ["JOB_TABLE"],
                        "writeMode": "upsert", "keyColumns": "key"},
               checkpoint=checkpoint)

"""A stateful job for ``exactly run`` on a cluster: deduplication, then per-key totals, upserted
into PostgreSQL.

Input: exactly.datagen, ``JOB_RATE`` rows per second of ``JOB_ROWS`` (at most
``JOB_MAX_ROWS`` an epoch). Row ``id`` delivers event ``eid``: its own id, except that every
row with ``id % 4 == 3`` and ``id >= REDELIVERY_LAG`` delivers again the event of row
``id - REDELIVERY_LAG`` (an upstream that delivers at least once: the copy comes a few epochs
later). An event's key and amount are functions of its ``eid`` alone, so both deliveries are
the same event. The pipeline:

1. ``dropDuplicates(["eid"])`` (uid ``dedup``): every event once;
2. ``groupBy("key")`` count, sum of amount and sum of eid (uid ``totals``), output mode
   update;
3. the ``exactly.postgres`` sink with ``writeMode=upsert`` keyed by ``key`` (``JOB_DSN``,
   ``JOB_TABLE``).

``JOB_BACKEND``: the state backend (hashmap | rocksdb). Two state partitions unless a restore
rescales them (``exactly run -s ... --parallelism N``).
"""

from __future__ import annotations

import os

from pyspark.sql import functions as F

import exactly
from exactly import CheckpointConfig, Job

KEYS = 7
#: a re-delivered event's row comes this many rows after the event's first delivery
REDELIVERY_LAG = 501
SPARK_CONF = {"spark.sql.shuffle.partitions": "2"}


def build(spark):
    rows = (spark.readStream.format("exactly.datagen")
            .option("rowsPerSecond", os.environ.get("JOB_RATE", "100"))
            .option("totalRows", os.environ.get("JOB_ROWS", "1000000"))
            .option("maxRowsPerTrigger", os.environ.get("JOB_MAX_ROWS", "200"))
            .load())
    redelivered = (F.col("id") % 4 == 3) & (F.col("id") >= REDELIVERY_LAG)
    events = rows.select(
        F.when(redelivered, F.col("id") - REDELIVERY_LAG).otherwise(F.col("id")).alias("eid"))
    events = events.select(
        "eid", F.format_string("k%d", F.col("eid") % KEYS).alias("key"),
        ((F.col("eid") * 37) % 1000 / F.lit(10.0)).alias("amount"))
    unique = exactly.uid("dedup", events.dropDuplicates(["eid"]))
    totals = exactly.uid("totals", unique.groupBy("key").agg(
        F.count("*").alias("n"), F.sum("amount").alias("total"),
        F.sum("eid").alias("eid_sum")))
    checkpoint = CheckpointConfig(interval=os.environ.get("JOB_INTERVAL", "1s"),
                                  state_backend=os.environ["JOB_BACKEND"])
    return Job(totals, sink_format="exactly.postgres", output_mode="update",
               options={"dsn": os.environ["JOB_DSN"], "table": os.environ["JOB_TABLE"],
                        "writeMode": "upsert", "keyColumns": "key"},
               checkpoint=checkpoint)

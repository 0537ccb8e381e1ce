"""A stateful supervised test job: per-key count and sum of exactly.datagen's rows
(``groupBy("key").agg``, uid ``totals``) in update mode into PostgreSQL (the 2PC sink,
``writeMode=upsert`` by key), so the table holds every key's totals so far.

Configured by environment variables: ``JOB_DSN``, ``JOB_TABLE`` the table; ``JOB_ROWS``
total rows, ``JOB_RATE`` rows per second (0: all at once), ``JOB_MAX_ROWS`` rows per epoch
cap, ``JOB_KEYS`` distinct keys, ``JOB_INTERVAL`` checkpoint interval, ``JOB_PARTITIONS``
state partitions of a new checkpoint.
"""

from __future__ import annotations

import os

from pyspark.sql import functions as F

import exactly
from exactly import CheckpointConfig, Job

SPARK_CONF = {"spark.sql.shuffle.partitions": os.environ.get("JOB_PARTITIONS", "2")}


def build(spark):
    reader = (spark.readStream.format("exactly.datagen")
              .option("rowsPerSecond", os.environ.get("JOB_RATE", "200"))
              .option("totalRows", os.environ.get("JOB_ROWS", "5000"))
              .option("keys", os.environ.get("JOB_KEYS", "10")))
    if os.environ.get("JOB_MAX_ROWS"):
        reader = reader.option("maxRowsPerTrigger", os.environ["JOB_MAX_ROWS"])
    totals = exactly.uid("totals", reader.load().groupBy("key").agg(
        F.count("*").alias("n"), F.sum("amount").alias("total")))
    return Job(totals, sink_format="exactly.postgres", output_mode="update",
               options={"dsn": os.environ["JOB_DSN"], "table": os.environ["JOB_TABLE"],
                        "writeMode": "upsert", "keyColumns": "key", "retrySeconds": "5"},
               checkpoint=CheckpointConfig(interval=os.environ.get("JOB_INTERVAL", "1s")))

"""A supervised test job: exactly.datagen -> a 10-second event-time window count -> files.

Event time is ``id`` seconds after the epoch, the key ``id % 3``; the watermark has no
delay, so the last window waits for an event-time watermark no row ever brings (only
``exactly stop --drain`` closes it). ``JOB_OUT`` output directory, ``JOB_ROWS`` total rows.
"""

from __future__ import annotations

import os

from pyspark.sql import functions as F

from exactly import CheckpointConfig, Job


def build(spark):
    rows = int(os.environ.get("JOB_ROWS", "95"))
    events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
              .option("totalRows", rows).load()
              .select(F.timestamp_seconds("id").alias("event_time"),
                      (F.col("id") % 3).alias("k")))
    counts = (events.withWatermark("event_time", "0 seconds")
              .groupBy(F.window("event_time", "10 seconds"), "k").count()
              .select(F.unix_seconds(F.col("window.start")).alias("window_start"), "k",
                      "count"))
    return Job(counts, sink_format="exactly.files", path=os.environ["JOB_OUT"],
               options={"format": "parquet"}, checkpoint=CheckpointConfig(interval="1s"))

"""A supervised test job: exactly.datagen -> transformWithStateInPandas with an event-time
timer -> files.

Event time is ``id`` seconds after 1970-01-01T01:00Z, the key ``id % 3``. Each key counts its rows
and registers one event-time timer at 2001-09-09 (10^12 ms), which no row's event time
reaches: the per-key totals are emitted only when ``exactly stop --drain`` advances the
watermark to the end of time. ``JOB_OUT`` output directory, ``JOB_ROWS`` total rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from exactly import CheckpointConfig, Job

TIMER_MS = 10**12


class CountUntilTimer(StatefulProcessor):
    """Counts a key's rows; its event-time timer emits the total and clears the state."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        seen = sum(len(frame) for frame in rows)
        before = self.count.get()[0] if self.count.exists() else 0
        self.count.update((before + seen,))
        self.handle.registerTimer(TIMER_MS)
        yield from ()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"k": [int(key[0])], "count": [int(self.count.get()[0])]})
        self.count.clear()

    def close(self) -> None:
        pass


def build(spark):
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    rows = int(os.environ.get("JOB_ROWS", "95"))
    events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
              .option("totalRows", rows).load()
              # an hour after the epoch: the first epoch's watermark 0 drops a row at 0
              .select(F.timestamp_seconds(F.col("id") + 3600).alias("event_time"),
                      (F.col("id") % 3).alias("k")))
    totals = (events.withWatermark("event_time", "0 seconds").groupBy("k")
              .transformWithStateInPandas(CountUntilTimer(), outputStructType="k long, count long",
                                          outputMode="Append", timeMode="EventTime"))
    return Job(totals, sink_format="exactly.files", path=os.environ["JOB_OUT"],
               options={"format": "parquet"}, checkpoint=CheckpointConfig(interval="1s"))

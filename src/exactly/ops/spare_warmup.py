"""The warm-up of a spare driver's Python side: what the first epoch after a takeover would
otherwise start (measured in a takeover at 500 rows/s, 2 cores: the Python worker daemon and
its forked workers 3.3-4.4 s after the kill, the read planner's daemon at 1.6-2.0 s, of a
6.2 s kill -> first committed epoch).

A spare on a local master (its JVM runs the tasks) reads a few rows of a Python data source of
its own (:class:`WarmupDataSource`, registered in the spare's session only) through a pandas
UDF, once in batch and once as a one-epoch stream (``availableNow``, a checkpoint in a
temporary directory, removed after) into that source's own Arrow stream writer, before it
says ``ready``: Spark starts the data source's lookup and planning processes, the Python
worker daemon (exactly's, with its preloaded modules) and one worker per core, and runs its
micro-batch code once in the spare's JVM; the daemons stay for the next query. Measured on
the takeover above: 6.2 s without a warm-up, 3.0 s with the batch read, 2.7-2.85 s with the
stream too (load 3.5). Nothing is read from or written to the job's sources, sinks or
checkpoint. On a cluster master the spare runs no task before it takes over (it holds no
executor), so nothing is warmed there.
"""

# no ``from __future__ import annotations``: the pandas UDF's hints must be types, not text
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)

NAME = "exactly.internal.warmup"
#: the longest the warm-up's one-epoch stream may take
WARMUP_TIMEOUT_S = 120


class _Reader(DataSourceReader):
    def __init__(self, partitions: int) -> None:
        self.count = partitions

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition: Any) -> Iterator[tuple[int]]:
        yield (int(partition.value),)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One epoch of one row per partition."""

    def __init__(self, partitions: int) -> None:
        self.count = partitions

    def initialOffset(self) -> dict:
        return {"epoch": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"epoch": 1}

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if int(end["epoch"]) <= int(start["epoch"]):
            return []
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition: Any) -> Iterator[tuple[int]]:
        yield (int(partition.value),)

    def commit(self, end: dict) -> None:
        return None


class _StreamWriter(DataSourceStreamArrowWriter):
    """Counts rows (the path exactly's sinks take: Arrow batches in, a message out)."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:
        return None

    def abort(self, messages: list[Any], batchId: int) -> None:
        return None


class WarmupDataSource(DataSource):
    """One row per partition (option ``partitions``), read in batch or as one epoch of a
    stream, and a stream writer that drops what it gets: for the warm-up only."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "id long"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self._partitions())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(self._partitions())

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _StreamWriter()

    def _partitions(self) -> int:
        return int(self.options.get("partitions", "2"))


def _same(ids: pd.Series) -> pd.Series:
    return ids


def warm_python_workers(spark: SparkSession, cores: int) -> None:
    """Run the warm-up (see the module doc) with one partition per local core."""
    from pyspark.sql.functions import pandas_udf

    same = pandas_udf(_same, "long")  # type: ignore[call-overload]
    spark.dataSource.register(WarmupDataSource)
    frame = spark.read.format(NAME).option("partitions", str(cores)).load()
    frame.select(same("id").alias("id")).collect()
    with tempfile.TemporaryDirectory(prefix="exactly-spare-warmup-") as place:
        stream = spark.readStream.format(NAME).option("partitions", str(cores)).load()
        query = (stream.select(same("id").alias("id")).writeStream.format(NAME)
                 .option("checkpointLocation", os.path.join(place, "checkpoint"))
                 .queryName(f"exactly-spare-warmup-{os.getpid()}")
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(WARMUP_TIMEOUT_S)
        finally:
            query.stop()

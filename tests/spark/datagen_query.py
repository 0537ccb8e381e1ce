"""The small bounded query the checkpoint tests damage and restart: datagen into the file
sink, ``PER_EPOCH`` rows an epoch, run to the end (``availableNow``)."""

from __future__ import annotations

from pathlib import Path

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query

ROWS, PER_EPOCH = 30, 10  # three epochs: 0, 1, 2


def datagen(spark, rows: int = ROWS):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", PER_EPOCH).load())


def run_query(spark, ck: Path, out: Path, rows: int = ROWS):
    """Start the query on checkpoint ``ck`` into ``out`` and wait for it to end."""
    query = start_query(datagen(spark, rows), sink_format="exactly.files", path=str(out),
                        checkpoint=CheckpointConfig(storage=str(ck)), available_now=True)
    query.await_termination()
    return query

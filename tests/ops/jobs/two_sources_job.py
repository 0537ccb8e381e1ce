"""A job reading two ``exactly.datagen`` sources (a union) into ``JOB_OUT``: not a
version of ``datagen_job.py`` (one source), so an upgrade to it is refused."""

from __future__ import annotations

import os

from exactly import CheckpointConfig, Job


def build(spark):
    def source(first: int):
        return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "100")
                .option("totalRows", "1000").load().selectExpr(f"id + {first} AS id", "key",
                                                               "amount"))

    return Job(source(0).unionByName(source(10**9)), sink_format="exactly.files",
               path=os.environ["JOB_OUT"], options={"format": "parquet"},
               checkpoint=CheckpointConfig(interval="1s"))

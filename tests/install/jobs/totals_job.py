"""A user's stateful job for the wheel install test: per key the count and sum of ``amount``
(``groupBy().agg``, uid ``totals``, hashmap state) over JSON-lines files in ``JOB_IN``, the
whole result table written each epoch (complete mode) into the file sink at ``JOB_OUT``."""

import os

from pyspark.sql import functions as F

import exactly
from exactly import CheckpointConfig, Job


def build(spark):
    rows = (spark.readStream.format("exactly.files")
            .schema("id long, key string, amount double")
            .option("format", "json")
            .load(os.environ["JOB_IN"]))
    totals = exactly.uid("totals", rows.groupBy("key").agg(F.count("*").alias("n"),
                                                           F.sum("amount").alias("total")))
    return Job(totals, sink_format="exactly.files", path=os.environ["JOB_OUT"],
               output_mode="complete", options={"format": "parquet"},
               checkpoint=CheckpointConfig(interval="500ms", state_backend="hashmap"))

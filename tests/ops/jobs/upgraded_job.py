"""The next version of ``datagen_job.py`` for ``exactly upgrade``: the same job, whose rows
carry ``version = 2``. While the file ``JOB_UPGRADE_FAIL_FILE`` exists it fails at its first
epoch, every time (a broken release: the upgrade rolls back to ``datagen_job.py``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from exactly import Job

_spec = importlib.util.spec_from_file_location("datagen_job", Path(__file__).with_name(
    "datagen_job.py"))
assert _spec is not None and _spec.loader is not None
datagen_job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(datagen_job)


def build(spark):
    job = datagen_job.build(spark)
    broken = os.environ.get("JOB_UPGRADE_FAIL_FILE")
    failing = bool(broken) and os.path.exists(str(broken))  # decided when it is built

    @pandas_udf("int")
    def version(ids: pd.Series) -> pd.Series:
        if failing:
            raise RuntimeError("injected failure of the new job version")
        return pd.Series([2] * len(ids), dtype="int32")

    return Job(job.df.withColumn("version", version(F.col("id"))),
               sink_format=job.sink_format, path=job.path, options=job.options,
               checkpoint=job.checkpoint)

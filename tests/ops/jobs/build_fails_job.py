"""A job file whose ``build(spark)`` raises: ``exactly.TransientError`` while the file
``$JOB_TRANSIENT_MARKER`` does not exist yet (it creates it: the first build only), then the
error of a job with a mistake in it (a column that does not exist)."""

from __future__ import annotations

import os
from pathlib import Path

from exactly import Job, TransientError


def build(spark):
    marker = Path(os.environ["JOB_TRANSIENT_MARKER"])
    if not marker.exists():
        marker.write_text("raised once\n")
        raise TransientError("the reference service is not up yet")
    events = spark.readStream.format("exactly.datagen").load()
    return Job(events.select("no_such_column"), sink_format="exactly.files",
               path=os.environ["JOB_OUT"])

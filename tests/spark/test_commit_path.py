"""Where an exactly sink's commit runs: through start_query always in the driver
(foreachBatch), whatever the environment says; through PySpark's own
``writeStream.format("exactly.files")`` in Spark's sink commit process (the data source
writer). Both write every row once. Real Spark, local[2]."""

from __future__ import annotations

import pyarrow.dataset as ds

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query

ROWS = 300


def _input(spark):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", ROWS).option("maxRowsPerTrigger", 100).load().select("id"))


def _ids(out) -> list[int]:
    return sorted(ds.dataset(str(out), format="parquet").to_table()["id"].to_pylist())


def test_start_query_commits_in_the_driver_and_pysparks_own_form_in_sparks_sink_runner(
        spark, tmp_path, monkeypatch):
    monkeypatch.setenv("EXACTLY_COMMIT_PATH", "sink-runner")  # a stray variable: no effect
    out = tmp_path / "driver"
    query = start_query(_input(spark), sink_format="exactly.files", path=str(out),
                        available_now=True,
                        checkpoint=CheckpointConfig(storage=str(tmp_path / "ck-driver"))).query
    query.awaitTermination()
    assert "ForeachBatchSink" in query.lastProgress["sink"]["description"]
    assert _ids(out) == list(range(ROWS))

    out = tmp_path / "datasource"
    native = (_input(spark).writeStream.format("exactly.files")
              .option("checkpointLocation", str(tmp_path / "ck-datasource"))
              .trigger(availableNow=True).start(str(out)))
    native.awaitTermination()
    assert "ForeachBatchSink" not in native.lastProgress["sink"]["description"]
    assert _ids(out) == list(range(ROWS))

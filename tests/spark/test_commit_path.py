"""Where start_query's commit runs: in the driver through foreachBatch by default, or in
Spark's sink commit process through the data source writer with EXACTLY_COMMIT_PATH=
sink-runner; both write every row once. Real Spark, local[2]."""

from __future__ import annotations

import re

import pyarrow.dataset as ds
import pytest

from exactly.config import CheckpointConfig
from exactly.errors import ConfigError
from exactly.spark.runner import COMMIT_PATH_ENV, start_query


def _run(spark, tmp_path, name: str) -> str:
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
          .option("totalRows", 300).option("maxRowsPerTrigger", 100).load().select("id"))
    out = tmp_path / name
    query = start_query(df, sink_format="exactly.files", path=str(out), available_now=True,
                        checkpoint=CheckpointConfig(storage=str(tmp_path / f"ck-{name}"))).query
    query.awaitTermination()
    ids = sorted(ds.dataset(str(out), format="parquet").to_table()["id"].to_pylist())
    assert ids == list(range(300))
    return query.lastProgress["sink"]["description"]


def test_the_commit_runs_in_the_driver_by_default_and_in_sparks_sink_runner_on_request(
        spark, tmp_path, monkeypatch):
    monkeypatch.delenv(COMMIT_PATH_ENV, raising=False)
    assert "ForeachBatchSink" in _run(spark, tmp_path, "driver")
    monkeypatch.setenv(COMMIT_PATH_ENV, "sink-runner")
    assert "ForeachBatchSink" not in _run(spark, tmp_path, "sink-runner")


def test_an_unknown_commit_path_fails_start_query_naming_the_values(spark, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv(COMMIT_PATH_ENV, "executor")
    df = spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0) \
        .option("totalRows", 10).load()
    with pytest.raises(ConfigError, match=re.escape(
            "EXACTLY_COMMIT_PATH='executor' is not one of driver | sink-runner")):
        start_query(df, sink_format="exactly.files", path=str(tmp_path / "out"),
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")))

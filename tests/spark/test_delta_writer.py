"""``writeStream.format("exactly.delta")`` without start_query: Spark's own data source
writer path (the commit in Spark's sink commit process), real Spark local[2]."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from exactly.connectors.delta.sink import app_id
from exactly.errors import ConfigError
from exactly.spark.formats import check_sink


def test_a_plain_writestream_query_writes_each_row_once_in_one_delta_commit_per_epoch(
        spark, tmp_path):
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
          .option("totalRows", 300).option("maxRowsPerTrigger", 100).load()
          .select("id", "key"))
    table = str(tmp_path / "table")
    query = (df.writeStream.format("exactly.delta")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .option("exactly.logDir", str(tmp_path / "ck" / "exactly-sink"))
             .trigger(availableNow=True).start(table))
    query.awaitTermination()
    delta = DeltaTable(table)
    assert sorted(delta.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == list(range(300))
    assert delta.transaction_version(app_id(query.id)) == 2
    assert delta.version() == 3  # the create, then epochs 0, 1 and 2


def test_a_misspelt_option_is_refused_before_the_query_starts():
    with pytest.raises(ConfigError, match="did you mean 'compression'"):
        check_sink("exactly.delta", "/tmp/t", {"compresion": "zstd"})

"""``writeStream.format("exactly.iceberg")``: Spark's own data source writer path on real
Spark local[2], the embedded SQLite catalog, plain and partitioned tables; and the errors a
user sees before the query starts."""

from __future__ import annotations

import pytest
from pyiceberg.catalog import load_catalog

from exactly.connectors.iceberg.snapshots import committed_epoch, epoch_of, main_line
from exactly.errors import ConfigError
from exactly.spark.formats import check_sink


def _stream(spark, rows: int, per_epoch: int):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("keys", 3)
            .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch).load()
            .select("id", "key", "event_time"))


def _catalog(warehouse):
    return load_catalog("exactly", type="sql", uri=f"sqlite:///{warehouse}/catalog.db",
                        warehouse=str(warehouse))


def test_a_plain_writestream_query_commits_one_snapshot_per_epoch_carrying_query_and_epoch(
        spark, tmp_path):
    warehouse = tmp_path / "lake"
    query = (_stream(spark, 300, 100).writeStream.format("exactly.iceberg")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .option("exactly.logDir", str(tmp_path / "ck" / "exactly-sink"))
             .option("warehouse", str(warehouse))
             .trigger(availableNow=True).start("db.events"))
    query.awaitTermination()
    table = _catalog(warehouse).load_table("db.events")
    ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert sorted(ids) == list(range(300))
    line = list(main_line(table))
    assert [(e.query_id, e.epoch) for e in reversed(line)] == [(query.id, n) for n in range(3)]
    assert committed_epoch(table, query.id) == 2
    assert all(epoch_of(e.snapshot)[0] == query.id for e in line)


def test_a_partitioned_table_gets_one_file_per_partition_and_task_and_reads_whole(
        spark, tmp_path):
    warehouse = tmp_path / "lake"
    query = (_stream(spark, 400, 200).writeStream.format("exactly.iceberg")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .option("exactly.logDir", str(tmp_path / "ck" / "exactly-sink"))
             .option("warehouse", str(warehouse)).option("table", "db.parts")
             .option("partitionBy", "key, day(event_time)")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    table = _catalog(warehouse).load_table("db.parts")
    assert [f.name for f in table.spec().fields] == ["key", "event_time_day"]
    everything = table.scan(selected_fields=("id", "key")).to_arrow()
    assert sorted(everything["id"].to_pylist()) == list(range(400))
    keys = sorted(set(everything["key"].to_pylist()))
    assert len(keys) == 3
    files = [t.file for t in table.scan().plan_files()]
    assert {f.partition[0] for f in files} == set(keys)
    assert all(f"/key={f.partition[0]}/event_time_day=" in f.file_path for f in files)
    assert len(files) <= 3 * 2 * 2  # per epoch: one file per key and write task
    pruned = table.scan(row_filter=f"key == '{keys[0]}'")
    assert {t.file.partition[0] for t in pruned.plan_files()} == {keys[0]}
    wanted = [i for i, k in zip(everything["id"].to_pylist(), everything["key"].to_pylist(),
                                strict=True) if k == keys[0]]
    assert sorted(pruned.to_arrow()["id"].to_pylist()) == sorted(wanted)


def test_a_table_of_other_columns_is_refused_naming_both_schemas(spark, tmp_path):
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    warehouse = tmp_path / "lake"
    warehouse.mkdir()
    catalog = _catalog(warehouse)
    catalog.create_namespace("db")
    catalog.create_table("db.other", schema=pa.schema([("id", pa.int64()),
                                                       ("name", pa.string())]))
    built = check_sink("exactly.iceberg", "db.other",
                       {"warehouse": str(warehouse), "exactly.logDir": str(tmp_path / "log")})
    assert built is not None
    schema = to_arrow_schema(_stream(spark, 1, 1).schema, timezone="UTC")
    with pytest.raises(ConfigError, match=r"has columns \(id long, name string\), the stream "
                                          r"writes \(id long.*key string"):
        built.sink.prepare_target(schema)  # what the query's writer does when it starts


@pytest.mark.parametrize("options,message", [
    ({"warehouse": "/tmp/x"}, "name the table"),
    ({"table": "events", "warehouse": "/tmp/x"}, "not a table name"),
    ({"table": "db.events"}, "no catalog"),
    ({"table": "db.events", "warehouse": "s3://bucket/lake"}, "embedded SQLite catalog"),
    ({"table": "db.events", "catalog.uri": "mysql://u@h/db"}, "not an SQLAlchemy URL"),
    ({"table": "db.events", "warehouse": "/tmp/x", "partitionBy": "dya(ts)"},
     "partitionBy term"),
    ({"table": "db.events", "warehouse": "/tmp/x", "warehose": "/tmp/y"},
     "did you mean 'warehouse'"),
])
def test_bad_options_are_refused_before_the_query_starts_naming_the_fix(options, message,
                                                                         tmp_path):
    with pytest.raises(ConfigError, match=message):
        check_sink("exactly.iceberg", None, {**options, "exactly.logDir": str(tmp_path / "log")})

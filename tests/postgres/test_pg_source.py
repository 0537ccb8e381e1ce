"""The replayable PostgreSQL table source, driven without Spark: offsets, epoch sizing, replay."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from exactly.connectors.postgres.source import PostgresTableStreamReader, table_schema
from exactly.errors import ConfigError


@pytest.fixture
def source(conn, table_name):
    conn.execute(f'CREATE TABLE "{table_name}" (id bigint PRIMARY KEY, "Key" text, '
                 'amount numeric(10,2), meta jsonb, at timestamptz)')
    conn.execute(f'INSERT INTO "{table_name}" SELECT g, \'k\' || (g % 3), g / 100.0, '
                 f'jsonb_build_object(\'g\', g), now() FROM generate_series(1, 1000) g')
    return table_name


def reader(pg, table, **extra) -> PostgresTableStreamReader:
    options = {"table": table, "keyColumn": "id", **extra}
    return PostgresTableStreamReader(pg.dsn, options, table_schema(pg.dsn, options))


def read_all(r: PostgresTableStreamReader, start: dict, end: dict) -> pa.Table:
    batches = [b for p in r.partitions(start, end) for b in r.read(p)]
    return pa.Table.from_batches(batches, schema=r.arrow_schema)


def test_schema_maps_types_and_reads_unmapped_types_as_text(pg, source):
    schema = table_schema(pg.dsn, {"table": source})
    assert [f.dataType.simpleString() for f in schema.fields] == [
        "bigint", "string", "decimal(10,2)", "string", "timestamp"]
    rows = read_all(reader(pg, source), {"key": None}, {"key": 2})
    assert rows.column("meta").to_pylist() == ['{"g": 1}', '{"g": 2}']


def test_epochs_are_bounded_and_replay_reads_the_same_rows(pg, conn, source):
    r = reader(pg, source, maxRowsPerTrigger="300", numPartitions="3")
    assert isinstance(r.getDefaultReadLimit(), ReadMaxRows)
    start = r.initialOffset()
    offsets = [start]
    while True:
        end = r.latestOffset(offsets[-1], r.getDefaultReadLimit())
        if end == offsets[-1]:
            break
        offsets.append(end)
    assert [o["key"] for o in offsets] == [None, 300, 600, 900, 1000]
    epoch1 = read_all(r, offsets[1], offsets[2])
    assert epoch1.column("id").to_pylist() == list(range(301, 601))
    conn.execute(f'INSERT INTO "{source}" (id) VALUES (1001)')  # new rows do not change it
    assert read_all(r, offsets[1], offsets[2]).equals(epoch1)
    assert r.latestOffset(offsets[-1], ReadAllAvailable()) == {"key": 1001}


def test_available_now_stops_at_the_rows_present_at_start(pg, conn, source):
    r = reader(pg, source)
    r.prepareForTriggerAvailableNow()
    conn.execute(f'INSERT INTO "{source}" (id) VALUES (5000)')
    assert r.latestOffset({"key": None}, ReadAllAvailable()) == {"key": 1000}


def test_a_key_column_that_is_not_an_integer_is_refused(pg, source):
    with pytest.raises(ConfigError, match="keyColumn 'Key' must be an integer"):
        table_schema(pg.dsn, {"table": source, "keyColumn": "Key"})

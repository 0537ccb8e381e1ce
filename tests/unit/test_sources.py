"""Source offsets and parsing, driven without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from exactly.connectors.datagen import DatagenStreamReader, generate
from exactly.connectors.files.source import FilesStreamReader
from exactly.errors import ConfigError, ExactlyError, MalformedRecordError

# the demo's event schema (exactly.demos.files_job.EVENT_SCHEMA), built without a SparkSession
EVENTS = StructType([StructField("id", LongType(), False), StructField("key", StringType()),
                     StructField("amount", DoubleType()),
                     StructField("event_time", TimestampType())])


def reader(directory: Path, **options) -> FilesStreamReader:
    return FilesStreamReader({"path": str(directory), "format": "json", **options}, EVENTS)


def test_files_are_taken_in_name_order_and_epochs_are_capped(events_dir):
    r = reader(events_dir, maxFilesPerTrigger="3")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"last": "events-00002.jsonl", "count": 3}
    assert [Path(p.path).name for p in r.partitions(start, end)] == [
        "events-00000.jsonl", "events-00001.jsonl", "events-00002.jsonl"]
    assert r.latestOffset(end, ReadAllAvailable())["count"] == 8


def test_a_file_added_out_of_order_fails_instead_of_changing_a_replayed_epoch(events_dir):
    r = reader(events_dir)
    end = r.latestOffset(r.initialOffset(), ReadMaxFiles(4))
    (events_dir / "events-00001a.jsonl").write_text('{"id": 99999}\n')
    with pytest.raises(ExactlyError, match="sorts before files already read"):
        r.latestOffset(end, ReadAllAvailable())


def test_a_malformed_row_fails_naming_the_file_and_line(events_dir):
    bad = events_dir / "events-00003.jsonl"
    lines = bad.read_text().splitlines()[:60]  # rows past the bad one cost time, prove nothing
    lines[41] = '{"id": "not-a-number", "key": "k"}'
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedRecordError, match=r"events-00003.jsonl at line 42"):
        list(reader(events_dir).read(reader(events_dir).partitions(
            {"last": "events-00002.jsonl", "count": 3},
            {"last": "events-00003.jsonl", "count": 4})[0]))


def test_malformed_rows_go_to_the_dead_letter_location_with_their_reason(events_dir, tmp_path):
    bad = events_dir / "events-00000.jsonl"
    lines = bad.read_text().splitlines()[:60]  # a file with bad rows is parsed row by row
    lines[0] = "{not json"
    lines[1] = '{"key": "no id"}'
    bad.write_text("\n".join(lines) + "\n")
    dlq = tmp_path / "dlq"
    r = reader(events_dir, deadLetterPath=str(dlq))
    part = r.partitions({"last": "", "count": 0}, {"last": "events-00000.jsonl", "count": 1})[0]
    rows = sum(b.num_rows for b in r.read(part))
    assert rows == len(lines) - 2
    letters = [json.loads(x) for x in (dlq / "events-00000.jsonl.jsonl").read_text().splitlines()]
    assert [(d["line"], d["reason"].split(" ")[0]) for d in letters] == [(1, "not"),
                                                                        (2, "required")]
    # a replay rewrites the same dead letters: each malformed row is recorded once
    sum(b.num_rows for b in r.read(part))
    assert len((dlq / "events-00000.jsonl.jsonl").read_text().splitlines()) == 2


def test_datagen_rows_are_a_pure_function_of_the_offset():
    assert generate(10, 20, 5, 3).equals(generate(10, 20, 5, 3))
    r = DatagenStreamReader({"rowsPerSecond": "0", "totalRows": "1000", "numPartitions": "3"})
    end = r.latestOffset(r.initialOffset(), ReadMaxRows(250))
    assert end == {"rows": 250}
    ids = [i for p in r.partitions({"rows": 0}, end) for b in r.read(p)
           for i in b.column("id").to_pylist()]
    assert ids == list(range(250))


def test_datagen_rejects_bad_options():
    with pytest.raises(ConfigError, match="needs totalRows"):
        DatagenStreamReader({"rowsPerSecond": "0"})
    with pytest.raises(ConfigError, match="not a whole number"):
        DatagenStreamReader({"totalRows": "lots"})

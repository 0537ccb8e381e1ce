"""exactly's sources ask the admission file before every epoch (driven without Spark: the
readers' ``latestOffset`` reads the file named by ``_EXACTLY_ADMISSION_FILE`` on each call)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows
from pyspark.sql.types import LongType, StructField, StructType

from exactly.connectors.admission import ADMISSION_FILE_ENV, Admission
from exactly.connectors.datagen import DatagenStreamReader, generate
from exactly.connectors.files.source import FilesStreamReader
from exactly.fsutil import atomic_write_json


@pytest.fixture
def admit(tmp_path, monkeypatch):
    """``admit(**fields)`` writes the admission file the sources read."""
    path = tmp_path / "admission.json"
    monkeypatch.setenv(ADMISSION_FILE_ENV, str(path))

    def write(**fields) -> None:
        atomic_write_json(path, Admission(**fields).to_json())
    return write


def completed_epoch(checkpoint: Path, epoch: int, seconds_ago: float) -> None:
    """A ``commits/N`` entry written ``seconds_ago``."""
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    entry = checkpoint / "commits" / str(epoch)
    entry.write_text("v1\n{}")
    stamp = entry.stat().st_mtime - seconds_ago
    os.utime(entry, (stamp, stamp))


def datagen(**options) -> DatagenStreamReader:
    return DatagenStreamReader({"rowsPerSecond": "0", "totalRows": "10000", **options})


def test_datagen_takes_the_smaller_of_the_budget_and_its_own_limit(admit):
    admit(max_rows=300)
    assert datagen().latestOffset({"rows": 0}, ReadAllAvailable()) == {"rows": 300}
    assert datagen().latestOffset({"rows": 100}, ReadMaxRows(50)) == {"rows": 150}
    assert datagen().latestOffset({"rows": 9900}, ReadAllAvailable()) == {"rows": 10000}


def test_without_an_admission_file_sources_read_as_spark_alone_would(admit, tmp_path):
    assert datagen().latestOffset({"rows": 0}, ReadAllAvailable()) == {"rows": 10000}
    (tmp_path / "admission.json").write_text("{torn")  # unreadable: open, never stuck
    assert datagen().latestOffset({"rows": 0}, ReadAllAvailable()) == {"rows": 10000}


def test_no_epoch_starts_during_the_min_pause_or_while_closed(admit, tmp_path):
    checkpoint = tmp_path / "ck"
    completed_epoch(checkpoint, 4, seconds_ago=1.0)
    start = {"rows": 500}
    admit(checkpoint=str(checkpoint), min_pause_s=60.0)
    assert datagen().latestOffset(start, ReadAllAvailable()) == start
    admit(checkpoint=str(checkpoint), min_pause_s=0.5)
    assert datagen().latestOffset(start, ReadAllAvailable()) == {"rows": 10000}
    admit(closed=True)
    assert datagen().latestOffset(start, ReadAllAvailable()) == start


def test_an_available_now_drain_ignores_pause_and_close_but_keeps_the_budget(admit, tmp_path):
    checkpoint = tmp_path / "ck"
    completed_epoch(checkpoint, 0, seconds_ago=0.0)
    admit(checkpoint=str(checkpoint), min_pause_s=60.0, max_rows=400, closed=True)
    reader = datagen()
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset({"rows": 0}, ReadAllAvailable()) == {"rows": 400}


# -- files ---------------------------------------------------------------------------------
SCHEMA = StructType([StructField("id", LongType())])


def write_parquet(directory: Path, sizes: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, size in enumerate(sizes):
        pq.write_table(generate(start, start + size, 10, 0).select(["id"]),
                       directory / f"part-{i:03d}.parquet")
        start += size


def files(directory: Path, fmt: str = "parquet", **options) -> FilesStreamReader:
    return FilesStreamReader({"path": str(directory), "format": fmt, **options}, SCHEMA)


def test_files_are_taken_while_their_rows_fit_the_budget(admit, tmp_path):
    write_parquet(tmp_path / "in", [100, 200, 300, 400])
    admit(max_rows=650)
    start = {"last": "", "count": 0}
    end = files(tmp_path / "in").latestOffset(start, ReadAllAvailable())
    assert end == {"last": "part-002.parquet", "count": 3}  # 100 + 200 + 300 <= 650
    assert files(tmp_path / "in").latestOffset(end, ReadAllAvailable())["count"] == 4
    assert files(tmp_path / "in").latestOffset(start, ReadMaxFiles(2))["count"] == 2


def test_a_file_bigger_than_the_budget_is_an_epoch_of_its_own(admit, tmp_path):
    write_parquet(tmp_path / "in", [1000, 10])
    admit(max_rows=50)
    reader = files(tmp_path / "in")
    first = reader.latestOffset({"last": "", "count": 0}, ReadAllAvailable())
    assert first == {"last": "part-000.parquet", "count": 1}
    assert reader.latestOffset(first, ReadAllAvailable())["count"] == 2


def test_json_lines_files_are_sized_by_their_lines_and_the_count_is_cached(admit, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "a.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(30)))
    (directory / "b.jsonl").write_text('{"id": 30}\n{"id": 31}')  # no newline at the end
    (directory / "c.jsonl").write_text('{"id": 32}\n')
    admit(max_rows=32)
    reader = files(directory, "json")
    assert [reader.file_rows(n) for n in ("a.jsonl", "b.jsonl", "c.jsonl")] == [30, 2, 1]
    assert reader.latestOffset({"last": "", "count": 0}, ReadAllAvailable())["count"] == 2
    (directory / "a.jsonl").unlink()  # counted once per name: not read again
    assert reader.file_rows("a.jsonl") == 30

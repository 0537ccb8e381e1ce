import json
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactly.audit import audit_ids, json_ids, sqlite_table_ids, verify


def write_ids(directory: Path, name: str, ids: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids}), directory / name)


def test_a_perfect_copy_passes(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", list(range(100)))
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", list(range(100)))
    assert verify(tmp_path / "in", tmp_path / "out").ok


def test_missing_duplicated_and_unexpected_ids_are_each_reported(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", list(range(10)))
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", [0, 1, 2, 2, 3, 4, 5, 6, 7, 42])
    report = verify(tmp_path / "in", tmp_path / "out")
    assert not report.ok
    assert report.missing.tolist() == [8, 9]
    assert report.duplicated.tolist() == [2]
    assert report.unexpected.tolist() == [42]
    assert report.duplicate_extra_rows == 1


def test_staging_and_log_directories_are_not_output(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", [1, 2])
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", [1, 2])
    write_ids(tmp_path / "out" / "_staging" / "1", "part.parquet", [1, 2])
    assert verify(tmp_path / "in", tmp_path / "out").ok


def test_audit_ids_is_the_same_comparison_for_ids_from_anywhere():
    report = audit_ids(np.array([0, 1, 2, 2, 2, 3, 42]), np.array([0, 1, 2, 3, 4, 4]))
    assert not report.ok
    assert (report.expected, report.found_rows) == (5, 7)
    assert report.missing.tolist() == [4]
    assert report.duplicated.tolist() == [2]
    assert report.duplicate_extra_rows == 2
    assert report.unexpected.tolist() == [42]
    assert report.input_duplicates == 1
    assert audit_ids(np.arange(5)[::-1], np.arange(5)).ok
    assert audit_ids(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).ok


def test_verify_counts_input_rows_without_a_readable_id(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"id": 1}\n{"id": "x"}\nnot json\n{"id": 2}\n')
    write_ids(tmp_path / "out", "p.parquet", [1, 2])
    report = verify(tmp_path / "in", tmp_path / "out")
    assert report.ok
    assert report.malformed_input_rows == 2
    assert report.to_json()["malformed_input_rows"] == 2


def test_table_and_json_readers_feed_the_same_audit(tmp_path):
    db = tmp_path / "sink.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute('CREATE TABLE "events" (id INTEGER, v TEXT)')
        conn.executemany('INSERT INTO "events" VALUES (?, ?)', [(i, "x") for i in [0, 1, 1, 2]])
        conn.commit()
    from_table = sqlite_table_ids(db, "events")
    assert sorted(from_table.tolist()) == [0, 1, 1, 2]
    values = [json.dumps({"id": i, "key": "k"}).encode() for i in [0, 1, 1, 2]] + [None]
    from_topic = json_ids(values)
    for found in (from_table, from_topic):
        report = audit_ids(found, np.arange(3))
        assert report.duplicated.tolist() == [1] and not report.missing.size

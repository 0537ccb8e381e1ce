import json
import sqlite3
from contextlib import closing

import numpy as np

from exactly.audit import audit_ids, json_ids, sqlite_table_ids


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

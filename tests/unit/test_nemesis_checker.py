"""The nemesis checker names each anomaly kind from hand-built histories (no servers).

Each history below is written out by hand as readers would have recorded it: rows are
``(id, epoch, key, value)``. A case asserts the exact set of kinds found, so a checker that
names the wrong kind, or names extra ones, fails too.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactly.auditor import verify
from exactly.testing.nemesis.checker import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Anomaly,
    History,
    check,
)

RC, RU = READ_COMMITTED, READ_UNCOMMITTED
#: two epochs of two ids each: what the job's final output holds when all is well
FINAL = [(1, 0), (2, 0), (3, 1), (4, 1)]
EXPECTED = {1, 2, 3, 4}


def kinds(report) -> set[Anomaly]:
    return {kind for kind, count in report.counts.items() if count}


def test_a_clean_history_has_no_anomaly_and_uncommitted_reads_are_only_counted():
    h = History()
    # a file-sink reader: nothing, epoch 0 whole, epochs 0 and 1 whole
    h.snapshot("files", RC, [])
    h.snapshot("files", RC, [(1, 0), (2, 0)])
    h.snapshot("files", RC, [(1, 0), (2, 0)])  # unchanged: a poll, not a new observation
    h.snapshot("files", RC, FINAL)
    # the plain table of the PostgreSQL 2PC sink: part of epoch 1 is allowed there
    h.snapshot("pg-table", RC, [(1, 0), (2, 0), (3, 1)])
    h.snapshot("pg-table", RC, FINAL)
    # Kafka: records carry no epoch; read_committed sees each once
    h.seen("kafka-rc", RC, [(2,), (1,)])
    h.seen("kafka-rc", RC, [(3,), (4,)])
    # read_uncommitted also saw an aborted transaction: id 3 and 9 (never committed)
    h.seen("kafka-ru", RU, [(1,), (2,), (3,), (9,)])
    h.seen("kafka-ru", RU, [(3,), (4,)])
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL,
                   whole_epochs={"files", "kafka-rc"}, epoch_of={1: 0, 2: 0, 3: 1, 4: 1})
    assert report.ok, report.render()
    assert kinds(report) == set()
    assert report.stats["uncommitted reads seen"] == 2  # the second 3, and 9
    assert report.stats["polls"] == 10 and report.stats["observations"] == 9
    assert json.loads(json.dumps(report.as_dict()))["ok"] is True
    assert "verdict: no anomaly" in report.render()


def test_an_input_id_missing_from_the_final_output_is_a_lost_write():
    h = History()
    h.snapshot("files", RC, [(1, 0), (2, 0)])
    report = check(h, expected_ids=EXPECTED, final_rows=[(1, 0), (2, 0), (3, 1)],
                   whole_epochs=False)
    assert kinds(report) == {Anomaly.LOST_WRITE}
    assert report.counts[Anomaly.LOST_WRITE] == 1
    assert "id 4" in report.anomalies[Anomaly.LOST_WRITE][0]


@pytest.mark.parametrize("where", ["final", "snapshot", "stream"])
def test_an_id_twice_in_the_final_output_a_snapshot_or_a_committed_stream_is_a_duplicate(
        where):
    h = History()
    final = [*FINAL, (3, 1)] if where == "final" else FINAL
    if where == "snapshot":
        h.snapshot("pg-table", RC, [(1, 0), (2, 0), (2, 0)])
    if where == "stream":
        h.seen("kafka-rc", RC, [(1,), (2,)])
        h.seen("kafka-rc", RC, [(2,), (3,), (4,)])  # epoch 0's id 2 again: a replay
    report = check(h, expected_ids=EXPECTED, final_rows=final, whole_epochs=False)
    assert kinds(report) == {Anomaly.DUPLICATE}
    assert report.counts[Anomaly.DUPLICATE] == 1


def test_an_id_twice_in_a_read_uncommitted_stream_is_no_duplicate():
    h = History()
    h.seen("kafka-ru", RU, [(1,), (2,), (1,), (2,), (3,), (4,)])
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False)
    assert report.ok and report.stats["uncommitted reads seen"] == 2


def test_a_committed_read_of_a_record_the_final_output_lacks_is_an_aborted_read():
    h = History()
    h.seen("kafka-rc", RC, [(1,), (2,), (7,)])  # 7: a transaction that was aborted
    h.seen("kafka-rc", RC, [(3,), (4,)])
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False)
    assert kinds(report) == {Anomaly.ABORTED_READ}
    assert "kafka-rc: id 7" in report.anomalies[Anomaly.ABORTED_READ][0]


def test_the_same_record_read_uncommitted_is_counted_not_an_anomaly():
    h = History()
    h.seen("kafka-ru", RU, [(1,), (2,), (7,), (3,), (4,)])
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False)
    assert report.ok and report.stats["uncommitted reads seen"] == 1


def test_part_of_an_epoch_seen_by_a_reader_of_a_whole_epoch_sink_is_a_torn_epoch():
    h = History()
    h.snapshot("pg-view", RC, [(1, 0), (2, 0), (3, 1)])  # epoch 1 without id 4
    h.snapshot("pg-view", RC, FINAL)
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=True)
    assert kinds(report) == {Anomaly.TORN_EPOCH}
    assert "1 of epoch 1's 2 ids" in report.anomalies[Anomaly.TORN_EPOCH][0]
    # the same reads of a sink that does not promise whole epochs (the plain 2PC table)
    assert check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False).ok


def test_a_stream_that_ends_with_part_of_an_epoch_is_torn_by_the_inputs_assignment():
    h = History()
    h.seen("kafka-rc", RC, [(1,), (2,), (3,)])  # records carry no epoch
    final = [(1,), (2,), (3,), (4,)]  # neither does the final read of the topic
    report = check(h, expected_ids=EXPECTED, final_rows=final, whole_epochs=True,
                   epoch_of={1: 0, 2: 0, 3: 1, 4: 1})
    assert kinds(report) == {Anomaly.TORN_EPOCH}


def test_a_target_of_whole_shares_may_show_one_share_of_an_epoch_never_part_of_one():
    """Kafka with publishShares: epoch 1 is ids 3, 4 (share 0) and 5, 6 (share 1)."""
    epoch_of, share_of = {1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1}, {1: 0, 2: 1, 3: 0, 4: 0,
                                                                  5: 1, 6: 1}
    final = [(i,) for i in range(1, 7)]
    h = History()
    h.snapshot("kafka-rc", RC, [(1,), (2,), (3,), (4,)])  # share 0 of epoch 1 alone
    h.snapshot("kafka-rc", RC, final)
    whole_shares = check(h, expected_ids=set(range(1, 7)), final_rows=final,
                         whole_epochs=True, epoch_of=epoch_of, share_of=share_of)
    assert whole_shares.ok, whole_shares.render()
    # the same reads of a target that promises whole epochs: epoch 1 was torn
    assert kinds(check(h, expected_ids=set(range(1, 7)), final_rows=final,
                       whole_epochs=True, epoch_of=epoch_of)) == {Anomaly.TORN_EPOCH}
    # part of a share is torn under either promise
    h = History()
    h.snapshot("kafka-rc", RC, [(1,), (2,), (3,), (4,), (5,)])
    h.snapshot("kafka-rc", RC, final)
    report = check(h, expected_ids=set(range(1, 7)), final_rows=final, whole_epochs=True,
                   epoch_of=epoch_of, share_of=share_of)
    assert kinds(report) == {Anomaly.TORN_EPOCH}
    assert "1 of epoch 1 share 1's 2 ids" in report.anomalies[Anomaly.TORN_EPOCH][0]


def test_a_key_seen_at_a_newer_epoch_then_an_older_one_is_a_value_moved_back():
    final = [("a", 2, "a", 20), ("b", 1, "b", 10)]
    h = History()
    h.snapshot("upsert", RC, [("a", 1, "a", 10), ("b", 1, "b", 10)])
    h.snapshot("upsert", RC, [("a", 2, "a", 20), ("b", 1, "b", 10)])
    h.snapshot("upsert", RC, [("a", 1, "a", 10), ("b", 1, "b", 10)])  # a went back
    h.snapshot("upsert", RC, final)
    report = check(h, expected_ids={"a", "b"}, final_rows=final, whole_epochs=False,
                   upsert=True)
    assert kinds(report) == {Anomaly.VALUE_MOVED_BACK}
    assert "key a at epoch 2" in report.anomalies[Anomaly.VALUE_MOVED_BACK][0]


def test_a_final_value_older_than_one_a_reader_saw_is_a_value_moved_back():
    h = History()
    h.snapshot("upsert", RC, [("a", 3, "a", 30)])
    report = check(h, expected_ids={"a"}, final_rows=[("a", 2, "a", 20)],
                   whole_epochs=False, upsert=True)
    assert kinds(report) == {Anomaly.VALUE_MOVED_BACK}
    # without upsert=True the same id under epochs 3 and 2 is a record in the wrong epoch
    plain = check(h, expected_ids={"a"}, final_rows=[("a", 2, "a", 20)], whole_epochs=False)
    assert kinds(plain) == {Anomaly.WRONG_EPOCH}


def test_an_id_committed_under_an_epoch_the_input_did_not_assign_is_a_wrong_epoch():
    # an ambiguous commit resolved badly: epoch 1's data published under epoch 0's number
    final = [(1, 0), (2, 0), (3, 0), (4, 0)]
    report = check(History(), expected_ids=EXPECTED, final_rows=final, whole_epochs=True,
                   epoch_of={1: 0, 2: 0, 3: 1, 4: 1})
    assert kinds(report) == {Anomaly.WRONG_EPOCH}
    assert report.counts[Anomaly.WRONG_EPOCH] == 2  # ids 3 and 4


def test_an_id_seen_under_one_epoch_and_committed_under_another_is_a_wrong_epoch():
    h = History()
    h.snapshot("files", RC, [(1, 0), (2, 0), (3, 1), (4, 1)])
    final = [(1, 0), (2, 0), (3, 2), (4, 2)]  # epoch 1 became epoch 2
    report = check(h, expected_ids=EXPECTED, final_rows=final, whole_epochs=False)
    assert kinds(report) == {Anomaly.WRONG_EPOCH}
    assert "seen under epochs [1, 2]" in report.anomalies[Anomaly.WRONG_EPOCH][0]


def test_an_epoch_read_torn_then_whole_is_torn_only_and_allowed_without_the_promise():
    h = History()
    h.snapshot("files", RC, [(1, 0), (2, 0), (3, 1)])
    h.snapshot("files", RC, FINAL)
    assert check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False).ok
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=True)
    assert kinds(report) == {Anomaly.TORN_EPOCH}  # not also "epoch 1 changed"


def test_a_whole_epoch_seen_with_other_ids_later_is_a_wrong_epoch():
    h = History()
    h.snapshot("files", RC, [(1, 0), (2, 0)])
    h.snapshot("files", RC, [(1, 0), (2, 0), (9, 0)])  # epoch 0 gained an id once whole
    final = [(1, 0), (2, 0)]
    report = check(h, expected_ids={1, 2}, final_rows=final, whole_epochs=True)
    assert kinds(report) == {Anomaly.WRONG_EPOCH, Anomaly.ABORTED_READ}
    assert "epoch 0 held {1, 2}" in report.anomalies[Anomaly.WRONG_EPOCH][0]


def test_a_committed_record_gone_from_a_later_snapshot_has_vanished():
    h = History()
    h.snapshot("pg-table", RC, [(1, 0), (2, 0)])
    h.snapshot("pg-table", RC, [(1, 0)])  # 2 gone ...
    h.snapshot("pg-table", RC, FINAL)  # ... and back: the final state alone shows nothing
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False)
    assert kinds(report) == {Anomaly.VANISHED}
    assert report.anomalies[Anomaly.VANISHED] == ["pg-table: id 2 seen in snapshot #0, gone in #1"]


def test_a_progress_record_off_the_commits_read_with_it_or_going_back_is_an_epoch_record():
    """An Iceberg table's ``exactly.epoch.<query>``: read with the snapshots it describes, it
    must name their newest epoch of the query, and never go back; repeated reads are kept
    once."""
    h = History()
    h.snapshot("iceberg", RC, FINAL)
    h.epoch_record("iceberg", "q", 0, 0, at="snapshot 1")
    h.epoch_record("iceberg", "q", 0, 0, at="snapshot 1")  # the same read again: not kept
    h.epoch_record("iceberg", "q", 1, 1, at="snapshot 2")
    assert check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=True).ok
    assert len(h.epoch_records()) == 2
    h.epoch_record("iceberg", "q", 2, 1, at="snapshot 3")  # ahead of the table's snapshots
    h.epoch_record("iceberg", "q", 0, 0, at="snapshot 4")  # back from 2
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=True)
    assert kinds(report) == {Anomaly.EPOCH_RECORD}
    assert report.counts[Anomaly.EPOCH_RECORD] == 2
    ahead, back = report.anomalies[Anomaly.EPOCH_RECORD]
    assert "records epoch 2 of query q as its newest, its commits' newest is 1" in ahead
    assert "went back from epoch 2 to 0 (snapshot 4)" in back


def test_an_id_the_input_never_held_in_the_final_output_is_unexpected():
    report = check(History(), expected_ids=EXPECTED, final_rows=[*FINAL, (5, 1)],
                   whole_epochs=False)
    assert kinds(report) == {Anomaly.UNEXPECTED}


def test_counts_are_exact_and_examples_capped():
    report = check(History(), expected_ids=set(range(100)), final_rows=[(0, 0)],
                   whole_epochs=False, examples=3)
    assert report.counts[Anomaly.LOST_WRITE] == 99
    assert len(report.anomalies[Anomaly.LOST_WRITE]) == 3
    table = report.render()
    assert "lost write" in table and "99" in table and "verdict: ANOMALIES" in table
    assert json.loads(json.dumps(report.as_dict()))["anomalies"]["lost write"]["count"] == 99


def test_the_final_audit_comes_from_exactly_verify_when_given(tmp_path):
    source = tmp_path / "input"
    source.mkdir()
    (source / "events.jsonl").write_text("".join(json.dumps({"id": i}) + "\n"
                                                 for i in range(1, 5)))
    out = tmp_path / "out"
    for epoch, ids in ((0, [1, 2]), (1, [3, 3])):  # 4 lost, 3 twice
        (out / f"epoch-{epoch:012d}").mkdir(parents=True)
        pq.write_table(pa.table({"id": ids}), out / f"epoch-{epoch:012d}" / "part-00000.parquet")
    audit = verify(source, out)
    final = [(1, 0), (2, 0), (3, 1), (3, 1)]
    report = check(History(), expected_ids=EXPECTED, final_rows=final, whole_epochs=True,
                   audit=audit)
    assert kinds(report) == {Anomaly.LOST_WRITE, Anomaly.DUPLICATE}
    assert report.counts[Anomaly.LOST_WRITE] == 1 and report.counts[Anomaly.DUPLICATE] == 1
    assert "missing in" in report.anomalies[Anomaly.LOST_WRITE][0]


def test_a_reader_error_is_reported_not_counted_as_an_anomaly():
    h = History()
    h.error("pg-table", ConnectionError("server paused"))
    report = check(h, expected_ids=EXPECTED, final_rows=FINAL, whole_epochs=False)
    assert report.ok and report.stats["reader errors"] == 1
    assert report.reader_errors == {"pg-table": ["ConnectionError: server paused"]}

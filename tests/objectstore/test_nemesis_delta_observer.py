"""The Delta observer against a table on S3 (S3Proxy): each version read once, each row with
the epoch of the application transaction that committed its file."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from exactly.testing.nemesis.checker import History, Row, check
from exactly.testing.nemesis.observers import DeltaObserver
from exactly.testing.waits import wait_until


def test_the_delta_observer_reads_each_version_with_the_epoch_of_its_txn(s3_server, s3_bucket):
    uri = f"s3://{s3_bucket}/events"
    options = s3_server.storage_options()
    history = History()

    def commit(ids: list[int], epoch: int | None) -> None:
        txns = [Transaction("exactly-q1", epoch)] if epoch is not None else []
        write_deltalake(uri, pa.table({"id": pa.array(ids, pa.int64())}), mode="append",
                        storage_options=options,
                        commit_properties=CommitProperties(app_transactions=txns))

    commit([1, 2], 0)  # before the observer starts: found through the log's history
    with DeltaObserver(history, uri, storage_options=options, poll_seconds=0.05):
        wait_until(lambda: history.last("delta"), "version 0 seen", timeout=10, poll=0.05)
        commit([3, 4], 1)
        commit([5], None)  # another writer's commit: no epoch
    versions = [o.at for o in history.observations()]
    assert versions == ["version 0", "version 1", "version 2"]
    assert sorted(history.last("delta"), key=lambda r: r.id) == [
        Row(1, 0), Row(2, 0), Row(3, 1), Row(4, 1), Row(5, None)]
    report = check(history, expected_ids={1, 2, 3, 4, 5}, final_rows=history.last("delta"),
                   whole_epochs=True)
    assert report.ok, report.render()
    assert not history.errors

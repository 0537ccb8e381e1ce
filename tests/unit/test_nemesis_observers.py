"""The file sink's observer (no server): it sees published epoch directories whole, each row
with its directory's epoch, and records an unreadable file as an error without dying."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.testing.nemesis.checker import History, Row, check
from exactly.testing.nemesis.observers import FileOutputObserver
from exactly.testing.waits import wait_until


def publish(out, epoch: int, ids: list[int]) -> None:
    """What the file sink's publish does: a complete directory renamed into place."""
    staged = out / f"_publish-{epoch}"
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"id": ids}), staged / "part-00000.parquet")
    staged.rename(out / f"epoch-{epoch:012d}")


def test_the_file_observer_sees_each_published_epoch_with_its_number(tmp_path):
    out = tmp_path / "out"
    history = History()
    with FileOutputObserver(history, out, poll_seconds=0.02):
        publish(out, 0, [1, 2])
        wait_until(lambda: history.last("files"), "epoch 0 seen", timeout=10, poll=0.02)
        (out / "_staging").mkdir()  # the sink's own files: never read
        (out / "_staging" / "junk.parquet").write_bytes(b"not parquet")
        publish(out, 1, [3, 4])
    assert history.last("files") == (Row(1, 0), Row(2, 0), Row(3, 1), Row(4, 1))
    assert (Row(1, 0), Row(2, 0)) in [o.rows for o in history.observations()]
    report = check(history, expected_ids={1, 2, 3, 4}, final_rows=history.last("files"),
                   whole_epochs=True, epoch_of={1: 0, 2: 0, 3: 1, 4: 1})
    assert report.ok, report.render()
    assert not history.errors


def test_an_unreadable_published_file_is_recorded_and_the_observer_reads_on(tmp_path):
    out = tmp_path / "out"
    (out / "epoch-000000000000").mkdir(parents=True)
    (out / "epoch-000000000000" / "part-00000.parquet").write_bytes(b"torn")
    history = History()
    with FileOutputObserver(history, out, poll_seconds=0.02):
        wait_until(lambda: history.error_counts["files"] >= 2, "two failed polls", timeout=10,
                   poll=0.02)
        pq.write_table(pa.table({"id": [1]}), out / "epoch-000000000000" / "part-00000.parquet")
    assert history.last("files") == (Row(1, 0),)
    assert "ArrowInvalid" in history.errors["files"][0]


def test_a_postgres_observer_whose_server_is_unreachable_records_errors_and_stops_cleanly():
    from exactly.testing.nemesis.observers import PostgresObserver
    from exactly.testing.ports import free_port

    history = History()
    dsn = f"postgresql://nobody:secret@127.0.0.1:{free_port()}/db"  # nothing listens there
    observer = PostgresObserver(history, dsn, "t", name="pg", poll_seconds=0.02)
    with observer:
        wait_until(lambda: history.error_counts["pg"] >= 2, "two failed polls", timeout=10,
                   poll=0.02)
    assert not observer._thread.is_alive()
    assert history.last("pg") is None
    assert "connecting to PostgreSQL" in history.errors["pg"][0]
    assert "secret" not in " ".join(history.errors["pg"])

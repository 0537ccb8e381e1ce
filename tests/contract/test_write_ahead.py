"""Write-ahead sinks (SQLite, PostgreSQL): the flaw the seeds note in Flink's
GenericWriteAheadSink does not exist here.

There the rows are committed to the database and *then* the checkpoint records that they
were, so a crash between the two sends the epoch again and duplicates it. Here the marker
of the epoch commits in the same database transaction as its rows.
"""

from __future__ import annotations

from sink_cases import ids, over_sinks

from exactly.protocol.faults import SimulatedCrash

AFTER_LOAD = "wal.after_load"  # no protocol point: raised by the patched clean-up below


@over_sinks(among=("sqlite_wal", "pg_wal"))
def test_killed_after_the_load_before_its_staged_rows_are_removed_nothing_loads_twice(
        case, monkeypatch):
    h = case.harness()
    handles = h.tasks(0, case.rows(0))

    def killed(handle):  # the load committed (rows + marker); the driver dies right after
        raise SimulatedCrash(AFTER_LOAD, handle.epoch)

    monkeypatch.setattr(h.sink.stage, "discard", killed)
    with h.crash_at(AFTER_LOAD, epoch=0):
        h.commit(0, handles)
    assert h.visible() == ids(0)  # loaded ...
    assert len(h.pre_commits()) == 2  # ... its staged rows still there, no completion
    assert h.completion(0) is None

    h.restart()  # recovery finishes the intent: the marker makes its load a no-op
    h.commit(0, h.tasks(0, case.rows(0)))
    assert h.visible() == ids(0)
    assert h.pre_commits() == []
    assert not list((h.sink.log_directory / "wal").glob("*/*"))

"""Compaction while the Delta sink's job is killed -9 and restarted: the demo pipeline
(``exactly pipeline --sink delta``) runs under the crash harness while this process compacts
the table every half second (``compact_delta``, newest epochs included). Every epoch commit
succeeds (the job only dies by its armed faults), every id is there once, every version
holds whole epochs and a compaction's version reads as the one before it, and the only files
on disk the newest version does not name are the ones compactions removed (kept for time
travel until VACUUM)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_delta_chaos import DECIDING_POINTS, EPOCH_ROWS, PollingReader, table_ids, whole_epochs

from exactly.connectors.delta.compaction import CompactionError, CompactionResult, compact_delta
from exactly.connectors.delta.sink import COMPACTION_KEY, data_file
from exactly.demos.files import write_events
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import python_command, run_with_crashes
from exactly.testing.delta_output import leftovers

pytestmark = pytest.mark.chaos
EPOCHS = 8


class Compactor(threading.Thread):
    """Calls ``compact_delta`` every ``every`` seconds until stopped; keeps the results and
    any error (a pass that lost every race is recorded, not an error of the test)."""

    def __init__(self, uri: str, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.uri, self.every = uri, every
        self.stop = threading.Event()
        self.results: list[CompactionResult] = []
        self.lost: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.every):
            if not DeltaTable.is_deltatable(self.uri):
                continue
            try:
                self.results.append(compact_delta(self.uri, keep_newest_epochs=0))
            except CompactionError as exc:
                self.lost.append(str(exc))
            except Exception as exc:  # asserted empty
                self.errors.append(repr(exc))


def commits(uri: str, newest: int) -> list[list[dict]]:
    """The actions of every commit file, by version."""
    log = Path(uri) / "_delta_log"
    return [[json.loads(line) for line in (log / f"{v:020d}.json").read_text().splitlines()
             if line.strip()] for v in range(newest + 1)]


# CI budget: one Spark driver per attempt (4 starts, ~40 s); the contract tests
# (tests/contract/test_delta_compaction.py) prove each race in process, in the fast lane
@pytest.mark.slow
def test_compaction_every_half_second_while_the_delta_job_is_killed_changes_no_epoch(tmp_path):
    uri = str(tmp_path / "table")
    events = tmp_path / "input"
    write_events(events, EPOCHS * EPOCH_ROWS, 2 * EPOCHS, seed=11)
    command = python_command("pipeline", "--sink", "delta", "--input", str(events),
                             "--output", uri, "--checkpoint", str(tmp_path / "ck"),
                             "--max-files-per-epoch", "2")
    points = [*DECIDING_POINTS, FaultSpec(FaultPoint.AFTER_COMPLETE, 5)]
    reader, compactor = PollingReader(uri, {}), Compactor(uri)
    reader.start()
    compactor.start()
    try:
        attempts = run_with_crashes(command, points)
    finally:
        compactor.stop.set()
        reader.stop.set()
        compactor.join()
        reader.join()
    final = compact_delta(uri)  # the job is done: one last pass merges what is left

    assert [a.returncode != 0 for a in attempts] == [True] * len(points) + [False]
    assert compactor.errors == [] and reader.errors == []
    assert sum(r.table_version is not None for r in compactor.results) >= 1

    newest = DeltaTable(uri).version()
    assert sorted(table_ids(uri, {})) == list(range(EPOCHS * EPOCH_ROWS))
    versions = {v: table_ids(uri, {}, v) for v in range(newest + 1)}
    log = commits(uri, newest)
    compactions = [v for v in range(newest + 1)
                   if any(COMPACTION_KEY in a.get("commitInfo", {}) for a in log[v])]
    assert all(whole_epochs(ids) for ids in versions.values())
    counts = [len(ids) for ids in versions.values()]
    assert counts == sorted(counts) and counts[-1] == EPOCHS * EPOCH_ROWS
    assert all(sorted(versions[v]) == sorted(versions[v - 1]) for v in compactions)
    assert reader.seen and all(reader.seen[v] == versions[v] for v in reader.seen)

    added = {a["add"]["path"] for actions in log for a in actions if "add" in a}
    epoch_files = {p for p in added if (f := data_file(p)) is not None and not f.compacted}
    compacted_away = {a["remove"]["path"] for v in compactions for a in log[v]
                      if "remove" in a}
    live = {Path(u).name for u in DeltaTable(uri).file_uris()}
    # removed from the log by compactions, kept on disk for time travel until VACUUM; no
    # data file of an aborted attempt, no pending marker
    assert {Path(p).name for p in leftovers(uri)} == compacted_away
    assert compacted_away <= added and not compacted_away & live
    print(f"{len(epoch_files)} epoch files written over {EPOCHS} epochs, "
          f"{len(compactions)} compaction commits, {len(live)} files in the newest version "
          f"(last pass: {final.files_before} -> {final.files_after})")
    assert len(live) < len(epoch_files)

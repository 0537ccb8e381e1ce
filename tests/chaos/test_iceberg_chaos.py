"""Kill -9 at every protocol point, restart, audit: the Iceberg sink is exactly-once with
the embedded SQLite catalog on a local disk, and with the SQL catalog on PostgreSQL and
everything else on an S3-compatible object store (S3Proxy: the table's files, Spark's
checkpoint on s3a://, exactly's commit log and lease); no reader ever sees part of an epoch.

Each test runs the demo pipeline (``exactly pipeline --sink iceberg``) as its own driver
process, one armed fault per attempt (see tests/chaos/test_file_sink_chaos.py), while a
reader polls the table through the catalog. Snapshots are immutable, so after the run every
snapshot the table ever had is read back as well: each must hold whole epochs only. The
orphan sweep at the end finds no data file that no snapshot names, and no pending marker.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from exactly.demos.files import write_events
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import python_command, run_with_crashes
from exactly.testing.iceberg_output import leftovers, load, snapshot_ids

pytestmark = pytest.mark.chaos
EPOCH_ROWS = 1000  # 2 input files of 500 events an epoch; 8 files -> epochs 0..3

EVERY_POINT = [FaultSpec(FaultPoint.IN_WRITE, 0), FaultSpec(FaultPoint.BEFORE_INTENT, 0),
               FaultSpec(FaultPoint.AFTER_INTENT, 1), FaultSpec(FaultPoint.BETWEEN_COMMITS, 1),
               FaultSpec(FaultPoint.AFTER_COMMITS, 2), FaultSpec(FaultPoint.AFTER_COMPLETE, 3)]


class PollingReader(threading.Thread):
    """Reads the table's current snapshot four times a second while the job runs; records
    every (snapshot, ids) it saw."""

    def __init__(self, address: str, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.address, self.env = address, env
        self.seen: dict[int, list[int]] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        from exactly.errors import ConfigError

        while not self.stop.wait(0.25):
            try:
                table = load(self.address)
            except (NoSuchTableError, NoSuchNamespaceError, ConfigError):
                continue  # not created yet
            snapshot = table.metadata.current_snapshot_id
            if snapshot is None:
                continue
            try:
                ids = table.scan(snapshot_id=snapshot, selected_fields=("id",)).to_arrow()
            except Exception as exc:  # a reader must never fail: recorded, asserted empty
                self.errors.append(repr(exc))
                continue
            self.seen.setdefault(snapshot, ids["id"].to_pylist())


def whole_epochs(ids: list[int]) -> bool:
    return len(ids) % EPOCH_ROWS == 0 and len(set(ids)) == len(ids)


@pytest.fixture
def where(request, tmp_path, monkeypatch) -> tuple[str, str, dict[str, str]]:
    """``(table address, checkpoint, environment for the job)``: all local with the embedded
    catalog, or the catalog on PostgreSQL and the rest on S3 (the commit log follows the
    checkpoint): ``"local"`` or ``"s3"``, the test's parameter."""
    if request.param == "local":
        return f"iceberg:{tmp_path / 'lake'}?table=db.events", str(tmp_path / "ck"), {}
    request.applymarker(pytest.mark.server)
    s3 = request.getfixturevalue("s3_server")
    pg = request.getfixturevalue("pg")
    for key, value in s3.env().items():  # this process's reader reads the same store
        monkeypatch.setenv(key, value)
    bucket = f"chaos-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    namespace = f"chaos_{uuid.uuid4().hex[:8]}"  # one PostgreSQL server for the session
    return (f"iceberg:{pg.dsn}?table={namespace}.events&warehouse=s3://{bucket}/lake",
            f"s3a://{bucket}/ck", s3.env())


@pytest.mark.parametrize("where", [
    # CI budget: the default lane kills the Iceberg sink at every protocol point in process
    # (tests/contract: the iceberg case of test_commit_protocol.py, 16 scenarios in ~2 s);
    # these runs of whole drivers are slow proofs
    pytest.param("local", id="local", marks=pytest.mark.slow),
    pytest.param("s3", id="postgres-catalog-s3", marks=pytest.mark.slow),
], indirect=True)
def test_iceberg_sink_killed_at_every_protocol_point_commits_every_event_exactly_once(
        tmp_path, where):
    """One run, restarted after each kill -9 (one crash per protocol point). After every
    crash the table holds whole epochs, the crashed epoch only when the kill came after its
    snapshot; a polling reader and every snapshot of the table hold whole epochs only; at the
    end every event is there exactly once, every snapshot is one epoch of the query, and no
    data file or pending marker of an aborted attempt is left."""
    address, checkpoint, env = where
    events = tmp_path / "input"
    write_events(events, 4 * EPOCH_ROWS, 8, seed=5)
    command = python_command("pipeline", "--sink", "iceberg", "--input", str(events),
                             "--output", address, "--checkpoint", checkpoint,
                             "--max-files-per-epoch", "2")
    after_crash: list[tuple[str, int, int]] = []

    def on_end(attempt) -> None:
        if attempt.crashed:
            try:
                rows = len(load(address).scan(selected_fields=("id",)).to_arrow())
            except Exception:  # the table is created when the query starts
                rows = 0
            after_crash.append((attempt.fired["point"], attempt.fired["epoch"], rows))

    reader = PollingReader(address, env)
    reader.start()
    try:
        attempts = run_with_crashes(command, EVERY_POINT, on_end=on_end, env=env)
    finally:
        reader.stop.set()
        reader.join()

    assert [a.returncode != 0 for a in attempts] == [True] * len(EVERY_POINT) + [False]
    for point, epoch, rows in after_crash:
        published = point in (FaultPoint.AFTER_COMMITS, FaultPoint.AFTER_COMPLETE)
        assert rows == EPOCH_ROWS * (epoch + published), (point, epoch, rows)

    table = load(address)
    assert sorted(table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()) == \
        list(range(4 * EPOCH_ROWS))
    history = snapshot_ids(table)
    assert [len(ids) for ids in history.values()] == [EPOCH_ROWS * i for i in range(1, 5)]
    assert all(whole_epochs(ids) for ids in history.values())
    summaries = [s.summary.additional_properties for s in table.metadata.snapshots]
    assert [int(s["exactly.epoch"]) for s in summaries] == [0, 1, 2, 3]
    assert len({s["exactly.queryId"] for s in summaries}) == 1
    assert reader.errors == []
    assert reader.seen and all(whole_epochs(ids) for ids in reader.seen.values())
    assert all(reader.seen[s] == history[s] for s in reader.seen)

    assert leftovers(address) == []  # aborted attempts' files and markers removed


class Compactor(threading.Thread):
    """Compacts the table every 0.3 s while the job runs (exactly's compaction, its own
    process: this test's); records what each pass did and any error."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.stop = threading.Event()
        self.results: list = []
        self.errors: list[str] = []

    def run(self) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        from exactly.connectors.iceberg.catalog import IcebergAddress
        from exactly.connectors.iceberg.compaction import compact_iceberg

        parsed = IcebergAddress.parse(self.address)
        while not self.stop.wait(0.3):
            try:
                result = compact_iceberg(parsed.catalog, parsed.table, min_input_files=2)
            except (NoSuchTableError, NoSuchNamespaceError):
                continue
            except Exception as exc:  # compaction must never fail: recorded, asserted empty
                self.errors.append(repr(exc))
                continue
            if result.snapshot is not None:
                self.results.append(result)


@pytest.mark.slow  # CI budget: a whole driver killed six times (~60 s)
def test_compaction_while_the_job_is_killed_at_every_point_changes_no_row_and_no_commit(
        tmp_path):
    """The demo pipeline into a local table, killed at every protocol point, while a
    compaction runs every 0.3 s: every id exactly once, every snapshot (compactions
    included) whole epochs, fewer live files than the epochs wrote, the epochs still
    readable from the files' names (a retract plan finds them), nothing left unreferenced."""
    address = f"iceberg:{tmp_path / 'lake'}?table=db.events"
    events = tmp_path / "input"
    per_epoch = 250
    write_events(events, 16 * per_epoch, 16, seed=7)  # 16 files, one an epoch: epochs 0..15
    command = python_command("pipeline", "--sink", "iceberg", "--input", str(events),
                             "--output", address, "--checkpoint", str(tmp_path / "ck"),
                             "--max-files-per-epoch", "1")
    points = [FaultSpec(p.point, p.min_epoch * 2) for p in EVERY_POINT]
    compactor = Compactor(address)
    compactor.start()
    try:
        attempts = run_with_crashes(command, points)
    finally:
        compactor.stop.set()
        compactor.join()
    final = compact_now(address)  # and once more after the job

    assert [a.returncode != 0 for a in attempts] == [True] * len(points) + [False]
    assert compactor.errors == []
    table = load(address)
    assert sorted(table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()) == \
        list(range(16 * per_epoch))
    for ids in snapshot_ids(table).values():
        assert len(ids) % per_epoch == 0 and len(set(ids)) == len(ids)
    live = [t.file for t in table.scan().plan_files()]
    written = sum(int(s.summary["added-data-files"]) for s in table.metadata.snapshots
                  if "exactly.epoch" in s.summary.additional_properties)
    print(f"compactions: {len(compactor.results) + (final is not None)}, files the epochs "
          f"wrote: {written}, live files after: {len(live)}")
    assert compactor.results or final is not None
    assert len(live) < written
    from exactly.connectors.iceberg.data_files import file_epochs

    assert all(file_epochs(f.file_path) for f in live)  # every live file names its epochs
    assert leftovers(address) == []


def compact_now(address: str):
    from exactly.connectors.iceberg.catalog import IcebergAddress
    from exactly.connectors.iceberg.compaction import compact_iceberg

    parsed = IcebergAddress.parse(address)
    return compact_iceberg(parsed.catalog, parsed.table).snapshot

"""The restore rule over a lineage, on every sink, without Spark: each query's epochs run
through the real commit protocol (:class:`~exactly.testing.harness.ProtocolHarness`) into a
real target (files, PostgreSQL, SQLite, Kafka, Delta on disk and on S3Proxy), and the rule
of :mod:`exactly.savepoints.sinks` is asked as a restore asks it.

The lineage of the issue: query A writes epochs 0..3 and is stopped with a savepoint at 3;
query B is restored from it into the same target (an upgrade) and writes epochs 4..5; then
A's older savepoint, at epoch 1, is restored into that target as query C. B descends from A,
so this is a rollback over epochs 2..5: ``--sink-rollback refuse`` refuses naming the flag,
``retract`` takes the line's epochs 2..5 back where the target can (audited: after C drains
to epoch 6 the target holds exactly the batch truth, epochs 0..6 once), ``keep`` leaves them
(audited: an appending target holds epochs 2..5 twice and nothing else is wrong; the file
sink and the upserting targets hold every row once). Where retract works, a second
rollback (to A's savepoint at 0, C descending from A@1) is kept and audited as well.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from exactly.config import CheckpointConfig
from exactly.errors import SavepointError
from exactly.ops.job import Job
from exactly.ops.query import with_sink_log_dir
from exactly.protocol.contract import TwoPhaseCommitSink
from exactly.savepoints.manifest import Manifest
from exactly.savepoints.sinks import SinkRollback, decide, hand_over
from exactly.spark.formats import sink_for
from exactly.testing.harness import ProtocolHarness

ROWS = pa.schema([("id", pa.int64()), ("key", pa.string())])


def epoch_ids(epoch: int) -> list[list[int]]:
    """The input of ``epoch``: two partitions of five ids (a restored query replays the
    same input for the same epoch number, as a replayable source does)."""
    return [list(range(epoch * 100, epoch * 100 + 5)),
            list(range(epoch * 100 + 5, epoch * 100 + 10))]


def truth(*epochs: int) -> list[int]:
    """The ids a crash-free batch run over ``epochs``' input writes, each once."""
    return sorted(i for e in epochs for part in epoch_ids(e) for i in part)


class Target:
    """One sink's target, shared by the queries of a lineage: the ``writeStream`` format and
    options of a job writing to it. Each query builds its sink from them with its own
    checkpoint (so its own commit log), as a restored job does."""

    name = ""
    sink_format = ""
    #: `--sink-rollback retract` can take the line's epochs back
    retracts = False
    #: `keep` leaves the kept epochs in the target twice (an appending target)
    keeps_twice = True
    #: the target records its owner's lineage (the refusal names it)
    records_lineage = True

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        self.request = request
        self.tmp = tmp

    def options(self) -> dict[str, str]:
        raise NotImplementedError

    def batch(self, ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]}, schema=ROWS)

    def visible(self) -> list[int]:
        raise NotImplementedError


class FilesTarget(Target):
    name = "files"
    sink_format = "exactly.files"
    retracts = True
    keeps_twice = False  # epochs are directories named by number: a kept one stands

    def options(self) -> dict[str, str]:
        return {"path": str(self.tmp / "out")}

    def visible(self) -> list[int]:
        import pyarrow.dataset as ds

        from exactly.audit import data_files

        files = [str(f) for f in data_files(self.tmp / "out")]
        return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


class _Postgres(Target):
    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        super().__init__(request, tmp)
        self.pg = request.getfixturevalue("pg")
        self.table = request.getfixturevalue("table_name")
        self.epochs = f"{self.table}_epochs"  # not the shared default: tests run in parallel

    def visible(self) -> list[int]:
        with self.pg.connect() as c:
            return [r[0] for r in c.execute(f'SELECT id FROM "{self.table}" ORDER BY id')]


class Postgres2pcAppend(_Postgres):
    name = "pg_2pc_append"
    sink_format = "exactly.postgres"
    retracts = True

    def options(self) -> dict[str, str]:
        return {"dsn": self.pg.dsn, "table": self.table, "epochsTable": self.epochs,
                "retrySeconds": "20"}


class Postgres2pcUpsert(Postgres2pcAppend):
    name = "pg_2pc_upsert"
    retracts = False
    keeps_twice = False  # rows upserted by id: the replayed epochs rewrite them

    def options(self) -> dict[str, str]:
        return {**super().options(), "writeMode": "upsert", "keyColumns": "id"}


class Upsert(_Postgres):
    name = "upsert"
    sink_format = "exactly.upsert"
    keeps_twice = False
    records_lineage = False  # no owner: every row counts as the line's

    def options(self) -> dict[str, str]:
        return {"dsn": self.pg.dsn, "table": self.table, "keyColumns": "id"}


class SqliteWal(Target):
    name = "wal"
    sink_format = "exactly.wal"

    def options(self) -> dict[str, str]:
        return {"path": str(self.tmp / "db.sqlite"), "table": "events"}

    def visible(self) -> list[int]:
        with sqlite3.connect(self.tmp / "db.sqlite") as c:
            return [r[0] for r in c.execute('SELECT id FROM "events" ORDER BY id')]


class Kafka(Target):
    name = "kafka"
    sink_format = "exactly.kafka"

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        super().__init__(request, tmp)
        self.broker = request.getfixturevalue("broker")
        self.topic = request.getfixturevalue("topic")

    def options(self) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.broker.bootstrap, "topic": self.topic,
                "transactionalIdPrefix": f"lineage-{self.topic}",
                "kafka.transaction.timeout.ms": "20000"}

    def batch(self, ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch({"value": [json.dumps({"id": i}) for i in ids]})

    def visible(self) -> list[int]:
        from exactly.testing.kafka_broker import consume_all

        return sorted(json.loads(v)["id"] for _, _, _, v in
                      consume_all(self.broker.bootstrap, self.topic,
                                  isolation_level="read_committed"))


class Delta(Target):
    name = "delta"
    sink_format = "exactly.delta"
    retracts = True

    def uri(self) -> str:
        return str(self.tmp / "table")

    def storage(self) -> dict[str, str]:
        return {}

    def options(self) -> dict[str, str]:
        return {"path": self.uri(), **{f"storage.{k}": v for k, v in self.storage().items()}}

    def visible(self) -> list[int]:
        return delta_ids(self.uri(), self.storage())


class DeltaS3(Delta):
    name = "delta_s3"

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        super().__init__(request, tmp)
        self.s3 = request.getfixturevalue("s3_server")
        self.bucket = f"lineage-{uuid.uuid4().hex[:12]}"
        self.s3.create_bucket(self.bucket)

    def uri(self) -> str:
        return f"s3://{self.bucket}/table"

    def storage(self) -> dict[str, str]:
        return self.s3.storage_options()


def delta_ids(uri: str, storage: dict[str, str]) -> list[int]:
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=storage)
    return sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())


class Iceberg(Target):
    """An Iceberg table in the embedded SQLite catalog of a local warehouse."""

    name = "iceberg"
    sink_format = "exactly.iceberg"
    retracts = True

    def options(self) -> dict[str, str]:
        return {"table": "db.events", "warehouse": str(self.tmp / "lake")}

    def table(self):
        from exactly.connectors.iceberg.catalog import CatalogSpec

        catalog = {k[len("catalog."):]: v for k, v in self.options().items()
                   if k.startswith("catalog.")}
        spec = CatalogSpec.from_options(catalog, self.options().get("warehouse"))
        return spec.load().load_table("db.events")

    def visible(self) -> list[int]:
        return sorted(self.table().scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())


class IcebergPostgresS3(Iceberg):
    """The SQL catalog on PostgreSQL, the table's files on S3Proxy."""

    name = "iceberg_pg_s3"

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        super().__init__(request, tmp)
        self.pg = request.getfixturevalue("pg")
        s3 = request.getfixturevalue("s3_server")
        monkeypatch = request.getfixturevalue("monkeypatch")
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        self.bucket = f"lineage-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(self.bucket)
        self.namespace = f"lineage_{uuid.uuid4().hex[:8]}"

    def options(self) -> dict[str, str]:
        return {"table": f"{self.namespace}.events", "catalog.uri": self.pg.dsn,
                "warehouse": f"s3://{self.bucket}/lake"}

    def table(self):
        from exactly.connectors.iceberg.catalog import CatalogSpec

        spec = CatalogSpec.from_options({"uri": self.pg.dsn}, f"s3://{self.bucket}/lake")
        return spec.load().load_table(f"{self.namespace}.events")


TARGETS = {t.name: t for t in (FilesTarget, Postgres2pcAppend, Postgres2pcUpsert, Upsert,
                               SqliteWal, Kafka, Delta, DeltaS3, Iceberg, IcebergPostgresS3)}
SERVERLESS = ("files", "wal", "delta", "iceberg")


def over(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("target", [
        pytest.param(n, id=n, marks=[] if n in SERVERLESS else [pytest.mark.server])
        for n in names], indirect=True)


@pytest.fixture
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    return TARGETS[request.param](request, tmp_path)


def manifest(query: str, epoch: int, checkpoint: Path) -> Manifest:
    """The parts of a savepoint's manifest a restore's sink rule reads."""
    return Manifest(savepoint_id=f"sp-{epoch}", epoch=epoch, created_at="", query_id=query,
                    trigger="stop", spark_version="", shuffle_partitions=2,
                    state_backend="hashmap", sql_conf={}, sources=[], operators=[], sinks=[],
                    job={"checkpoint": str(checkpoint)})


class Lineage:
    """Queries of one lineage writing into ``target`` through the real protocol, each with
    its own checkpoint directory, restored as ``exactly run -s`` restores (the savepoint's
    own job is stopped)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.sinks: dict[str, TwoPhaseCommitSink] = {}
        self.b = ""  # the query restored from A by :func:`upgraded`

    def checkpoint(self, query: str) -> Path:
        return self.target.tmp / f"ck-{query[:8]}"

    def job(self, query: str) -> Job:
        return Job(None, self.target.sink_format, options=self.target.options(),  # type: ignore[arg-type]
                   checkpoint=CheckpointConfig(storage=str(self.checkpoint(query))))

    def sink(self, query: str) -> TwoPhaseCommitSink:
        """The query's sink, built from the job's options as its writer builds it."""
        if query not in self.sinks:
            options = with_sink_log_dir(str(self.checkpoint(query)), self.target.options())
            sink = sink_for(self.target.sink_format, options).sink
            sink.prepare_target(self.target.batch([]).schema, partitions=2)
            self.sinks[query] = sink
        return self.sinks[query]

    def run(self, query: str, epochs: range) -> None:
        harness = ProtocolHarness(self.sink(query), query_id=query)
        for epoch in epochs:
            harness.run_epoch(epoch, [self.target.batch(p) for p in epoch_ids(epoch)])

    def restore(self, query: str, epoch: int, new_query: str,
                policy: SinkRollback = SinkRollback.REFUSE) -> dict[str, Any]:
        """What ``exactly run -s <query's savepoint at epoch>`` does to the target before
        the new query runs."""
        job, savepoint = self.job(new_query), manifest(query, epoch, self.checkpoint(query))
        state = decide(job, savepoint, policy, new_query)
        return hand_over(job, savepoint, state, policy, new_query)


def upgraded(target: Target) -> tuple[Lineage, str]:
    """A ran 0..3 and stopped with a savepoint at 3; B, restored from it, ran 4..5."""
    line = Lineage(target)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 4))
    line.restore(a, 3, b)
    line.run(b, range(4, 6))
    assert target.visible() == truth(*range(6))
    line.b = b
    return line, a


@over(*TARGETS)
def test_a_rollback_across_a_restore_lineage_with_each_sink_rollback_value(target):
    """refuse, then retract (audited) and keep (audited) where the target can; where it
    cannot retract, the refusal of retract names keep, and keep is audited."""
    line, a = upgraded(target)
    with pytest.raises(SavepointError) as refused:
        line.restore(a, 1, str(uuid.uuid4()))
    message = str(refused.value)
    assert "epochs 2..5" in message and "--sink-rollback keep" in message, message
    assert "not this job's output" not in message
    if target.records_lineage:
        assert f"restored from {a} at epoch 3" in message, message
    assert ("--sink-rollback retract (take them back first)" in message) == target.retracts
    assert target.visible() == truth(*range(6))  # nothing written

    c = str(uuid.uuid4())
    if not target.retracts:
        with pytest.raises(SavepointError, match=r"--sink-rollback retract: .*cannot be taken "
                                                 r"back.*Choose --sink-rollback keep"):
            line.restore(a, 1, c, SinkRollback.RETRACT)
        assert target.visible() == truth(*range(6))
        line.restore(a, 1, c, SinkRollback.KEEP)
        line.run(c, range(2, 7))
        kept = truth(2, 3, 4, 5) if target.keeps_twice else []
        assert target.visible() == sorted(truth(*range(7)) + kept)
        return

    line.restore(a, 1, c, SinkRollback.RETRACT)
    assert target.visible() == truth(0, 1)
    line.run(c, range(2, 7))
    assert target.visible() == truth(*range(7))
    # back again, to A's savepoint at 0 (C descends from A@1), keeping epochs 1..6
    d = str(uuid.uuid4())
    line.restore(a, 0, d, SinkRollback.KEEP)
    line.run(d, range(1, 8))
    kept = truth(*range(1, 7)) if target.keeps_twice else []
    assert target.visible() == sorted(truth(*range(8)) + kept)


@over("files", "pg_2pc_append", "wal", "delta", "iceberg")
def test_a_savepoint_newer_than_where_the_lineage_left_its_query_is_refused(target):
    """A ran 0..3 (savepoints at 1 and 3); B was restored from A@1 over epochs 2..3
    (retract where the target can, else keep) and ran 2..3; A@3 is of another branch."""
    line = Lineage(target)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 4))
    line.restore(a, 1, b,
                 SinkRollback.RETRACT if target.retracts else SinkRollback.KEEP)
    line.run(b, range(2, 4))
    with pytest.raises(SavepointError, match=rf"continues query {a} from its epoch 1 .*"
                                             r"its epochs 2\.\.3 are not part"):
        line.restore(a, 3, str(uuid.uuid4()), SinkRollback.KEEP)


@over("files", "pg_2pc_append")
def test_a_target_owned_by_an_unrelated_query_is_not_this_jobs_output(target):
    line, _ = upgraded(target)
    with pytest.raises(SavepointError, match="not this job's output"):
        line.restore(str(uuid.uuid4()), 3, str(uuid.uuid4()), SinkRollback.KEEP)


@over("pg_2pc_append")
def test_an_epochs_table_made_before_lineages_is_read_and_migrated_by_the_hand_over(target):
    """An epochs table without the lineage column (as created by earlier versions) keeps
    working: the owner is read, the first hand-over adds the column, the lineage holds."""
    with target.pg.connect() as c:  # the epochs table as earlier versions made it
        c.execute(f'CREATE TABLE "{target.epochs}" (relid regclass PRIMARY KEY, query_id text '
                  "NOT NULL, epoch bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT "
                  "now())")
    line = Lineage(target)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 2))
    state = line.sink(b).target_state(a)
    assert (state.owner, state.lineage, state.progress) == (a, (), 1)
    line.restore(a, 1, b)
    line.run(b, range(2, 4))
    with pytest.raises(SavepointError, match=rf"epochs 1\.\.3 of query {b} \(restored from "
                                             rf"{a} at epoch 1\)"):
        line.restore(a, 0, str(uuid.uuid4()))



@over("delta")
def test_delta_retract_keeps_other_writers_appends_and_is_refused_after_a_rewrite(target):
    """The retract commit removes only the line's files: rows another writer appended after
    the savepoint stay. Once the table was rewritten (OPTIMIZE compacts the line's files
    into new ones), the line's rows cannot be told apart: retract is refused naming it."""
    from deltalake import DeltaTable, write_deltalake

    line = Lineage(target)
    a, c = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 4))
    write_deltalake(target.uri(), pa.table(target.batch([9001, 9002])),
                    mode="append")  # another writer
    line.restore(a, 1, c, SinkRollback.RETRACT)
    assert target.visible() == sorted([*truth(0, 1), 9001, 9002])

    line.run(c, range(2, 4))
    DeltaTable(target.uri()).optimize.compact()
    with pytest.raises(SavepointError) as refused:
        line.restore(c, 2, str(uuid.uuid4()), SinkRollback.RETRACT)
    assert "OPTIMIZE" in str(refused.value) and "--sink-rollback keep" in str(refused.value)
    assert target.visible() == sorted([*truth(0, 1, 2, 3), 9001, 9002])


@over("files", "pg_2pc_append", "wal", "kafka", "delta", "iceberg")
def test_a_savepoint_of_a_branch_a_later_restore_replaced_is_refused(target):
    """A ran 0..3; B, restored from A@3, ran 4..5; then C was restored from A's older
    savepoint at 1 (a rollback, kept) and ran 2..3. The target's line of A is C's now, so
    B's savepoint at 5 continues nothing the target holds: refused, nothing written.
    Targets several queries write (Kafka, Delta, write-ahead tables) name the branch point."""
    line, a = upgraded(target)
    b = line.b
    c = str(uuid.uuid4())
    line.restore(a, 1, c, SinkRollback.KEEP)
    line.run(c, range(2, 4))
    before = target.visible()
    with pytest.raises(SavepointError) as refused:
        line.restore(b, 5, str(uuid.uuid4()), SinkRollback.KEEP)
    message = str(refused.value)
    if target.name in ("files", "pg_2pc_append"):  # one owner: C, whose lineage is A@1
        assert "not this job's output" in message, message
    else:
        assert (f"query {c} (restored from {a} at epoch 1) replaced the line of query {b}"
                in message), message
        assert f"one of {a} at epoch 1 or older" in message, message
    assert target.visible() == before


@over("files", "kafka")
def test_a_restore_is_refused_before_writing_while_the_savepoints_job_still_runs(target):
    """The savepoint's own job is alive on its checkpoint (its status names a live
    process): the rule refuses before anything is written, naming `exactly stop`."""
    from exactly.checkpoint.location import job_dir
    from exactly.checkpoint.status import JobStatus, claim_job
    from exactly.procs import current_process

    line, _ = upgraded(target)
    b = line.b
    claim_job(job_dir(line.checkpoint(b)), JobStatus("r1", current_process(), "running"))
    job, savepoint = line.job("new"), manifest(b, 5, line.checkpoint(b))
    with pytest.raises(SavepointError, match=r"still runs on .*exactly stop "):
        decide(job, savepoint, SinkRollback.KEEP, "new")
    assert target.visible() == truth(*range(6))


@over("pg_2pc_append")
def test_a_kept_rollback_shows_the_restored_querys_epochs_in_the_view_only_when_complete(
        target):
    """C is restored from A@1 keeping epochs 2..5 of the line. While C's epoch 2 stands
    between its two COMMIT PREPAREDs, the committed view shows no row of it (the recorded
    epoch went back to the savepoint's 1 at the hand-over, not left at 5); once complete,
    epoch 2 shows whole: C's rows and the kept ones."""
    from exactly.protocol.faults import FaultPoint

    line, a = upgraded(target)
    c = str(uuid.uuid4())
    line.restore(a, 1, c, SinkRollback.KEEP)

    def view() -> list[int]:
        with target.pg.connect() as conn:
            return [r[0] for r in conn.execute(
                f'SELECT id FROM "{target.table}_committed" ORDER BY id')]

    seen: list[list[int]] = []
    harness = ProtocolHarness(line.sink(c), query_id=c)
    with harness.pause_at(FaultPoint.BETWEEN_COMMITS, 2, lambda: seen.append(view())):
        harness.run_epoch(2, [target.batch(p) for p in epoch_ids(2)])
    assert seen == [truth(0, 1)]
    assert view() == sorted(truth(0, 1, 2) + truth(2))


@over("files")
@pytest.mark.parametrize("crash", ["after_renames", "inside_removal"])
def test_a_file_retract_a_crash_interrupts_never_shows_half_an_epoch_and_is_finished(
        target, crash, monkeypatch):
    """The retract of epochs 2..5 dies after the epoch directories were renamed aside (the
    log still says them complete), or inside the removal of a directory after one of its
    files was deleted (as a SIGKILL mid-``rmtree`` leaves it). Readers see whole epochs
    only; a kept restore that would skip epochs still logged complete is refused; the
    restore run again with retract finishes it."""
    import shutil

    import exactly.connectors.files.sink as files_sink

    line, a = upgraded(target)
    c = str(uuid.uuid4())
    real_rmtree, real_fsync = shutil.rmtree, files_sink.fsync_dir

    class Killed(Exception):
        pass

    def dies_midway(path, *args, **kwargs):
        data = [p for p in Path(path).rglob("*") if p.is_file() and p.suffix == ".parquet"]
        if data:
            data[0].unlink()
            raise Killed(path)
        real_rmtree(path, *args, **kwargs)

    def dies_after_renames(path):
        if any(target.tmp.joinpath("out").glob("_retracted-*")):
            raise Killed(path)
        real_fsync(path)

    if crash == "inside_removal":
        monkeypatch.setattr(files_sink.shutil, "rmtree", dies_midway)
    else:
        monkeypatch.setattr(files_sink, "fsync_dir", dies_after_renames)
    with pytest.raises(Killed):
        line.restore(a, 1, c, SinkRollback.RETRACT)
    monkeypatch.undo()
    seen = target.visible()
    whole = {e: set(truth(e)) for e in range(6)}
    assert set(seen) == set().union(*(ids for ids in whole.values() if ids <= set(seen)))
    assert len(seen) == len(set(seen))
    if crash == "after_renames":
        with pytest.raises(SavepointError, match="retract a crash interrupted"):
            line.restore(a, 1, c, SinkRollback.KEEP)  # would skip the hidden, logged epochs

    line.restore(a, 1, c, SinkRollback.RETRACT)
    assert target.visible() == truth(0, 1)
    assert not list(target.tmp.joinpath("out").glob("_retracted-*"))
    line.run(c, range(2, 4))
    assert target.visible() == truth(*range(4))


@over("kafka")
def test_kafka_hand_overs_dropped_from_the_lineage_record_are_warned_and_recorded(
        target, monkeypatch, caplog):
    """The record holds the newest hand-overs that fit (here 1): the second restore drops
    the first's, says so in a warning and in what the restore records."""
    import logging

    import exactly.connectors.kafka.lineage as kafka_lineage

    monkeypatch.setattr(kafka_lineage, "MAX_EDGES", 1)
    line, _ = upgraded(target)  # B <- A@3 recorded
    c = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="exactly.kafka"):
        done = line.restore(line.b, 5, c)
    assert done["lineage_edges_dropped"] == [line.b]
    warned = [r for r in caplog.records if "kafka_lineage_trimmed" in r.getMessage()]
    assert len(warned) == 1 and line.b in warned[0].getMessage()
    assert [e.query_id for e in kafka_lineage.read_edges(line.sink(c).options)] == [c]


@over("delta")
def test_delta_retract_takes_back_the_lines_files_only_not_rows_an_earlier_keep_left(
        target):
    """A ran 0..5; C, restored from A@1 keeping A's epochs 2..5, ran 2..6. Retracting
    after C's epoch 3 takes back C's epochs 4..6, the files of the queries whose ``txn``
    it resets; A's kept rows of epochs 4..5 are another branch's and stay."""
    line = Lineage(target)
    a, c = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 6))
    line.restore(a, 1, c, SinkRollback.KEEP)
    line.run(c, range(2, 7))
    done = line.restore(c, 3, str(uuid.uuid4()), SinkRollback.RETRACT)
    assert done["retracted_epochs"] == [4, 5, 6]
    assert target.visible() == sorted(truth(*range(6)) + truth(2, 3))


@over("files", "pg_2pc_append", "wal", "kafka", "delta", "delta_s3", "iceberg",
      "iceberg_pg_s3")
def test_a_fork_records_its_lineage_so_an_older_savepoint_restored_into_it_is_a_rollback(
        target):
    """A's savepoint at 3 is restored as B into a fresh target (a fork: A's own output is
    elsewhere) and B runs 4..5. A's older savepoint at 1 restored into B's target is a
    rollback over the line B continues: refused naming the choices, not taken for another
    job's output (files, PostgreSQL) or for a fresh target (Kafka, Delta, write-ahead
    tables, which would then hold both lines' epochs). The fork supersedes nothing: the
    savepoint's query may still run on its own target."""
    line = Lineage(target)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    if target.name == "pg_2pc_append":
        line.sink(b)  # the table exists before the restore (else nothing can be recorded)
    done = line.restore(a, 3, b)
    assert not done.get("aborted_pre_commits") and not done.get("fenced"), done
    line.run(b, range(4, 6))
    assert target.visible() == truth(4, 5)
    with pytest.raises(SavepointError) as refused:
        line.restore(a, 1, str(uuid.uuid4()))
    message = str(refused.value)
    assert f"holds epochs 2..5 of query {b} (restored from {a} at epoch 3)" in message, message
    assert "--sink-rollback keep" in message, message
    assert target.visible() == truth(4, 5)


@pytest.mark.server
def test_a_kafka_fork_into_a_topic_not_made_yet_is_restored_and_says_no_lineage_was_recorded(
        broker, tmp_path, caplog):
    """The topic does not exist until the restored job's first write creates it: the
    hand-over has nowhere to record the fork; the restore goes on, and its record and a
    warning say so (with the fix: create the topic first)."""
    import logging

    topic = f"not-made-{uuid.uuid4().hex[:8]}"
    options = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
               "transactionalIdPrefix": f"fork-{topic}"}
    job = Job(None, "exactly.kafka", options=options,  # type: ignore[arg-type]
              checkpoint=CheckpointConfig(storage=str(tmp_path / "ck-b")))
    savepoint = manifest("a", 3, tmp_path / "ck-a")
    state = decide(job, savepoint, SinkRollback.REFUSE, "b")
    assert state.fresh
    with caplog.at_level(logging.WARNING, logger="exactly.kafka"):
        done = hand_over(job, savepoint, state, SinkRollback.REFUSE, "b")
    assert done == {"fenced": [], "lineage_recorded": f"no: topic {topic} does not exist yet"}
    assert any("kafka_fork_lineage_not_recorded" in r.getMessage() for r in caplog.records)


@over("iceberg")
def test_iceberg_retract_keeps_other_writers_appends_and_is_refused_after_a_rewrite(target):
    """The retract snapshot removes only the line's files: rows another writer appended
    after the savepoint stay. Once another writer overwrote rows (a pyiceberg overwrite
    rewrites the table's files), the line's rows cannot be told apart: retract is refused
    naming the snapshot; keep still works."""
    line = Lineage(target)
    a, c = str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 4))
    target.table().append(pa.Table.from_batches([target.batch([9001, 9002])]))
    done = line.restore(a, 1, c, SinkRollback.RETRACT)
    assert done["retracted_epochs"] == [2, 3]
    assert target.visible() == sorted([*truth(0, 1), 9001, 9002])
    summary = target.table().current_snapshot().summary.additional_properties
    assert summary["exactly.retractedAfter"] == "1"

    line.run(c, range(2, 4))
    table = target.table()
    table.overwrite(table.scan().to_arrow())  # another engine rewrote every file
    with pytest.raises(SavepointError) as refused:
        line.restore(c, 2, str(uuid.uuid4()), SinkRollback.RETRACT)
    message = str(refused.value)
    assert "the table was rewritten" in message and "delete" in message, message
    assert "--sink-rollback keep" in message, message
    assert target.visible() == sorted([*truth(0, 1, 2, 3), 9001, 9002])


@over("iceberg")
def test_iceberg_retract_takes_back_the_lines_files_only_not_rows_an_earlier_keep_left(
        target):
    """As for Delta: A ran 0..5; C, restored from A@1 keeping A's epochs 2..5, ran 2..6;
    retracting after C's epoch 3 takes back C's epochs 4..6 only, and a restored query
    then commits epoch 4 again (the progress went back with the files)."""
    line = Lineage(target)
    a, c, d = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    line.run(a, range(0, 6))
    line.restore(a, 1, c, SinkRollback.KEEP)
    line.run(c, range(2, 7))
    done = line.restore(c, 3, d, SinkRollback.RETRACT)
    assert done["retracted_epochs"] == [4, 5, 6]
    assert target.visible() == sorted(truth(*range(6)) + truth(2, 3))
    line.run(d, range(4, 5))
    assert target.visible() == sorted(truth(*range(6)) + truth(2, 3, 4))

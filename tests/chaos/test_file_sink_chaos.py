"""Kill -9 at every protocol point, restart, audit: the 2PC file sink is exactly-once.

Each test runs the demo pipeline (`exactly pipeline`) as its own driver process, armed
with one fault per attempt; the process kills itself (driver points: the driver's whole
process tree; ``in_write``: the executor's Python worker) and is started again with the
next fault, one crash per protocol point.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.auditor import verify
from exactly.procs import JOB_TOKEN_ENV, kill_job, new_job_token
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import continuous_files_job, python_command, run_with_crashes
from exactly.testing.file_output import assert_no_dangling_pre_commits

pytestmark = pytest.mark.chaos
FILES_PER_EPOCH = 2  # 8 input files of 500 events -> epochs 0..3


def pipeline(tmp: Path, events: Path, mode: str = "exactly_once",
             writer: str = "start_query") -> list[str]:
    return python_command("pipeline", "--input", str(events), "--output", str(tmp / "out"),
                          "--checkpoint", str(tmp / "ck"), "--mode", mode,
                          "--max-files-per-epoch", str(FILES_PER_EPOCH), "--writer", writer)


def visible_ids_by_epoch(out: Path) -> dict[str, list[int]]:
    by_epoch: dict[str, list[int]] = {}
    for f in data_files(out) if out.exists() else []:
        ids = ds.dataset(str(f), format="parquet").to_table(columns=["id"])["id"].to_pylist()
        by_epoch.setdefault(f.parent.name, []).extend(ids)
    return by_epoch


#: every protocol point once, in protocol order, spread over the 4 epochs
EVERY_POINT = [FaultSpec(FaultPoint.IN_WRITE, 0), FaultSpec(FaultPoint.BEFORE_INTENT, 0),
               FaultSpec(FaultPoint.AFTER_INTENT, 1), FaultSpec(FaultPoint.BETWEEN_COMMITS, 1),
               FaultSpec(FaultPoint.AFTER_COMMITS, 2), FaultSpec(FaultPoint.AFTER_COMPLETE, 3)]


@pytest.mark.parametrize("writer", [
    "start_query",
    # slow: the data source writer's commit path under kills (the default lane kills
    # start_query's; tests/spark/test_commit_path.py runs both paths, without kills)
    pytest.param("datasource", marks=pytest.mark.slow)])
def test_killed_at_every_protocol_point_in_turn_every_event_is_committed_exactly_once(
        events_dir, tmp_path, writer):
    """One run, restarted after each kill -9: one crash per protocol point. After every
    crash readers see whole epochs only, and the crashed epoch is visible only when the
    kill came after its publication; at the end every event is there exactly once. Both
    commit paths: the driver's ``foreachBatch`` (start_query) and the sink's data source
    writer (PySpark's own ``writeStream.format(...)``), whose commit runs in Spark's commit
    process."""
    out = tmp_path / "out"
    after_crash: list[tuple[str, int, dict[str, int]]] = []

    def on_end(attempt) -> None:
        if attempt.crashed:
            visible = {epoch: len(ids) for epoch, ids in visible_ids_by_epoch(out).items()}
            after_crash.append((attempt.fired["point"], attempt.fired["epoch"], visible))

    attempts = run_with_crashes(pipeline(tmp_path, events_dir, writer=writer), EVERY_POINT,
                                on_end=on_end)

    assert [a.returncode != 0 for a in attempts] == [True] * len(EVERY_POINT) + [False]
    assert [(point, epoch) for point, epoch, _ in after_crash] == \
        [(s.point, s.min_epoch) for s in EVERY_POINT]
    for point, epoch, visible in after_crash:
        assert all(rows == 1000 for rows in visible.values()), (point, visible)
        published = point in (FaultPoint.AFTER_COMMITS, FaultPoint.AFTER_COMPLETE)
        assert (f"epoch-{epoch:012d}" in visible) == published, (point, visible)
    report = verify(events_dir, out)
    assert report.ok, report.rows()
    assert report.found_rows == 4000
    assert_no_dangling_pre_commits(out)


@pytest.mark.slow  # a demonstration of the mode exactly replaces; tests/unit/test_audit.py
def test_at_least_once_mode_duplicates_after_the_same_crash(events_dir, tmp_path):
    """The audit can fail: at_least_once publishes inside the tasks, so a crash before
    Spark's commit log makes the replay publish the epoch a second time."""
    attempts = run_with_crashes(pipeline(tmp_path, events_dir, mode="at_least_once"),
                                [FaultSpec(FaultPoint.AFTER_COMMITS, 1)])
    assert attempts[0].crashed
    report = verify(events_dir, tmp_path / "out")
    assert not report.ok
    assert report.missing.count == 0
    assert report.duplicate_extra_rows == 1000  # epoch 1 (two files of 500) twice


def _wait_for(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


# CI budget: a slow proof. The default lane fences a second live instance of every
# sink in tests/contract (test_a_second_live_instance_is_fenced_and_commits_nothing, case
# files among them), a second Spark query of the 2PC sink in tests/postgres/test_fencing.py,
# and a second driver process on this file sink's output, from another host, in
# tests/chaos/test_fencing_across_hosts.py
@pytest.mark.slow
def test_a_second_instance_of_the_query_is_fenced_and_never_commits(tmp_path):
    """Two drivers on one query (B restores a copy of A's checkpoint): B must fail with a
    clear error and commit nothing, while A goes on committing."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    log = CommitLog(out / "_exactly")
    token = new_job_token()
    a = subprocess.Popen(continuous_files_job(out, ck), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, JOB_TOKEN_ENV: token})
    try:
        _wait_for(lambda: len(log.completed_epochs()) >= 2)
        shutil.copytree(ck, tmp_path / "ck-copy")
        lease_before = json.loads((out / "_exactly" / "lease.json").read_text())
        b = subprocess.run(continuous_files_job(out, tmp_path / "ck-copy"), capture_output=True,
                           text=True, timeout=300)
        assert b.returncode != 0
        assert "is fenced off" in b.stderr and lease_before["run_id"] in b.stderr
        lease_after = json.loads((out / "_exactly" / "lease.json").read_text())
        assert lease_after["run_id"] == lease_before["run_id"]
        committed_by = {log.completion(e)["run_id"] for e in log.completed_epochs()}
        assert committed_by == {lease_before["run_id"]}
        done = len(log.completed_epochs())
        _wait_for(lambda: len(log.completed_epochs()) > done)  # A is still committing
    finally:
        kill_job(token, psutil.Process(a.pid))  # the driver, its JVM and its workers
        a.wait()
    ids = sorted(i for v in visible_ids_by_epoch(out).values() for i in v)
    assert ids == list(range(len(ids)))  # no id lost or duplicated in what A committed


@pytest.mark.slow
def test_soak_random_crashes_over_many_epochs(tmp_path):
    """Soak: 100,000 events in 40 epochs, 12 crashes at random points and epochs."""
    import random

    from exactly.demos.files import write_events
    from exactly.testing.chaos import random_schedule

    events = tmp_path / "input"
    write_events(events, 100_000, 80, seed=11)
    schedule = random_schedule(12, 40, random.Random(11))
    attempts = run_with_crashes(pipeline(tmp_path, events), schedule)
    assert sum(a.crashed for a in attempts) == len(schedule)
    assert verify(events, tmp_path / "out").ok
    assert_no_dangling_pre_commits(tmp_path / "out")

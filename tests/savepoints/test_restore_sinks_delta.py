"""Savepoints and the Delta sink, with real Spark: a job writing a Delta table is stopped with
a savepoint, its next version is restored from it into the same table (the restore hands the
table over: the lineage record names the new query), and restoring an older savepoint of the
first version into that table is refused as a rollback over the new version's epochs, naming
``--sink-rollback``. The table is audited after each step with ``exactly verify`` (through
its log, per epoch): every id once. On a local directory, and on S3Proxy."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from savepoint_jobs import StatefulJob

from exactly.errors import SavepointError
from exactly.testing.chaos import python_command

STEP = 500  # one epoch per step (JOB_MAX_ROWS=500)


def audit_delta_table(uri: str, env: dict[str, str], rows: int, epochs: int) -> None:
    """``exactly verify`` on the table, as a user runs it: each id 0..rows-1 (the batch truth
    of the generator's input, as SQL) exactly once, read through the table's log; the
    per-epoch breakdown names epochs 0..epochs-1."""
    shown = subprocess.run(
        [*python_command("verify", "--output", uri, "--json",
                         "--expect", f"select range as id from range({rows})")],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    report = json.loads(shown.stdout)
    assert report["ok"] and report["found_rows"] == rows, report
    assert sorted(e["epoch"] for e in report["epochs"]) == list(range(epochs)), report


def delta_flow(spark, tmp_path, savepoints, uri: str, storage: dict[str, str],
               verify_env: dict[str, str]) -> None:
    env = {"JOB_KIND": "rows", "JOB_SINK": "delta", "JOB_OUT": uri,
           "JOB_STORAGE": json.dumps(storage), "JOB_MAX_ROWS": str(STEP)}
    first = StatefulJob(spark, tmp_path / "ck0", **env)
    first.run(STEP)  # epoch 0
    older = first.savepoint(savepoints)
    first.run(2 * STEP)  # epoch 1
    stopped = first.savepoint(savepoints)
    audit_delta_table(uri, verify_env, 2 * STEP, 2)

    second = StatefulJob(spark, tmp_path / "ck1", **env)
    done = second.restore(stopped, 3 * STEP)
    assert done["aborted_pre_commits"] == 0, done  # a hand-over, nothing left over
    second.run(3 * STEP)  # epoch 2, as the new query
    audit_delta_table(uri, verify_env, 3 * STEP, 3)

    third = StatefulJob(spark, tmp_path / "ck2", **env)
    with pytest.raises(SavepointError, match=r"epochs 1\.\.2 of query .* \(restored from .* at "
                                             r"epoch 1\).*--sink-rollback retract.*"
                                             r"--sink-rollback keep"):
        third.restore(older, 4 * STEP)
    audit_delta_table(uri, verify_env, 3 * STEP, 3)  # the refusal wrote nothing


def test_a_delta_table_is_handed_over_on_restore_and_a_rollback_is_refused(
        spark, tmp_path, savepoints):
    delta_flow(spark, tmp_path, savepoints, str(tmp_path / "table"), {}, {})


@pytest.mark.server
def test_a_delta_table_on_s3_is_handed_over_on_restore_and_a_rollback_is_refused(
        spark, tmp_path, savepoints, s3_server):
    bucket = f"restore-{tmp_path.name.lower().replace('_', '-')[-30:]}".strip("-")
    s3_server.create_bucket(bucket)
    delta_flow(spark, tmp_path, savepoints, f"s3://{bucket}/table", s3_server.storage_options(),
               s3_server.env())

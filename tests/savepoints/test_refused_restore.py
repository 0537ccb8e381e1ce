"""A restore that is refused leaves a checkpoint holding only ``exactly-job/``: the run's
status (failed, with the cause) and its restart history. ``exactly checkpoints`` and
``exactly ui`` show that run and why it ended; the same checkpoint then takes the corrected
restore. Real Spark (the transformWithState job of savepoint_jobs into the file sink)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from savepoint_jobs import StatefulJob
from test_restore_transform_with_state import assert_exactly_once

from exactly.cli import main
from exactly.errors import SavepointError
from exactly.ops.driver import run_job
from exactly.ops.job_savepoints import RestoreRequest
from exactly.savepoints.sinks import SinkRollback
from exactly.testing.ui import get_json, ui_server

STEP = 500
SPARK_FILES = ("metadata", "offsets", "commits", "state", "sources")


def test_a_refused_restore_leaves_only_its_failed_run_which_checkpoints_and_ui_show(
        spark, tmp_path, savepoints):
    out = tmp_path / "out"
    env = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb", "JOB_OUT": str(out)}
    first = StatefulJob(spark, tmp_path / "ck", **env)
    first.run(STEP)
    savepoint = first.savepoint(savepoints)
    first.run(2 * STEP)  # the output is now ahead of the savepoint: a rollback

    ck2 = tmp_path / "ck2"
    again = StatefulJob(spark, ck2, **env)
    try:
        run_job(lambda s: again.job(2 * STEP), checkpoint=str(ck2), spark=spark,
                restore=RestoreRequest(str(savepoint)))
        raise AssertionError("the rollback was not refused")
    except SavepointError as exc:
        refusal = str(exc)
    assert "--sink-rollback" in refusal

    # what is left: the run's control files, no Spark file
    assert sorted(p.name for p in ck2.iterdir()) == ["exactly-job"]
    left = sorted(p.name for p in (ck2 / "exactly-job").iterdir())
    assert {"job.json", "restarts.jsonl"} <= set(left), left
    assert not any(name in SPARK_FILES for name in left)
    status = json.loads((ck2 / "exactly-job" / "job.json").read_text())
    assert status["state"] == "failed" and "--sink-rollback" in status["detail"]

    # exactly checkpoints: the failed run with its cause
    shown = CliRunner().invoke(main, ["checkpoints", str(ck2), "--json"])
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.stdout)
    assert view["status"] == "failed"
    assert view["status_detail"].startswith("SavepointError: ")
    assert "--sink-rollback" in view["status_detail"]
    (failure,) = view["restarts"]
    assert (failure["event"], failure["kind"], failure["action"]) == (
        "failure", "restore", "give-up")
    assert failure["cause"] == view["status_detail"]
    text = CliRunner().invoke(main, ["checkpoints", str(ck2)])
    assert text.exit_code == 0 and "failed: SavepointError" in text.output

    # exactly ui: starts for both checkpoints and lists the failed run with its cause
    with ui_server(tmp_path / "ck", ck2) as url:
        code, body = get_json(f"{url}/jobs")
    assert code == 200
    by_checkpoint = {job["checkpoint"]: job for job in body["jobs"]}
    assert by_checkpoint[str(ck2)]["status"] == "failed"
    assert "--sink-rollback" in by_checkpoint[str(ck2)]["status_detail"]
    assert by_checkpoint[str(tmp_path / "ck")]["status"] != "failed"

    # the corrected restore goes into the same checkpoint and the output is exact
    again.restore(savepoint, 3 * STEP, sink_rollback=SinkRollback.RETRACT)
    again.run(3 * STEP)
    assert_exactly_once(out, 3 * STEP)


def test_an_interrupted_restore_of_another_savepoint_refuses_a_second_savepoint(tmp_path):
    """A crash left ``restore.json`` in progress for savepoint 1 (its query may own the
    sink's target already): restoring savepoint 2 into that checkpoint is refused before
    anything is read or written, naming both ways out; the marker stays as it was."""
    from exactly.checkpoint.location import job_dir
    from exactly.config import CheckpointConfig
    from exactly.ops.job import Job
    from exactly.ops.job_savepoints import restore_job

    checkpoint = tmp_path / "ck"
    marker = job_dir(checkpoint) / "restore.json"
    marker.parent.mkdir(parents=True)
    interrupted = {"state": "in-progress", "savepoint": str(tmp_path / "sp-1"), "epoch": 3,
                   "query_id": "q-restored"}
    marker.write_text(json.dumps(interrupted))
    job = Job(None, "exactly.files", options={"path": str(tmp_path / "out")},  # type: ignore[arg-type]
              checkpoint=CheckpointConfig(storage=str(checkpoint)))
    try:
        restore_job(job, RestoreRequest(str(tmp_path / "sp-2")), [])
        raise AssertionError("the second savepoint was accepted")
    except SavepointError as exc:
        message = str(exc)
    assert f"interrupted restore of {tmp_path / 'sp-1'}" in message, message
    assert f"-s {tmp_path / 'sp-1'}" in message and "new checkpoint directory" in message
    assert json.loads(marker.read_text()) == interrupted
    assert sorted(p.name for p in checkpoint.iterdir()) == ["exactly-job"]

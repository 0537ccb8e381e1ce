"""``exactly upgrade``'s request, its place in the control channel, its refusals and the
restore marker it leaves (no Spark)."""

from __future__ import annotations

import json

import pytest

from exactly.checkpoint.control import ControlChannel, Request, late_answer
from exactly.checkpoint.location import job_dir, job_store
from exactly.checkpoint.status import JobStatus, claim_job, refuse_other_job
from exactly.errors import ConfigError, SavepointError
from exactly.ops import upgrade as upgrade_module
from exactly.ops.driver import DriverSpec, _refuse_unfinished_restore
from exactly.ops.upgrade import Upgrader, UpgradeRequest, refusal
from exactly.procs import current_process
from exactly.savepoints.restore import mark_in_progress


def test_an_upgrade_request_names_an_existing_job_file_and_valid_options(tmp_path):
    job = tmp_path / "v2.py"
    with pytest.raises(ConfigError, match="does not exist"):
        UpgradeRequest.from_params({"job_file": str(job)})
    job.write_text("def build(spark): ...\n")
    with pytest.raises(ConfigError, match="--sink-rollback 'maybe'"):
        UpgradeRequest.from_params({"job_file": str(job), "sink_rollback": "maybe"})
    with pytest.raises(ConfigError, match="at least 1"):
        UpgradeRequest.from_params({"job_file": str(job), "epochs": -1})
    request = UpgradeRequest(str(job), parallelism=4, sink_rollback="retract", epochs=5)
    assert UpgradeRequest.from_params(request.params()) == request
    restore = request.restore("/sp/savepoint-7-x")
    assert restore == {"savepoint": "/sp/savepoint-7-x", "allow_non_restored_state": False,
                       "mode": "no_claim", "parallelism": 4, "sink_rollback": "retract"}


def test_upgrades_go_to_the_launcher_and_never_to_the_driver(tmp_path):
    """The driver's listing leaves an upgrade out (it neither acts on it nor answers it);
    the launcher's lists only upgrades; one never begun is refused when the job ended."""
    claim_job(job_dir(tmp_path), JobStatus("r1", current_process(), "running"))
    channel = ControlChannel(tmp_path)
    upgrade = channel.send("upgrade", job_file="/jobs/v2.py")
    stop = channel.send("stop")
    assert [r.id for r in channel.pending()] == [stop.id]
    assert [r.id for r in ControlChannel(tmp_path).pending(launcher=True)] == [upgrade.id]
    status, detail = late_answer(upgrade, "stopped", 12)
    assert status == "refused" and "before the upgrade began" in detail


@pytest.mark.parametrize(("ha", "remote", "named"), [(True, None, "--ha"),
                                                      (False, "sc://h:15002", "Spark Connect")])
def test_an_upgrade_in_place_is_refused_on_ha_and_connect_with_the_way_by_hand(ha, remote,
                                                                              named):
    why = refusal(ha=ha, remote=remote)
    assert why is not None and named in why
    assert "exactly stop CK --savepoint" in why and "-s SAVEPOINT" in why
    assert refusal(ha=False, remote=None) is None


def test_a_refusing_launcher_answers_the_upgrade_and_starts_nothing(tmp_path):
    claim_job(job_dir(tmp_path), JobStatus("r1", current_process(), "running"))
    channel = ControlChannel(tmp_path)
    request = channel.send("upgrade", job_file=str(tmp_path / "v2.py"))
    spec = DriverSpec(job_file=str(tmp_path / "v1.py"), checkpoint=str(tmp_path), run_id="r1")
    upgrader = Upgrader(spec, {}, say=lambda text: None, retarget=lambda spec: None,
                        refused="not here")
    upgrader.tick(driver_pid=123)
    answer = channel.answer_of(request)
    assert answer is not None and answer["status"] == "refused" and answer["detail"] == \
        "not here"
    assert upgrader.state == "idle" and upgrader.process is None


def test_a_job_file_the_launcher_cannot_read_is_refused_without_a_driver(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(upgrade_module, "LOOK_INTERVAL_S", 0.0)
    monkeypatch.setattr(upgrade_module, "REQUESTS_LOOK_S", 0.0)
    claim_job(job_dir(tmp_path), JobStatus("r1", current_process(), "running"))
    channel = ControlChannel(tmp_path)
    request: Request = channel.send("upgrade", job_file=str(tmp_path / "gone.py"))
    spec = DriverSpec(job_file=str(tmp_path / "v1.py"), checkpoint=str(tmp_path), run_id="r1")
    upgrader = Upgrader(spec, {}, say=lambda text: None, retarget=lambda spec: None)
    upgrader.tick(driver_pid=None)  # between restarts: left for the next driver
    assert channel.answer_of(request) is None
    upgrader.tick(driver_pid=123)
    answer = channel.answer_of(request)
    assert answer is not None and answer["status"] == "refused" and "gone.py" in \
        answer["detail"]


def test_a_checkpoint_with_an_unfinished_upgrade_restore_refuses_a_driver_without_it(tmp_path):
    """The upgrade marks the restore in progress before the old query's files are replaced:
    a driver started without that restore (a launcher killed meanwhile, then a plain
    ``exactly run``) refuses to start on them, naming the savepoint and the job file."""
    _refuse_unfinished_restore(str(tmp_path))  # no marker: nothing to refuse
    mark_in_progress(str(tmp_path), "/sp/savepoint-7-x", 7, upgrade={"job_file": "/jobs/v2.py"})
    with pytest.raises(SavepointError, match=r"unfinished restore of /sp/savepoint-7-x into "
                                             r"/jobs/v2\.py.*-s /sp/savepoint-7-x"):
        _refuse_unfinished_restore(str(tmp_path))


def test_after_an_upgrade_the_old_job_file_is_refused_naming_the_new_one(tmp_path):
    """job.json names the upgraded file: a service that starts the old file again is
    refused with the file to start; while the upgrade's restore is unfinished, its files
    may finish it."""
    store = job_store(tmp_path)
    status = JobStatus("r1", current_process(), "stopped", job="v2.py")
    mark_in_progress(str(tmp_path), "/sp/savepoint-7-x", 7,
                     upgrade={"job_file": "/jobs/v2.py", "from_job_file": "/jobs/v1.py"})
    refuse_other_job(store, status, "v1.py")  # unfinished: either file may finish it
    refuse_other_job(store, status, "v2.py")
    with pytest.raises(ConfigError, match=r"holds the job v2\.py"):
        refuse_other_job(store, status, "v3.py")
    marker = json.loads(store.read("restore.json"))
    store.write("restore.json", json.dumps({**marker, "state": "done"}).encode())
    with pytest.raises(ConfigError, match=r"`exactly upgrade` moved it from v1\.py to "
                                          r"v2\.py: start v2\.py"):
        refuse_other_job(store, status, "v1.py")


def test_an_upgrade_to_the_running_file_or_sent_to_an_ended_run_is_refused(tmp_path,
                                                                         monkeypatch):
    """A rollback needs the old file, so the running file is no new version; a request
    queued for a run that ended (its command killed) is refused by the next run, never
    carried out by surprise."""
    monkeypatch.setattr(upgrade_module, "LOOK_INTERVAL_S", 0.0)
    monkeypatch.setattr(upgrade_module, "REQUESTS_LOOK_S", 0.0)
    job = tmp_path / "v1.py"
    job.write_text("def build(spark): ...\n")
    channel = ControlChannel(tmp_path / "ck")
    same = channel.post("upgrade", job_file=str(job))
    stale = channel._write("upgrade", {"job_file": str(job)}, "an-ended-run")
    spec = DriverSpec(job_file=str(job), checkpoint=str(tmp_path / "ck"), run_id="r2")
    upgrader = Upgrader(spec, {}, say=lambda text: None, retarget=lambda spec: None)
    upgrader.tick(driver_pid=123)
    answers = {r.id: channel.answer_of(r) for r in (same, stale)}
    assert "the job file the job runs" in answers[same.id]["detail"]
    assert "sent to run an-ended-run" in answers[stale.id]["detail"]
    assert upgrader.state == "idle" and upgrader.process is None


def test_exactly_upgrade_of_a_job_run_in_process_says_there_is_no_launcher(tmp_path):
    from click.testing import CliRunner

    from exactly.cli import main

    claim_job(job_dir(tmp_path / "ck"), JobStatus("r1", current_process(), "running",
                                                  driver=current_process()))
    job = tmp_path / "v2.py"
    job.write_text("def build(spark): ...\n")
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path / "ck"), str(job)])
    assert result.exit_code == 3, result.output
    assert "no `exactly run` launcher" in result.output
    assert ControlChannel(tmp_path / "ck").pending(launcher=True) == []

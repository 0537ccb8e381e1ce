"""``exactly run`` refuses what ``--ha`` cannot run safely, before anything starts: a store
without compare-and-swap (one that ignores conditional writes, one that answers them 501),
a second job file on one checkpoint, a host id a live launcher uses, settings whose renew
deadline is not below the lease, and a plain ``exactly run`` beside live HA launchers.

Each case is one ``exactly run`` process, refused in about a second: it prints no leader or
standby line, starts no driver (its job would take tens of seconds to build) and leaves the
checkpoint store as it found it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from supervised import JOBS

from exactly.checkpoint.layout import JOB_STATUS
from exactly.checkpoint.leader import LEADER, Member, Members
from exactly.checkpoint.location import job_store
from exactly.checkpoint.status import JobStatus
from exactly.procs import ProcessId, process_id
from exactly.testing.supervised import SupervisedRun

#: the job's settings, should a refusal fail and a driver start: a small, quick job
JOB_ENV = {"JOB_ROWS": "100", "JOB_RATE": "0", "JOB_INTERVAL": "500ms"}


def refused(job: Path, checkpoint: Path | str, *args: str, tmp_path: Path) -> tuple[int, str]:
    """``exactly run JOB --checkpoint CK ARGS``: its exit code and output (the process
    and anything it started killed when it did not end within 60 s)."""
    run = SupervisedRun(job, checkpoint, {**JOB_ENV, "JOB_OUT": str(tmp_path / "out")}, *args,
                        log=tmp_path / f"run-{len(list(tmp_path.glob('run-*.log')))}.log")
    try:
        code = run.wait(timeout=60)
    finally:
        run.close()
    text = run.output()
    assert "leader (term" not in text and "standby:" not in text, text
    return code, text


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def job_file(tmp_path: Path, name: str) -> Path:
    """The test job under another name (a checkpoint is one job file's address)."""
    path = tmp_path / name
    shutil.copy(JOBS / "datagen_job.py", path)
    return path


def bucket_keys(s3_server, bucket: str) -> list[str]:
    found = s3_server.boto3_client().list_objects_v2(Bucket=bucket)
    return [obj["Key"] for obj in found.get("Contents", [])]


@pytest.mark.server
def test_ha_on_an_s3_store_that_ignores_conditional_writes_is_refused_naming_it_and_both_ops(
        s3_ignoring_conditions, s3_server, s3_bucket, tmp_path):
    checkpoint = f"s3a://{s3_bucket}/jobs/orders"
    code, text = refused(JOBS / "datagen_job.py", checkpoint, "--ha", tmp_path=tmp_path)
    assert code != 0
    line = last_line(text)
    assert line.startswith(f"run failed: ConfigError: {checkpoint}/exactly-job: the store does "
                           "not honour conditional writes")
    assert "create-if-absent (S3: PUT with If-None-Match: *): a second create" in line
    assert "compare-and-swap (S3: PUT with If-Match: <ETag>): a swap of" in line
    assert "needed by exactly run --ha (its leader lease)" in line
    assert bucket_keys(s3_server, s3_bucket) == []  # no lease, member, job.json or probe


@pytest.mark.server
def test_ha_on_an_s3_store_that_answers_501_to_conditional_writes_is_refused_naming_it(
        s3_refusing_conditions, s3_server, s3_bucket, tmp_path):
    checkpoint = f"s3a://{s3_bucket}/jobs/orders"
    code, text = refused(JOBS / "datagen_job.py", checkpoint, "--ha", tmp_path=tmp_path)
    assert code != 0
    line = last_line(text)
    assert line.startswith(f"run failed: ConfigError: {checkpoint}/exactly-job: the store "
                           "refuses create-if-absent (S3: PUT with If-None-Match: *)")
    assert "conditional writes are not implemented" in line
    assert "needed by exactly run --ha (its leader lease)" in line
    assert bucket_keys(s3_server, s3_bucket) == []


def test_ha_with_a_second_job_file_on_a_checkpoint_whose_status_names_another_is_refused(
        tmp_path):
    checkpoint = tmp_path / "ck"
    JobStatus("run-1", ProcessId("host-a", 7, 1), "stopped",
              job="orders_job.py").write(job_store(checkpoint))
    status = job_store(checkpoint).read(JOB_STATUS)
    code, text = refused(job_file(tmp_path, "billing_job.py"), checkpoint, "--ha",
                         tmp_path=tmp_path)
    assert code != 0
    assert last_line(text).startswith(
        f"run failed: ConfigError: checkpoint {checkpoint} holds the job orders_job.py (run "
        "run-1, stopped), not billing_job.py: give billing_job.py a checkpoint of its own")
    assert job_store(checkpoint).read(JOB_STATUS) == status
    assert job_store(checkpoint).read(LEADER) is None


def test_ha_with_a_second_job_file_beside_a_live_standby_of_another_is_refused(tmp_path):
    """No job.json yet (the first launcher stands by, or has not claimed it): the live
    member record names the job it runs."""
    checkpoint = tmp_path / "ck"
    Members(job_store(checkpoint)).beat(Member("host-a", ProcessId("host-a", 7, 1), "standby",
                                               "orders_job.py", lease_s=60.0))
    code, text = refused(job_file(tmp_path, "billing_job.py"), checkpoint, "--ha",
                         "--host-id", "host-b", tmp_path=tmp_path)
    assert code != 0
    assert last_line(text).startswith(
        "run failed: ConfigError: the launcher on host host-a (pid 7) runs orders_job.py on "
        "this checkpoint, not billing_job.py: a checkpoint is one job's address; give this "
        "job a checkpoint of its own")
    assert [m.host for m in Members(job_store(checkpoint)).live()] == ["host-a"]
    assert job_store(checkpoint).read(JOB_STATUS) is None


def test_ha_with_a_host_id_that_a_live_launcher_on_this_machine_uses_is_refused_naming_it(
        tmp_path):
    checkpoint = tmp_path / "ck"
    other = subprocess.Popen(["sleep", "60"])  # the other launcher, alive as host-a
    try:
        launcher = replace(process_id(other.pid), host="host-a")
        Members(job_store(checkpoint)).beat(Member("host-a", launcher, "leader",
                                                   "datagen_job.py", lease_s=60.0))
        code, text = refused(JOBS / "datagen_job.py", checkpoint, "--ha", "--host-id",
                             "host-a", tmp_path=tmp_path)
    finally:
        other.kill()
        other.wait()
    assert code != 0
    assert last_line(text).startswith(
        "run failed: ConfigError: host id 'host-a' is already used by a live `exactly run "
        f"--ha` (pid {other.pid}, leader) on this machine for this checkpoint: give every "
        "launcher its own host id")
    [member] = Members(job_store(checkpoint)).live()
    assert member.launcher == launcher
    assert job_store(checkpoint).read(LEADER) is None
    assert job_store(checkpoint).read(JOB_STATUS) is None


def test_ha_settings_whose_renew_deadline_is_not_below_the_lease_are_a_usage_error(tmp_path):
    checkpoint = tmp_path / "ck"
    code, text = refused(JOBS / "datagen_job.py", checkpoint, "--ha", "--ha-renew-deadline",
                         "20s", "--ha-lease-duration", "15s", tmp_path=tmp_path)
    assert code == 2, text  # click's usage error
    assert "Usage: " in text
    assert last_line(text) == (
        "Error: --ha-renew-interval (3s) < --ha-renew-deadline (20s) < --ha-lease-duration "
        "(15s) must hold: the leader renews several times within its deadline and stops its "
        "driver before a standby may take the lease over")
    assert not checkpoint.exists()


def test_a_plain_run_on_a_checkpoint_whose_ha_launchers_live_is_refused_saying_to_add_ha(
        tmp_path):
    checkpoint = tmp_path / "ck"
    members = Members(job_store(checkpoint))
    members.beat(Member("host-a", ProcessId("host-a", 7, 1), "leader", "datagen_job.py",
                        lease_s=60.0))
    members.beat(Member("host-b", ProcessId("host-b", 8, 1), "standby", "datagen_job.py",
                        lease_s=60.0))
    code, text = refused(JOBS / "datagen_job.py", checkpoint, tmp_path=tmp_path)
    assert code != 0
    assert last_line(text) == (
        f"run failed: FencedError: checkpoint {checkpoint} is run by `exactly run --ha` "
        "launchers on host-a (leader), host-b (standby): start this one with --ha too (it "
        "joins them as a standby), or stop the job first with `exactly stop "
        f"{checkpoint}`. Nothing was started.")
    assert job_store(checkpoint).read(JOB_STATUS) is None

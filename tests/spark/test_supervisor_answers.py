"""What the supervisor answers names the checkpoint's last completed epoch, also before the
(restarted) driver completes one of its own (it said "stopped after epoch None")."""

from __future__ import annotations

from datagen_query import datagen

from exactly.checkpoint.control import ControlChannel
from exactly.checkpoint.location import job_dir
from exactly.checkpoint.status import JobStatus, claim_job
from exactly.config import CheckpointConfig
from exactly.ops.job import Job
from exactly.ops.supervisor import Outcome, Supervisor
from exactly.procs import current_process


def test_a_stop_before_the_first_epoch_of_a_restarted_driver_names_the_last_committed_one(
        spark, tmp_path):
    ck = tmp_path / "ck"
    (ck / "commits").mkdir(parents=True)
    for epoch in range(133):  # what a job that ran 133 epochs leaves in its commit log
        (ck / "commits" / str(epoch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    claim_job(job_dir(ck), JobStatus("run", current_process(), "starting"))
    job = Job(datagen(spark), "exactly.files", path=str(tmp_path / "out"),
              checkpoint=CheckpointConfig(storage=str(ck)))
    channel = ControlChannel(ck)
    request = channel.send("stop")
    assert Supervisor(job, run_id="run").run() is Outcome.STOPPED  # no query was started
    answer = channel.wait_answer(request, timeout=5)
    assert answer is not None and answer["last_epoch"] == 132, answer
    assert answer["detail"].endswith("after epoch 132"), answer["detail"]
    assert JobStatus.read(job_dir(ck)).last_epoch == 132

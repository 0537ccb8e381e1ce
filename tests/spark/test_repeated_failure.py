"""A failure that repeats identically: the restart history counts its repeats, and
``max-repeated-cause`` gives up on it (the default strategy alone restarts it forever).

Real Spark (the session fixture, in process): a datagen query into the file sink whose
output path is an existing regular file, so every start fails the same way (as with a
read-only output; we run as root, where a read-only directory is still writable).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from datagen_query import datagen

from exactly.cli import main
from exactly.config import CheckpointConfig
from exactly.ops.driver import run_job
from exactly.ops.job import Job
from exactly.ops.restart import restart_strategy
from exactly.ops.supervisor import JobFailedError


def test_a_cause_repeated_max_repeated_cause_times_in_a_row_fails_the_job(spark, tmp_path):
    output, ck = tmp_path / "out", tmp_path / "ck"
    output.write_text("a regular file where the sink's output directory should be\n")
    strategy = restart_strategy("exponential-delay", {
        "initial-backoff": "0.1s", "max-repeated-cause": 3})

    def build(session) -> Job:
        return Job(datagen(session), "exactly.files", path=str(output),
                   checkpoint=CheckpointConfig(storage=str(ck), interval="200ms"))

    with pytest.raises(JobFailedError) as failed:
        run_job(build, checkpoint=str(ck), restart_strategy=strategy, spark=spark)

    lines = (ck / "exactly-job" / "restarts.jsonl").read_text().splitlines()
    failures = [e for e in map(json.loads, lines) if e["event"] == "failure"]
    assert [e["repeats"] for e in failures] == [1, 2, 3]
    assert [e["action"] for e in failures] == ["restart", "restart", "give-up"]
    (cause,) = {e["cause"] for e in failures}
    assert cause.startswith("NotADirectoryError: ") and str(output) in cause
    assert failures[-1]["reason"] == "the same cause repeated 3 times in a row"
    message = str(failed.value)
    assert message.startswith(f"the same cause repeated 3 times in a row: {cause} (")
    assert "max-repeated-cause=3) gave up" in message
    assert json.loads((ck / "exactly-job" / "job.json").read_text())["state"] == "failed"

    shown = CliRunner().invoke(main, ["checkpoints", str(ck)], terminal_width=400)
    assert shown.exit_code == 0, shown.output
    assert "(same cause 2 times in a row)" in shown.output
    assert "(same cause 3 times in a row)" in shown.output

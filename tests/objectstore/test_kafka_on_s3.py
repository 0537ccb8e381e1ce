"""The Kafka demo job with its whole state on S3 (S3Proxy): Spark's checkpoint on s3a://,
exactly's commit log, lease and staged Arrow files beside it on s3://. Killed with SIGKILL
after the intent (recovery publishes the epoch from the staged objects), inside the Kafka
transaction (the restart aborts it and publishes again) and while tasks write (their
half-written uploads are aborted), restarted, and audited by a read_committed consumer.

The default lane runs the kill after the intent only (the restart lists the staged objects a
dead run left and publishes them); EXACTLY_SLOW=1 runs all three points."""

from __future__ import annotations

import os
import uuid

import pytest

from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.demos.kafka import run_chaos
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import FaultPoint, FaultSpec

pytestmark = [pytest.mark.server, pytest.mark.chaos]
SLOW = os.environ.get("EXACTLY_SLOW") == "1"
EVENTS, EPOCHS = (1000, 5) if SLOW else (600, 3)
SCHEDULE = [FaultSpec(FaultPoint.AFTER_INTENT, 1)] + (
    [FaultSpec(IN_TRANSACTION, 2), FaultSpec(FaultPoint.IN_WRITE, 3)] if SLOW else [])


def test_kafka_job_with_checkpoint_log_and_staging_on_s3_survives_kills_exactly_once(
        broker, s3_server, tmp_path, monkeypatch):
    bucket = f"kafka-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    run = run_chaos(broker.bootstrap, tmp_path / "job", events=EVENTS, epochs=EPOCHS,
                    schedule=SCHEDULE, checkpoint=f"s3a://{bucket}/ck", env=s3_server.env())
    assert run.fired == [s.point for s in SCHEDULE]
    assert run.committed.report.ok, run.committed.report.to_json()
    assert run.committed.report.found_rows == EVENTS
    assert run.committed.seq_errors == 0
    if SLOW:  # the crash inside the publish left that epoch's records uncommitted
        assert run.uncommitted.report.duplicate_extra_rows > 0

    client = s3_server.boto3_client()

    def listed(prefix: str) -> list[str]:
        found = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return [o["Key"] for o in found]

    assert listed("ck/offsets/"), "Spark's offsets log is not on S3"
    assert listed("ck/exactly-sink/intents/"), "the commit log is not beside it on S3"
    assert listed("ck/exactly-sink/staging/") == []  # every staged object published, removed
    assert not list((tmp_path / "job").rglob("exactly-sink"))  # nothing went to local disk
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    assert CommitLog(f"s3://{bucket}/ck/exactly-sink").completed_epochs()

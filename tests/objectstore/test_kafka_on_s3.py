"""The Kafka demo job with its whole state on S3 (S3Proxy): Spark's checkpoint on s3a://,
exactly's commit log, lease and staged Arrow files beside it on s3://. Killed with SIGKILL
after the intent (recovery publishes the epoch from the staged objects), inside the Kafka
transaction (the restart aborts it and publishes again) and while tasks write (their
half-written uploads are aborted), restarted, and audited by a read_committed consumer.

A slow proof (marked ``slow``), as is this job on the standalone cluster
(tests/chaos/test_cluster_lane.py). The default lane runs the sink against S3 at every
protocol point without Spark (tests/contract, case kafka_s3), the Kafka job under kills
with its state on local disk (tests/connect/test_chaos_on_connect.py) and the write-ahead
sink's staging on S3 under kills on the cluster."""

from __future__ import annotations

import uuid

import pytest

from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.demos.kafka import run_chaos
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import FaultPoint, FaultSpec

pytestmark = [pytest.mark.server, pytest.mark.chaos, pytest.mark.slow]
EVENTS, EPOCHS = 1000, 5
SCHEDULE = [FaultSpec(FaultPoint.AFTER_INTENT, 1), FaultSpec(IN_TRANSACTION, 2),
            FaultSpec(FaultPoint.IN_WRITE, 3)]


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
    # the crash inside the publish left that epoch's records uncommitted in the log
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

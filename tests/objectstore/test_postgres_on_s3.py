"""The PostgreSQL pipelines with their whole state on S3 (S3Proxy): Spark's checkpoint on
s3a:// and exactly's commit log and lease beside it on s3:// (and, for the write-ahead sink,
its staged Parquet files), killed with SIGKILL at the protocol points where the commit log
decides the outcome, restarted, audited."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from exactly.audit import audit_ids, pg_table_ids
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.demos.postgres_job import DSN_ENV, command
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import run_with_crashes

#: slow: the default lane proves the S3 commit log and s3a:// checkpoint under kills with the
#: write-ahead sink into PostgreSQL on a cluster (tests/chaos/test_cluster_lane.py)
pytestmark = [pytest.mark.server, pytest.mark.chaos, pytest.mark.slow]
ROWS, PER_EPOCH = 4_000, 1_000
#: the two points where only the commit log on S3 knows the outcome: after the intent
#: (recovery commits it) and between the handle commits (half of the epoch is visible, the
#: intent names the other half); every point runs against a local log in tests/postgres
POINTS = [FaultSpec(FaultPoint.AFTER_INTENT, 1), FaultSpec(FaultPoint.BETWEEN_COMMITS, 2)]


@pytest.mark.parametrize("sink", ["2pc", "wal"])
def test_with_checkpoint_commit_log_and_staging_on_s3_survives_kills_exactly_once(
        sink, pg, conn, s3_server, monkeypatch):
    bucket = f"pg-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    table = f"ev_{uuid.uuid4().hex[:8]}"
    checkpoint = f"s3a://{bucket}/ck"
    attempts = run_with_crashes(
        command("--sink", sink, "--table", table, "--checkpoint", checkpoint, "--rows",
                str(ROWS), "--rows-per-epoch", str(PER_EPOCH)),
        POINTS, env={DSN_ENV: pg.dsn, **s3_server.env()}, timeout=480)
    assert [a.fired["point"] for a in attempts if a.crashed] == [p.point for p in POINTS]
    report = audit_ids(pg_table_ids(conn, table), np.arange(ROWS))
    assert report.ok, report.to_json()
    assert prepared_count(conn) == 0
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    log = CommitLog(f"s3://{bucket}/ck/exactly-sink")  # the log followed the checkpoint
    assert log.completed_epochs() == list(range(ROWS // PER_EPOCH))
    client = s3_server.boto3_client()
    offsets = client.list_objects_v2(Bucket=bucket, Prefix="ck/offsets/").get("Contents", [])
    assert offsets, "Spark's offsets log is not on S3"
    if sink == "wal":  # every staged file loaded, then removed
        staged = client.list_objects_v2(Bucket=bucket, Prefix="ck/exactly-sink/wal/")
        assert staged.get("Contents", []) == []

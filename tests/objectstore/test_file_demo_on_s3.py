"""The file demo (`exactly pipeline`) with Spark's checkpoint on s3a:// (S3Proxy), killed
with SIGKILL at protocol points in turn, restarted, audited. The file sink's own output and
commit log stay on a POSIX directory: its epoch publish is a rename, which S3 lacks."""

from __future__ import annotations

import uuid

import pytest

from exactly.auditor import verify
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import python_command, run_with_crashes
from exactly.testing.file_output import assert_no_dangling_pre_commits

#: slow: the default lane proves the s3a:// checkpoint under kills in
#: tests/ops/test_run_on_s3.py and tests/chaos/test_cluster_lane.py
pytestmark = [pytest.mark.server, pytest.mark.chaos, pytest.mark.slow]
POINTS = [FaultSpec(FaultPoint.AFTER_INTENT, 1), FaultSpec(FaultPoint.AFTER_COMMITS, 2)]


def test_the_file_demo_with_its_checkpoint_on_s3_survives_kills_exactly_once(
        events_dir, tmp_path, s3_server):
    bucket = f"files-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    out = tmp_path / "out"
    command = python_command("pipeline", "--input", str(events_dir), "--output", str(out),
                             "--checkpoint", f"s3a://{bucket}/ck",
                             "--max-files-per-epoch", "2")
    attempts = run_with_crashes(command, POINTS, env=s3_server.env())
    assert [a.fired["point"] for a in attempts if a.crashed] == [p.point for p in POINTS]
    report = verify(events_dir, out)
    assert report.ok, report.rows()
    assert report.found_rows == 4000
    assert_no_dangling_pre_commits(out)
    offsets = s3_server.boto3_client().list_objects_v2(Bucket=bucket, Prefix="ck/offsets/")
    assert offsets.get("KeyCount", 0) >= 4, "Spark's offsets log is not on S3"

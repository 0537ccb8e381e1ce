"""``exactly ui`` and ``exactly checkpoints --follow`` on a checkpoint on S3 (S3Proxy), without
Spark: a stopped job's offsets, commits and history written as objects; the dashboard's REST
API and the followed records come from the bucket, nothing from a local directory; an HA
job's leader, standbys and failovers too."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from click.testing import CliRunner

from exactly.checkpoint.ha_view import LEADER, MEMBERS
from exactly.checkpoint.history import open_history
from exactly.checkpoint.location import job_store, open_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.cli import main
from exactly.testing.ui import get_json, ui_server

EXACTLY = [sys.executable, "-m", "exactly.cli"]


def _epoch(epoch: int, at: float) -> dict:
    return {"kind": "epoch", "at": at, "status": "completed", "epoch": epoch, "query_id": "q",
            "trigger_at": at - 0.5, "end_at": at, "duration_ms": 500, "rows_in": 10,
            "rows_out": 10, "checkpoint": {"new_bytes": 100, "full_bytes": 100 * (epoch + 1)}}


def s3_checkpoint(bucket: str) -> str:
    """A stopped job's checkpoint on S3: epochs 0-2 committed, their history records."""
    checkpoint = f"s3a://{bucket}/jobs/orders"
    store = open_store(checkpoint)
    for folder in ("offsets", "commits"):
        for epoch in range(3):
            store.write(f"{folder}/{epoch}", b"v1\n")
    history = open_history(checkpoint)
    for record in [{"kind": "run", "at": 100.0, "query_id": "q", "spark_run_id": "r1",
                    "name": "orders", "resumed_after_epoch": None,
                    "config": {"interval": "1s", "interval_s": 1.0, "mode": "exactly_once"}},
                   _epoch(0, 101.0), _epoch(1, 102.0), _epoch(2, 103.0),
                   {"kind": "run_end", "at": 104.0, "query_id": "q", "outcome": "stopped"}]:
        history.append(record)
    return checkpoint


def test_the_dashboard_serves_a_job_from_its_checkpoint_on_s3(s3_bucket, tmp_path,
                                                              monkeypatch):
    checkpoint = s3_checkpoint(s3_bucket)
    monkeypatch.chdir(tmp_path)
    with ui_server(checkpoint) as base:
        status, listed = get_json(f"{base}/jobs")
        assert status == 200, listed
        (job,) = listed["jobs"]
        assert (job["id"], job["name"], job["status"]) == ("q", "orders", "stopped")
        assert job["checkpoint"] == checkpoint
        assert job["counts"]["completed"] == 3 and job["last_epoch"] == 2
        status, shown = get_json(f"{base}/jobs/q/checkpoints")
        assert status == 200 and [r["epoch"] for r in shown["history"]] == [2, 1, 0]
    assert list(tmp_path.iterdir()) == []  # no local directory named after the URI


def test_follow_json_on_s3_prints_every_record_then_the_new_ones(s3_bucket):
    checkpoint = s3_checkpoint(s3_bucket)
    proc = subprocess.Popen([*EXACTLY, "checkpoints", checkpoint, "--follow", "--json"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(5)]
        assert [r["kind"] for r in first] == ["run", "epoch", "epoch", "epoch", "run_end"]
        open_history(checkpoint).append({"kind": "run", "at": 200.0, "query_id": "q"})
        assert json.loads(proc.stdout.readline()) == {"kind": "run", "at": 200.0,
                                                      "query_id": "q"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_leader_standbys_and_failovers_of_an_ha_job_on_s3_come_from_the_bucket(s3_bucket):
    """Member freshness is the bucket's LastModified against the member's lease_s: a
    standby with a 600 s lease is live, one with a 0 s lease is not."""
    checkpoint = s3_checkpoint(s3_bucket)
    store = job_store(checkpoint)
    now = time.time()
    store.write(LEADER, json.dumps({"host": "host-b", "generation": 4, "acquired_at": now - 5,
                                    "lease_s": 600.0, "ended": None,
                                    "released": False}).encode())
    for host, lease_s in (("host-c", 600.0), ("host-a", 0.0)):
        store.write(f"{MEMBERS}/{host}.json", json.dumps(
            {"host": host, "role": "standby", "heartbeat": now, "lease_s": lease_s}).encode())
    RestartHistory(store, "run-b").append(
        "failure", kind="failover", action="failover", at=now - 5, since=now - 8,
        from_host="host-a", to_host="host-b", generation=4, cause="Failover: from host-a")
    RestartHistory(store, "run-b").append("recovered", at=now - 3, epoch=3, recovery_s=5.0)
    shown = CliRunner().invoke(main, ["checkpoints", checkpoint, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert {k: data["leader"][k] for k in ("host", "generation", "since", "standbys",
                                           "lease")} == {
        "host": "host-b", "generation": 4, "since": now - 5, "standbys": ["host-c"],
        "lease": "held"}
    assert [(f["from_host"], f["to_host"], f["since"], f["duration_s"], f["in_progress"])
            for f in data["failovers"]] == [("host-a", "host-b", now - 8, 5.0, False)]

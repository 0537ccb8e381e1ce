"""A stopped query's sink lease is renewed no more: its heartbeat stops with the query and the
lease is released for the next run -- through exactly's wrappers (``ExactlyQuery.stop``, as
the supervisor stops queries) before ``stop()`` returns, and after a plain
``StreamingQuery.stop()`` (the listener of exactly.spark.run_end) a moment later, whether the
heartbeat runs in the driver (``start_query``'s foreachBatch) or in a sink-runner worker of
Spark's (PySpark's own ``writeStream.format("exactly.files")``). Real Spark, local[2], a 2 s
lease renewed every 0.5 s."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query

STALE_AFTER = "2"  # exactly.leaseStaleAfterSeconds: a heartbeat every 0.5 s
BEATS = 1.2  # seconds watched after the stop: more than two heartbeats


def _input(spark):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", 10**9).option("maxRowsPerTrigger", 10).load().select("id"))


def _lease(out: Path) -> dict:
    return json.loads((out / "_exactly" / "lease.json").read_text())


def _heartbeats(run_id: str) -> list[threading.Thread]:
    """This process's heartbeat threads of ``run_id`` (LeaseKeeper names them)."""
    return [t for t in threading.enumerate()
            if t.name == f"exactly-lease-{run_id[:8]}" and t.is_alive()]


def _wait(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _renewed_by_a_heartbeat(query, out: Path) -> None:
    """Wait until the run holds the lease and a heartbeat renewed it between commits."""
    run_id = str(query.runId)

    def renewed() -> bool:
        try:
            lease = _lease(out)
        except (FileNotFoundError, ValueError):
            return False
        return lease["run_id"] == run_id and lease["renewed_at"] > lease["acquired_at"]

    _wait(renewed, "the run's lease, renewed")


def _renewed_no_more(out: Path) -> None:
    lease = out / "_exactly" / "lease.json"
    written = lease.stat().st_mtime_ns, lease.read_bytes()
    time.sleep(BEATS)
    assert (lease.stat().st_mtime_ns, lease.read_bytes()) == written, \
        "the lease was written after the query stopped"


def test_exactly_query_stop_returns_with_the_heartbeat_stopped_and_the_lease_released(
        spark, tmp_path):
    out = tmp_path / "out"
    exq = start_query(_input(spark), sink_format="exactly.files", path=str(out),
                      options={"exactly.leaseStaleAfterSeconds": STALE_AFTER},
                      checkpoint=CheckpointConfig(storage=str(tmp_path / "ck"),
                                                  interval="200ms", history=False))
    run_id = str(exq.query.runId)
    _renewed_by_a_heartbeat(exq.query, out)
    assert _heartbeats(run_id), "start_query's heartbeat runs in this (the driver) process"
    exq.stop()
    assert _heartbeats(run_id) == []
    assert _lease(out)["run_id"] == run_id
    assert _lease(out).get("released_at") is not None
    _renewed_no_more(out)


@pytest.mark.parametrize("how", ["start_query", "pyspark"])
def test_a_plain_stop_ends_the_heartbeat_and_releases_the_lease(spark, tmp_path, how):
    """``query.stop()`` on Spark's own StreamingQuery: the heartbeat runs in the driver
    (start_query) or in a sink-runner worker that outlives the query (pyspark's own
    ``format("exactly.files")``); either way the lease is released a moment after the stop
    and written no more."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    if how == "start_query":
        query = start_query(_input(spark), sink_format="exactly.files", path=str(out),
                            options={"exactly.leaseStaleAfterSeconds": STALE_AFTER},
                            checkpoint=CheckpointConfig(storage=str(ck), interval="200ms",
                                                        history=False)).query
    else:
        query = (_input(spark).writeStream.format("exactly.files")
                 .option("checkpointLocation", str(ck))
                 .option("exactly.leaseStaleAfterSeconds", STALE_AFTER)
                 .trigger(processingTime="200 milliseconds").start(str(out)))
    run_id = str(query.runId)
    _renewed_by_a_heartbeat(query, out)
    query.stop()
    _wait(lambda: _lease(out).get("released_at") is not None, "the lease released",
          timeout=10)
    assert _lease(out)["run_id"] == run_id
    _wait(lambda: _heartbeats(run_id) == [], "the driver's heartbeat to end", timeout=5)
    _renewed_no_more(out)

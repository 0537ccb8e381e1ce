"""``foreachBatch`` keeps its committer across the epochs of a run: the owner check, the
lease and recovery happen once per run, and fencing still holds at every epoch's intent
check. Real Spark, local[2], the file sink through ``start_query``."""

from __future__ import annotations

import threading
import time

import pyarrow.dataset as ds
import pytest

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query
from exactly.procs import HOST_ID_ENV, driver_identity
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.committer import Committer
from exactly.protocol.lease import Lease

EPOCH_ROWS = 100


def _input(spark, rows: int):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", EPOCH_ROWS).load()
            .select("id"))


def _ids(out) -> list[int]:
    return sorted(ds.dataset(str(out), format="parquet").to_table()["id"].to_pylist())


def test_a_run_begins_once_and_a_second_driver_is_still_fenced_with_the_committer_kept(
        spark, tmp_path, monkeypatch):
    """Epochs 0 and 1 run under one begin of the run (owner, lease, recovery). The driver
    then pauses after epoch 1 is complete; another driver (on another host, whose clock runs
    ahead) takes the lease over meanwhile. The paused driver's kept committer does not take
    the lease again before epoch 2, so its tasks write -- and its intent check fences it:
    nothing of epoch 2 becomes visible, its pre-commits are aborted."""
    began: list[tuple[str, str]] = []
    begin_run = Committer.begin_run

    def counted(self, query_id, run_id, keep=()):
        began.append((query_id, run_id))
        return begin_run(self, query_id, run_id, keep)

    monkeypatch.setattr(Committer, "begin_run", counted)
    monkeypatch.setenv(HOST_ID_ENV, "host-a")  # this driver: judged by lease age elsewhere
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")
    query = start_query(_input(spark, 4 * EPOCH_ROWS), sink_format="exactly.files",
                        path=str(out), available_now=True,
                        options={"exactly.fault": "after_complete@1",
                                 "exactly.faultAction": f"pause:{hold}"},
                        checkpoint=CheckpointConfig(storage=str(tmp_path / "ck"))).query
    waiting = tmp_path / "hold.waiting"
    deadline = time.monotonic() + 120
    while not waiting.exists() and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert waiting.exists(), "the driver never reached the pause after epoch 1"
    assert began == [(str(query.id), str(query.runId))]  # epochs 0 and 1: begun once
    monkeypatch.setenv(HOST_ID_ENV, "host-b")  # the other driver, ahead of the store by 1 h
    other = Lease(out / "_exactly", clock=lambda: time.time() + 3600)
    assert other.acquire("run-b", driver_identity()) is True
    hold.unlink()
    with pytest.raises(Exception, match="fenced off"):
        query.awaitTermination()
    log = CommitLog(out / "_exactly")
    assert log.completed_epochs() == [0, 1]
    assert log.read_intent(2) is None
    assert _ids(out) == list(range(2 * EPOCH_ROWS))
    assert not list((out / "_staging").glob("*/*/task.json"))  # epoch 2's pre-commits
    assert len(began) == 1

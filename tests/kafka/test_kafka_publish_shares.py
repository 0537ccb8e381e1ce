"""Epochs published in shares (``exactly.kafka.publishShares``,
:mod:`exactly.connectors.kafka.shares`): each share by its own transactional producer with
its own marker, exactly once, from the committing process or as a Spark job on the
executors; a crash between shares or inside one, and a rescale of N with an epoch in
flight, leave every record once for ``read_committed`` readers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from json_records import ids, rows

from exactly.config import Mode
from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.connectors.kafka.publisher import read_marker, read_marker_record
from exactly.connectors.kafka.shares import (
    IN_SHARE,
    publish_share,
    published_through,
    split,
)
from exactly.connectors.kafka.sink import KafkaSink
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import FaultPoint, SimulatedCrash, fault_action, raise_simulated_crash
from exactly.testing.harness import ProtocolHarness


def options(broker, topic: str, shares: int, **extra: str) -> KafkaSinkOptions:
    return KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
        "transactionalIdPrefix": "shares", "kafka.transaction.timeout.ms": "20000",
        "exactly.kafka.publishShares": str(shares), **extra}, Mode.EXACTLY_ONCE)


def harness(broker, topic: str, log_dir: Path, shares: int, query_id: str | None = None,
            **extra: str) -> ProtocolHarness[KafkaSink]:
    settings = SinkSettings(mode=Mode.EXACTLY_ONCE, log_dir=str(log_dir))
    return ProtocolHarness(KafkaSink(options(broker, topic, shares, **extra), settings),
                           settings, query_id=query_id)


def share_markers(h: ProtocolHarness[KafkaSink], shares: int) -> list[int]:
    return [read_marker(h.sink.options, h.query_id, share=i) for i in range(shares)]


def test_each_share_commits_its_rows_and_its_marker_once_an_empty_share_its_marker_only(
        broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path, shares=3)
    h.run_epoch(0, [[rows(0, 5)], [rows(5, 5)], [rows(10, 5)], [rows(15, 5)]])
    h.run_epoch(1, [[rows(20, 5)], [rows(25, 5)]])  # share 2 holds nothing this epoch
    assert ids(broker, topic) == list(range(30))
    assert ids(broker, topic, "read_uncommitted") == list(range(30))  # nothing produced twice
    assert share_markers(h, 3) == [2, 2, 2]
    assert read_marker(h.sink.options, h.query_id) == 0  # the one producer's: never used
    assert read_marker_record(h.sink.options, h.query_id, share=2)[1] == {
        "epoch": 1, "share": 2, "shares": 3}
    assert published_through(h.sink.options, h.query_id) == 2
    assert h.sink.target_state(h.query_id).progress == 1
    assert not list((tmp_path / "staging").rglob("*.arrow"))  # published, then removed


def test_a_crash_between_shares_publishes_only_the_missing_ones_after_the_restart(
        broker, topic, tmp_path):
    """The intent is durable, share 0 committed, the driver died before share 1: the
    restart's recovery skips share 0 (its marker is past the epoch) and publishes 1 and 2."""
    h = harness(broker, topic, tmp_path, shares=3)
    handles = h.tasks(0, [[rows(0, 4)], [rows(4, 4)], [rows(8, 4)]])
    with h.crash_at(FaultPoint.AFTER_INTENT, 0):
        h.commit(0, handles)
    sink = h.sink
    publish_share(sink.options, sink.stage, h.query_id, 0, 0, 3, split(handles, 3)[0])
    assert ids(broker, topic) == [0, 1, 2, 3]  # share 0 alone is visible, whole
    h.restart()
    assert h.recover()
    assert ids(broker, topic) == list(range(12))
    assert ids(broker, topic, "read_uncommitted") == list(range(12))  # share 0 once
    assert share_markers(h, 3) == [1, 1, 1]


def test_a_crash_inside_a_share_leaves_its_transaction_aborted_by_the_restarts_producer(
        broker, topic, tmp_path):
    """Inside share 0's transaction (its records produced and flushed, the commit not
    sent): nothing of the epoch is visible; the restart's share 0 producer aborts it and
    publishes each share once."""
    h = harness(broker, topic, tmp_path, shares=2, **{"exactly.fault": f"{IN_SHARE}@0"})
    handles = h.tasks(0, [[rows(0, 4)], [rows(4, 4)]])
    with fault_action(raise_simulated_crash), pytest.raises(SimulatedCrash):
        h.commit(0, handles)
    assert ids(broker, topic) == []
    assert ids(broker, topic, "read_uncommitted") == [0, 1, 2, 3]  # in share 0's open txn
    h.restart()
    h.sink.options = dataclasses.replace(h.sink.options, fault=None)
    assert h.recover()
    assert ids(broker, topic) == list(range(8))
    assert share_markers(h, 2) == [1, 1]


def test_a_rescale_of_the_shares_publishes_the_epoch_in_flight_in_the_shares_it_began_in(
        broker, topic, tmp_path):
    """Epoch 0's intent was written with 3 shares and nothing published; the next run has
    2: the recovery publishes epoch 0 in 3 shares (its pre-commits say so), the next epoch
    in 2, and the target holds both whole."""
    h = harness(broker, topic, tmp_path, shares=3)
    handles = h.tasks(0, [[rows(0, 3)], [rows(3, 3)], [rows(6, 3)]])
    with h.crash_at(FaultPoint.AFTER_INTENT, 0):
        h.commit(0, handles)
    h.close()
    again = harness(broker, topic, tmp_path, shares=2, query_id=h.query_id)
    assert again.recover()
    assert share_markers(again, 3) == [1, 1, 1]
    again.run_epoch(1, [[rows(9, 3)], [rows(12, 3)]])
    assert share_markers(again, 3) == [2, 2, 1]  # share 2 was of epoch 0 only
    assert ids(broker, topic) == list(range(15))
    # share 0 names 2 shares now: the target holds every share of epoch 1
    assert published_through(again.sink.options, again.query_id) == 2


def test_shares_run_as_a_spark_job_and_a_share_task_killed_inside_its_transaction_is_retried_by_the_next_run(  # noqa: E501
        broker, topic, tmp_path, spark):
    """With the committing process's Spark session bound (foreachBatch) the shares are a
    Spark job's tasks; a share's Python worker SIGKILLed inside its transaction fails the
    job and the commit; the next run's recovery publishes every share once."""
    marker = tmp_path / "fired.json"
    h = harness(broker, topic, tmp_path, shares=2, **{
        "exactly.fault": f"{IN_SHARE}@1", "exactly.faultMarker": str(marker)})
    h.sink.bind_commit_session(spark)
    h.run_epoch(0, [[rows(0, 5)], [rows(5, 5)]])
    assert ids(broker, topic) == list(range(10))
    handles = h.tasks(1, [[rows(10, 5)], [rows(15, 5)]])
    with pytest.raises(Exception, match=r"(?i)python worker|crash|exited|EOF"):
        h.commit(1, handles)
    assert marker.exists()  # the share's task died at kafka.in_share
    assert ids(broker, topic)[:10] == list(range(10))
    h.restart()
    h.sink.bind_commit_session(spark)
    assert h.recover()
    assert ids(broker, topic) == list(range(20))
    assert share_markers(h, 2) == [2, 2]

"""The test kit itself (exactly.testing.harness): its simulations hold their promises."""

from __future__ import annotations

import pyarrow as pa
import pytest

from exactly.connectors.files.sink import FileSink
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness


@pytest.fixture
def h(tmp_path) -> ProtocolHarness:
    return ProtocolHarness(FileSink(str(tmp_path / "out")))


def batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


def test_tasks_carry_the_query_the_run_and_attempts_unique_in_the_run(h):
    first = h.tasks(0, [batch(1), batch(2), []])
    again = h.tasks(0, [batch(1)])
    assert [t.partition for t in first] == [0, 1]  # the empty partition has no handle
    assert {t.query_id for t in first + again} == {h.query_id}
    assert {t.run_id for t in first + again} == {h.run_id}
    assert len({t.attempt for t in first + again}) == 3


def test_a_crash_that_never_fires_fails_the_test(h):
    with pytest.raises(AssertionError, match="never fired"), \
            h.crash_at(FaultPoint.AFTER_INTENT, epoch=5):
        h.run_epoch(0, [batch(1)])  # epoch 0 < 5: the crash is not reached


def test_a_crashed_driver_does_nothing_until_a_restart(h):
    handles = h.tasks(0, [batch(1)])
    query, run = h.query_id, h.run_id
    with h.crash_at(FaultPoint.BEFORE_INTENT) as crash:
        h.commit(0, handles)
    assert crash.fired_in == 0
    with pytest.raises(RuntimeError, match="restart"):
        h.commit(0, handles)
    assert h.restart() != run and h.query_id == query
    h.commit(0, h.tasks(0, [batch(1)]))
    assert h.completion(0)["rows"] == 1


def test_a_restart_ends_the_dead_drivers_lease_heartbeat_and_close_ends_the_last(h):
    """A crashed driver's threads die with its process: after a restart only the new run's
    heartbeat renews the sink's lease, and ``close`` (the test is over) ends that one too."""
    from exactly.protocol.lease import keepers

    h.run_epoch(0, [batch(1)])
    first = h.run_id
    assert [k.run_id for k in keepers(first)] == [first]
    with h.crash_at(FaultPoint.AFTER_COMPLETE):
        h.run_epoch(1, [batch(2)])
    second = h.restart()
    h.run_epoch(2, [batch(3)])
    assert keepers(first) == [] and [k.run_id for k in keepers(second)] == [second]
    h.close()
    assert keepers() == []


def test_a_crash_in_a_task_leaves_the_driver_alive(h):
    with h.crash_at(FaultPoint.IN_WRITE):
        h.tasks(0, [batch(1)])
    assert len(h.pre_commits()) == 1  # the killed attempt's staging, not cleaned up
    h.run_epoch(0, [batch(1)])  # Spark's retry of the task, in the same run
    assert h.pre_commits() == []


def test_a_simulated_crash_passes_every_except_exception(h):
    caught = []
    with h.crash_at(FaultPoint.AFTER_INTENT):
        try:
            h.run_epoch(0, [batch(1)])
        except Exception as exc:  # what protocol code may catch: never a crash
            caught.append(exc)
    assert caught == []


def test_pause_at_runs_while_the_driver_stands_at_the_point(h):
    seen = []
    with h.pause_at(FaultPoint.AFTER_INTENT, 0, lambda: seen.append(h.intent(0) is not None)):
        h.run_epoch(0, [batch(1)])
    assert seen == [True]
    assert h.completion(0) is not None  # and then the commit went on


def test_another_live_driver_cannot_take_a_lease_this_process_holds(h):
    h.run_epoch(0, [batch(1)])
    with pytest.raises(RuntimeError, match="fenced off"), h.other_live_driver():
        pass

"""The commit protocol (docs/design.md section 3), one specification for every exactly-once sink.

Each scenario runs over every sink of sink_cases.py (files and SQLite write-ahead in the
fast lane; PostgreSQL 2PC, PostgreSQL write-ahead, PostgreSQL upsert and Kafka with the
``server`` marker) through :class:`exactly.testing.harness.ProtocolHarness`: real tasks,
real commits, crashes raised exactly where a SIGKILL would stop, restarts as new drivers.
A scenario that does not apply to a sink is collected as skipped, with the reason.

Input (sink_cases.partitions): epoch n has three partitions -- ids n*100+0..4, n*100+5..9
and an empty one, which pre-commits nothing.
"""

from __future__ import annotations

import pytest
from sink_cases import ids, over_sinks

from exactly.config import Mode
from exactly.errors import DataLossError, FencedError
from exactly.protocol.contract import Handle
from exactly.protocol.faults import FaultPoint
from exactly.protocol.recovery import recover_on_new_driver
from exactly.testing.harness import ProtocolHarness

#: tasks write before the intent (step 2b) of their epoch is durable
UNDECIDED = (FaultPoint.IN_WRITE, FaultPoint.BEFORE_INTENT)
NOT_FOR_IDEMPOTENT = ("its rows are visible when the task ends and cannot be taken back "
                      "(idempotent upserts): there is no pre-commit to hold back or abort")


def keys(handles: list[Handle]) -> set[str]:
    return {h.key for h in handles}


# -- step 2: visibility ------------------------------------------------------------------
@over_sinks(only=lambda c: not c.visible_at_task_end, why_not=NOT_FOR_IDEMPOTENT)
def test_nothing_is_visible_before_the_commit_and_everything_after(case):
    h = case.harness()
    handles = h.tasks(0, case.rows(0))
    assert len(handles) == 2  # the empty partition pre-committed nothing
    assert h.visible() == [] and case.written() == []
    assert keys(h.pre_commits()) == keys(handles)
    h.commit(0, handles)
    assert h.visible() == ids(0)
    assert h.pre_commits() == []
    assert h.completion(0)["rows"] == 10


@over_sinks()
def test_a_replay_of_a_complete_epoch_makes_nothing_visible_twice(case):
    """Killed after "complete", before Spark's commit log: Spark replays the epoch; the
    replay's pre-commits are aborted (nothing of them reaches the target, in any state)."""
    h = case.harness()
    h.run_epoch(0, case.rows(0))
    h.restart()
    h.commit(0, h.tasks(0, case.rows(0)))
    assert h.visible() == ids(0)
    assert case.written() == ids(0)
    assert h.pre_commits() == []


# -- crashes -----------------------------------------------------------------------------
@over_sinks()
@pytest.mark.parametrize("point", list(FaultPoint), ids=[p.value for p in FaultPoint])
def test_killed_at_any_protocol_point_every_row_is_visible_exactly_once_after_restart(
        case, point):
    """Epoch 1 is killed at ``point``; a new driver replays it and goes on with epoch 2."""
    h = case.harness()
    h.run_epoch(0, case.rows(0))
    with h.crash_at(point, epoch=1):
        h.commit(1, h.tasks(1, case.rows(1)))
    if not case.visible_at_task_end and point in (*UNDECIDED, FaultPoint.AFTER_INTENT):
        assert h.visible() == ids(0)  # nothing of epoch 1 before its commits
    h.restart()
    h.commit(1, h.tasks(1, case.rows(1)))  # Spark replays epoch 1
    h.run_epoch(2, case.rows(2))

    assert h.visible() == ids(0, 1, 2)
    assert case.written() == ids(0, 1, 2)
    assert h.pre_commits() == []
    assert h.incomplete_intents() == []
    if point is FaultPoint.AFTER_COMMITS:  # every handle's commit recognised as done
        assert h.completion(1)["already_committed"] == 2
    if point is FaultPoint.BETWEEN_COMMITS:
        assert h.completion(1)["already_committed"] == case.already_committed_between_commits


@over_sinks(only=lambda c: not c.visible_at_task_end, why_not=NOT_FOR_IDEMPOTENT)
@pytest.mark.parametrize("recovery", ["at_start", "at_first_commit"])
def test_orphans_of_a_dead_run_are_aborted_by_the_next_runs_recovery(case, recovery):
    """The driver died while epoch 1's tasks ran (one of them twice): no intent names their
    pre-commits. The next run's recovery aborts them -- before its first epoch, or in its
    first commit, where it keeps the pre-commits of that commit."""
    h = case.harness()
    h.run_epoch(0, case.rows(0))
    orphans = h.tasks(1, case.rows(1)) + h.tasks(1, case.rows(1)[:1])
    h.restart()
    assert keys(h.pre_commits()) == keys(orphans)
    if recovery == "at_start":
        assert h.recover() is True
        assert h.pre_commits() == []
    h.commit(1, h.tasks(1, case.rows(1)))
    assert h.visible() == ids(0, 1)
    assert h.pre_commits() == []


@over_sinks(only=lambda c: not c.visible_at_task_end, why_not=NOT_FOR_IDEMPOTENT)
def test_an_attempt_spark_discarded_is_swept_when_its_epoch_commits(case):
    """A live run: a speculative duplicate (or a failed attempt's pre-commit) of epoch 1 is
    in no commit call; it is aborted once epoch 1 commits."""
    h = case.harness()
    h.run_epoch(0, case.rows(0))
    discarded = h.tasks(1, case.rows(1)[:1])
    handles = h.tasks(1, case.rows(1))
    h.commit(1, handles)
    assert discarded[0].key not in keys(h.pre_commits())
    assert h.pre_commits() == []
    assert h.visible() == ids(0, 1)


@over_sinks()
def test_a_task_that_fails_aborts_its_own_transaction(case):
    """An error inside ``write()`` (not a kill): the task aborts what it wrote."""
    h = case.harness()
    with h.fail_at(FaultPoint.IN_WRITE, epoch=0):
        h.tasks(0, case.rows(0))
    assert h.pre_commits() == []
    assert h.visible() == []
    h.run_epoch(0, case.rows(0))  # the retried tasks
    assert h.visible() == ids(0)


# -- step 3: Spark's abort ---------------------------------------------------------------
@over_sinks(only=lambda c: not c.visible_at_task_end, why_not=NOT_FOR_IDEMPOTENT)
def test_sparks_abort_drops_pre_commits_without_an_intent_and_keeps_an_intents(case):
    h = case.harness()
    h.abort(0, h.tasks(0, case.rows(0)))  # the epoch failed before its commit
    assert h.pre_commits() == [] and h.visible() == []

    handles = h.tasks(0, case.rows(0))
    with h.fail_at(FaultPoint.AFTER_INTENT, epoch=0):
        h.commit(0, handles)  # the commit call fails after the intent is durable
    h.abort(0, handles)  # Spark aborts the epoch: the intent decided it, it will commit
    assert keys(h.pre_commits()) == keys(handles)
    h.restart()
    h.commit(0, h.tasks(0, case.rows(0)))
    assert h.visible() == ids(0)
    assert h.pre_commits() == []


@over_sinks(only=lambda c: not c.visible_at_task_end, why_not=NOT_FOR_IDEMPOTENT)
def test_a_vanished_pre_commit_named_by_an_intent_is_data_loss(case):
    h = case.harness()
    handles = h.tasks(0, case.rows(0))
    with h.crash_at(FaultPoint.AFTER_INTENT, epoch=0):
        h.commit(0, handles)
    h.sink.abort(handles[1])  # something outside exactly removes a pre-commit
    h.restart()
    with pytest.raises(DataLossError, match="partition 1"):
        h.commit(0, h.tasks(0, case.rows(0)))


# -- step 5: fencing ---------------------------------------------------------------------
@over_sinks()
def test_a_second_live_instance_is_fenced_and_commits_nothing(case):
    """Another driver of the query is alive and holds the lease: this instance's commit
    fails with FencedError before its intent, and it touches none of the other's
    pre-commits. Once the other is dead, a new run takes over and cleans up after both."""
    h = case.harness()
    with h.other_live_driver() as first:
        held = h.tasks(0, case.rows(0), run=first)  # the live instance is in epoch 0
        mine = h.tasks(0, case.rows(0))
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            h.commit(0, mine)
        assert h.intent(0) is None and h.completion(0) is None
        if not case.visible_at_task_end:
            assert h.visible() == []
            assert keys(h.pre_commits()) == keys(held + mine)
        if h.sink.recover_before_first_epoch:  # a new driver's start-up recovery waits too
            before = keys(h.pre_commits())
            assert recover_on_new_driver(h.sink, h.settings) is False
            assert keys(h.pre_commits()) == before
    h.restart()
    h.commit(0, h.tasks(0, case.rows(0)))
    assert h.visible() == ids(0)
    assert h.pre_commits() == []


# -- at-least-once mode ------------------------------------------------------------------
@over_sinks()
def test_at_least_once_rows_are_visible_when_the_task_ends_and_a_replay_repeats_them(case):
    h: ProtocolHarness = case.harness(Mode.AT_LEAST_ONCE)
    handles = h.tasks(0, case.rows(0))
    assert h.visible() == ids(0)  # no commit needed
    h.commit(0, handles)
    assert h.visible() == ids(0)
    h.restart()
    h.commit(0, h.tasks(0, case.rows(0)))  # the replay after a crash writes them again
    assert h.visible() == (ids(0) if case.keyed else sorted(ids(0) * 2))
    assert h.pre_commits() == []

"""The package's one retry policy (exactly.retry) and the callers built on it."""

from __future__ import annotations

import json
import logging

import pytest

from exactly.protocol.faults import SimulatedCrash
from exactly.retry import retry_call


class Flaky:
    def __init__(self, failures: int, exc: BaseException) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "done"


def transient(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def test_transient_errors_are_retried_and_each_retry_is_logged(caplog):
    step = Flaky(2, ConnectionError("lost"))
    with caplog.at_level(logging.WARNING, logger="exactly.retry"):
        assert retry_call(step, what="probe", transient=transient, seconds=10,
                          initial=0.001, epoch=4) == "done"
    assert step.calls == 3
    # only this call's events: a thread another test left in this worker may retry meanwhile
    events = [e for e in (json.loads(r.getMessage()) for r in caplog.records)
              if e.get("call") == "probe"]
    assert [(e["event"], e["call"], e["attempt"], e["epoch"]) for e in events] == [
        ("retry", "probe", 1, 4), ("retry", "probe", 2, 4)]
    assert events[0]["error"] == "ConnectionError: lost"


def test_other_errors_and_crashes_are_raised_at_once():
    step = Flaky(5, ValueError("bad"))
    with pytest.raises(ValueError):
        retry_call(step, what="probe", transient=transient, seconds=10)
    assert step.calls == 1
    crash = Flaky(5, SimulatedCrash("kafka.in_transaction", 1))
    with pytest.raises(SimulatedCrash):
        retry_call(crash, what="probe", transient=lambda exc: True, seconds=10)
    assert crash.calls == 1


def test_it_gives_up_with_the_last_error_at_the_deadline_or_the_attempt_limit():
    step = Flaky(100, ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down"):
        retry_call(step, what="probe", transient=transient, seconds=0.2, initial=0.01,
                   maximum=0.02)
    assert 2 < step.calls < 100
    step = Flaky(100, ConnectionError("down"))
    with pytest.raises(ConnectionError):
        retry_call(step, what="probe", transient=transient, attempts=3, initial=0.001)
    assert step.calls == 3


def test_before_retry_runs_between_attempts_only():
    resets = []
    step = Flaky(2, ConnectionError("lost"))
    retry_call(step, what="probe", transient=transient, attempts=5, initial=0.001,
               before_retry=lambda: resets.append(step.calls))
    assert resets == [1, 2]


def test_a_bound_is_required():
    with pytest.raises(ValueError, match="seconds"):
        retry_call(lambda: 1, what="probe", transient=transient)


def test_sql_retrying_hides_the_password_and_names_the_step():
    import psycopg

    from exactly.connectors.sql import DatabaseError, retrying

    dsn = "postgresql://u:hunter2@127.0.0.1:1/db"

    def step() -> None:
        raise psycopg.OperationalError(f"connection to {dsn} failed")

    with pytest.raises(DatabaseError, match="reading a marker") as info:
        retrying(step, seconds=0.2, what="reading a marker", dsn=dsn)
    assert "hunter2" not in str(info.value)

"""``repeats`` in the restart history: how many failures in a row had the same root cause."""

from exactly.checkpoint.restarts import RestartHistory, cause_key

UDF = "PythonException: ValueError: bad row 17 in epoch {}"


def fail(history: RestartHistory, cause: str) -> int:
    repeats = history.repeats(cause)
    history.append("failure", kind="query", cause=cause, action="restart", repeats=repeats)
    return repeats


def test_numbers_in_a_cause_do_not_make_it_another_cause():
    assert cause_key("task 3.0 in stage 12.1 (TID 40) failed: epoch 5") == cause_key(
        "task 1.0 in stage 14.0 (TID 52) failed: epoch 6")
    assert cause_key("query 1b4e28ba-2fa1-11d2-883f-0016d3cca427 at 0x7f3a2c") == cause_key(
        "query 6f1c0b1e-9a3d-4c1e-b2aa-d0e1f2a3b4c5 at 0x55e0c1")
    assert cause_key("OSError: [Errno 30] Read-only file system") != cause_key(
        "OSError: [Errno 13] Permission denied")


def test_repeats_counts_the_same_cause_in_a_row_and_starts_over_at_another(tmp_path):
    history = RestartHistory(tmp_path, "run")
    assert [fail(history, UDF.format(n)) for n in (5, 6, 7)] == [1, 2, 3]
    assert fail(history, "OSError: [Errno 28] No space left on device") == 1
    assert fail(history, UDF.format(9)) == 1  # another cause came between
    assert fail(history, UDF.format(9)) == 2
    assert [e["repeats"] for e in history.entries()] == [1, 2, 3, 1, 1, 2]


def test_a_recovery_ends_the_row_and_other_runs_do_not_count(tmp_path):
    old = RestartHistory(tmp_path, "old-run")
    fail(old, UDF.format(1))
    history = RestartHistory(tmp_path, "run")
    assert fail(history, UDF.format(2)) == 1  # the earlier run's failure is not this run's
    history.append("recovered", epoch=3, recovery_s=0.5)
    assert history.repeats(UDF.format(4)) == 1  # an epoch completed since: a new row
    fail(history, UDF.format(4))
    history.append("restore", detail="an event that is not a failure")
    assert history.repeats(UDF.format(5)) == 2

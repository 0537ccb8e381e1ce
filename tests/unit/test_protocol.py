"""The commit protocol on the file sink: what tests/contract does not cover.

The protocol's scenarios (visibility, replays, a crash at every point, orphans, Spark's
abort, data loss, fencing, at-least-once) run over every sink in
tests/contract/test_commit_protocol.py.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.connectors.files.sink import FileSink
from exactly.errors import OwnershipError
from exactly.protocol.contract import TaskInfo
from exactly.protocol.faults import FaultPoint, FaultSpec, fault_from, maybe_crash
from exactly.protocol.task import slowest, write_task
from exactly.testing.harness import ProtocolHarness


def visible_ids(root: Path) -> list[int]:
    files = [str(f) for f in data_files(root)] if root.exists() else []
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


def test_a_different_query_cannot_write_into_an_owned_output(tmp_path):
    sink = FileSink(str(tmp_path / "out"))
    batch = pa.record_batch({"id": [1, 2, 3]})
    ProtocolHarness(sink).run_epoch(0, [batch])
    other = ProtocolHarness(sink)  # another query (a new checkpoint), the same output path
    with pytest.raises(OwnershipError, match="new, empty output path"):
        other.run_epoch(1, [batch])
    assert visible_ids(sink.root) == [1, 2, 3]


def test_fault_spec_parsing_rejects_unknown_points():
    assert FaultSpec.parse("after_intent@3").min_epoch == 3
    assert FaultSpec.parse("IN_WRITE").point == FaultPoint.IN_WRITE
    assert FaultSpec.parse("kafka.in_transaction@2").point == "kafka.in_transaction"
    with pytest.raises(ValueError, match="unknown"):
        FaultSpec.parse("after_lunch")


def test_a_pause_action_stalls_at_the_point_until_its_file_is_removed(tmp_path):
    """The action pause:FILE (option exactly.faultAction, flag --fault-action): a hung
    driver at the point (used to restart a server in the middle of a commit); it signals
    FILE.waiting and goes on once FILE is gone."""
    import threading

    hold = tmp_path / "hold"
    hold.write_text("")
    spec = fault_from({"exactly.fault": "after_intent@0",
                       "exactly.faultAction": f"pause:{hold}"})
    passed = threading.Event()

    def reach_the_point() -> None:
        maybe_crash(spec, FaultPoint.AFTER_INTENT, 3)
        passed.set()

    worker = threading.Thread(target=reach_the_point)
    worker.start()
    waiting = tmp_path / "hold.waiting"
    for _ in range(200):
        if waiting.exists():
            break
        threading.Event().wait(0.05)
    assert waiting.exists() and not passed.is_set()
    hold.unlink()
    worker.join(timeout=10)
    assert passed.is_set()


def test_the_completion_keeps_the_slowest_pre_commit_of_the_handles_it_committed(tmp_path):
    """The history's ``sink_pre_commit`` part: each task times its pre-commit; the commit
    keeps the slowest in the completion record, and a commit that finishes an earlier
    call's intent (whose handles the new tasks are not) records none."""
    sink = FileSink(str(tmp_path / "out"))
    h = ProtocolHarness(sink)
    batch = pa.record_batch({"id": list(range(1000))})

    def tasks(epoch: int, first_attempt: int) -> list:
        return [write_task(sink, TaskInfo(h.query_id, h.run_id, epoch, p, first_attempt + p),
                           [batch]) for p in range(2)]

    done = tasks(0, 0)
    assert all(o.handle is not None and o.pre_commit_ms > 0 for o in done), done
    h.committer.commit_epoch(0, [o.handle for o in done],
                             pre_commit_ms=slowest(o.pre_commit_ms for o in done))
    assert h.completion(0)["pre_commit_ms"] == max(o.pre_commit_ms for o in done)

    first = tasks(1, 2)
    with h.fail_at(FaultPoint.AFTER_INTENT, epoch=1):
        h.committer.commit_epoch(1, [o.handle for o in first], pre_commit_ms=1.0)
    retried = tasks(1, 4)  # Spark retries the epoch: new tasks, the intent still decides
    h.committer.commit_epoch(1, [o.handle for o in retried], pre_commit_ms=2.0)
    assert "pre_commit_ms" not in h.completion(1)
    assert slowest([None, None]) is None


def test_a_kept_committer_neither_lists_nor_looks_up_its_log_after_its_first_epoch(
        tmp_path, monkeypatch):
    """Per epoch, a committer kept across a run's epochs writes its lease check, intent and
    completion, and prunes from what it knows: no listing of the commit log and no lookup
    of the next epoch's completion or intent (this run writes each epoch once; another run
    that wrote them holds the lease and the intent check fences this one). Pruning still
    keeps the newest ``retain_epochs`` and recovery still reads what a new run needs."""
    from exactly.checkpoint.store import LocalLogStore
    from exactly.protocol.commitlog import CommitLog
    from exactly.protocol.contract import SinkSettings

    sink = FileSink(str(tmp_path / "out"))
    h = ProtocolHarness(sink, SinkSettings(retain_epochs=2),
                        visible=lambda: visible_ids(sink.root))
    h.run_epoch(0, [pa.record_batch({"id": [0]})])  # the run's first epoch: begins, lists
    calls: list[tuple[str, str]] = []

    def counting(method: str):
        real = getattr(LocalLogStore, method)

        def counted(self, name, *rest):
            calls.append((method, name))
            return real(self, name, *rest)
        return counted

    for method in ("list", "read", "read_versioned", "exists"):
        monkeypatch.setattr(LocalLogStore, method, counting(method))
    for epoch in range(1, 5):
        h.run_epoch(epoch, [pa.record_batch({"id": [epoch]})])
    assert [c for c in calls if c[0] == "list"] == []
    assert [c for c in calls if c[1].startswith(("complete/", "intents/"))] == []
    assert ("read", "query.json") not in calls  # the owner is checked once per run
    monkeypatch.undo()
    assert CommitLog(sink.log_directory).completed_epochs() == [3, 4]
    assert h.visible() == [0, 1, 2, 3, 4]
    h.restart()  # a new run looks its epoch up again: the replay of epoch 4 is recognised
    h.run_epoch(4, [pa.record_batch({"id": [4]})])
    assert h.visible() == [0, 1, 2, 3, 4]

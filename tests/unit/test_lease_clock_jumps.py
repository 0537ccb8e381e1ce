"""Clock jumps against the lease (issue 28): two holders of one lease on a real store (a
local directory, ``flock`` compare-and-swap); one holder's clock jumps forward (it takes over
early) or back (it believes it still holds). Safety: the fenced holder never commits after
the other took over, whatever the clocks say. Liveness may suffer only until the lease's
timeout (``stale_after``).

Each holder is a driver on its own host (a ProcessId of another host name), so neither can
check the other's pid and each judges the other by the lease's age only, as on two machines.
Time passing for a holder is a jump of its own clock; time passing for the store is its
lease file's write time set back (``_age``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.connectors.files.sink import FileSink
from exactly.errors import FencedError
from exactly.procs import ProcessId
from exactly.protocol import committer as committer_module
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.committer import Committer
from exactly.protocol.contract import SinkSettings, TaskInfo
from exactly.protocol.lease import Lease
from exactly.protocol.task import write_task
from exactly.testing.nemesis.clock import JumpingClock

STALE = 60.0
HOST_A = ProcessId("host-a", 41, 7)
HOST_B = ProcessId("host-b", 42, 8)


def test_a_holder_whose_clock_jumps_back_believes_it_holds_but_is_fenced_once_another_took_over(
        tmp_path):
    clock_a, clock_b = JumpingClock(), JumpingClock()
    a = Lease(tmp_path, stale_after=STALE, clock=clock_a)
    b = Lease(tmp_path, stale_after=STALE, clock=clock_b)
    a.acquire("run-a", HOST_A)
    with pytest.raises(FencedError, match="run-a holds it"):
        b.acquire("run-b", HOST_B)  # fresh: B waits
    clock_b.jump(STALE + 1)  # B's clock runs ahead: it takes over early
    assert b.acquire("run-b", HOST_B) is True
    clock_a.jump(-3600)  # A's clock goes back: by its own clock its lease is brand new
    with pytest.raises(FencedError, match="run-b holds it"):
        a.verify("run-a", CommitLog.intent_record(5, "run-a", []))
    assert a.renew("run-a") is False
    with pytest.raises(FencedError, match="run-b holds it"):
        a.acquire("run-a", HOST_A)  # nor can it take the lease back while B renews it
    assert b.verify("run-b") == 2
    assert a.current().run_id == "run-b" and a.pending_intent() is None


def test_a_holder_whose_clock_ran_ahead_delays_a_takeover_by_no_more_than_the_lease_timeout(
        tmp_path):
    """The holder wrote its renewal with a clock a day ahead and then died; the lease is
    taken over ``stale_after`` after its last write, not a day later."""
    clock_a, clock_b = JumpingClock(), JumpingClock()
    clock_a.jump(86400)
    Lease(tmp_path, stale_after=STALE, clock=clock_a).acquire("run-a", HOST_A)
    b = Lease(tmp_path, stale_after=STALE, clock=clock_b)
    with pytest.raises(FencedError):
        b.acquire("run-b", HOST_B)
    clock_b.jump(STALE + 1)  # the lease's timeout passes for B
    assert b.acquire("run-b", HOST_B) is True


def test_a_holder_whose_clock_jumped_back_renews_its_lease_at_its_next_check(tmp_path):
    """After its clock went back, the holder's check (step 2b) still renews the lease: it
    is not taken from a live holder because its renewals looked recent by its own clock."""
    clock_a, clock_b = JumpingClock(), JumpingClock()
    a = Lease(tmp_path, stale_after=2.0, clock=clock_a)
    a.acquire("run-a", HOST_A)
    clock_a.jump(-3600)
    _age(tmp_path / "lease.json", 1.0)  # the lease file ages (by the store's clock)
    assert a.verify("run-a") == 1
    clock_b.jump(1.2)  # 2.2 s after the acquisition, ~1.2 s after the check, for B
    with pytest.raises(FencedError, match="run-a holds it"):
        Lease(tmp_path, stale_after=2.0, clock=clock_b).acquire("run-b", HOST_B)


def _age(path: Path, seconds: float) -> None:
    """The store's clock runs ``seconds`` on for ``path``: its write time is set back."""
    written = path.stat().st_mtime
    os.utime(path, (written - seconds, written - seconds))


def _ids(out) -> list[int]:
    files = [str(f) for f in data_files(out)] if out.exists() else []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist()) if files else []


def test_a_takeover_between_a_holders_lease_check_and_its_intent_loses_and_duplicates_nothing(
        tmp_path, monkeypatch):
    """A passes its lease check for epoch 1 (2b) and stops there; B's clock runs ahead, B
    takes the lease over and recovers (aborting pre-commits no intent names); then A goes
    on and writes its intent and commits. B replays epoch 1 as Spark would. Every row is
    visible exactly once and nothing is left pre-committed.

    Before the check recorded the intent in the lease, B's recovery aborted A's epoch-1
    pre-commits, A then wrote an intent naming them and marked the epoch complete, and B's
    replay was discarded as a replay: epoch 1 was lost."""
    out = tmp_path / "out"
    sink = FileSink(str(out))
    settings = SinkSettings(lease_stale_after=STALE)
    query = "query-1"
    who = {"id": HOST_A}
    monkeypatch.setattr(committer_module, "driver_identity", lambda: who["id"])
    a = Committer(sink, settings)
    clock_b = JumpingClock()
    b = Committer(FileSink(str(out)), settings)
    b.lease._clock = clock_b

    def tasks(run: str, epoch: int, first: int) -> list:
        handles = []
        for p in range(2):
            rows = pa.record_batch({"id": list(range(first + 50 * p, first + 50 * (p + 1)))})
            outcome = write_task(sink, TaskInfo(query, run, epoch, p, 10 * epoch + p), [rows])
            handles.append(outcome.handle)
        return handles

    a.commit_epoch(0, tasks("run-a", 0, 0))
    assert _ids(out) == list(range(100))

    real_verify = a.lease.verify
    took_over = []

    def verify_then_lose_the_lease(run_id, intent=None):
        generation = real_verify(run_id, intent) if intent is not None else real_verify(run_id)
        if not took_over:  # A stops here; B's clock runs ahead and B takes over
            who["id"] = HOST_B
            clock_b.jump(STALE + 1)
            b.begin_run(query, "run-b")
            who["id"] = HOST_A
            took_over.append(True)
        return generation

    monkeypatch.setattr(a.lease, "verify", verify_then_lose_the_lease)
    a_epoch_1 = tasks("run-a", 1, 100)
    with contextlib.suppress(FencedError):  # fenced at its intent, or it finishes that intent
        a.commit_epoch(1, a_epoch_1)  # A resumes after its check
    assert took_over
    who["id"] = HOST_B
    b.commit_epoch(1, tasks("run-b", 1, 100))  # Spark's replay of epoch 1 in B
    b.commit_epoch(2, tasks("run-b", 2, 200))
    assert _ids(out) == list(range(300))
    assert list(sink.list_pre_commits(query)) == []

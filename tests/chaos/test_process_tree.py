"""A killed job leaves no process behind: driver, driver JVM, PySpark worker daemons, workers.

PySpark's worker daemons move into process groups of their own, so killing the driver's
process group is not enough (docs/design.md section 9). These tests run the real ``exactly
pipeline`` job (Spark ``local[2]``) under the crash harness, look at its processes after its first
epoch -- and check that worker daemons really were outside the driver's process group, or
the test would prove nothing -- then check, right after the harness's kill, that none of
them and no process carrying the job's token is alive (a SIGKILLed process the kernel is
still tearing down gets 10 s to finish dying; one that was never killed would outlive them).
"""

from __future__ import annotations

import psutil
import pytest

from exactly.procs import ProcessInfo, is_alive, job_processes
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import Attempt, python_command, run_with_crashes

pytestmark = pytest.mark.chaos


class StopAfterFirstEpoch(Exception):
    """Raised by the test's hook: makes the harness end the attempt and kill the job."""


def pipeline(tmp, events, files_per_epoch: int = 2) -> list[str]:
    return python_command("pipeline", "--input", str(events), "--output", str(tmp / "out"),
                          "--checkpoint", str(tmp / "ck"),
                          "--max-files-per-epoch", str(files_per_epoch))


class Snapshot:
    """The job's processes as seen after its first epoch (found by the job's token)."""

    def __init__(self) -> None:
        self.procs: dict[int, list[psutil.Process]] = {}  # attempt -> its processes
        self.driver_pgid: dict[int, int] = {}
        self.daemons_elsewhere: dict[int, list[ProcessInfo]] = {}

    def take(self, attempt: Attempt) -> None:
        if attempt.number in self.procs:
            return
        procs = job_processes(attempt.token)
        infos = [ProcessInfo.of(p) for p in procs]
        driver = next(i for i in infos if "exactly.cli" in i.cmdline)
        self.procs[attempt.number] = procs
        self.driver_pgid[attempt.number] = driver.pgid
        self.daemons_elsewhere[attempt.number] = [
            i for i in infos if "pyspark.daemon" in i.cmdline and i.pgid != driver.pgid]

    def survivors(self, attempt: Attempt) -> list[ProcessInfo]:
        """Processes of the snapshot still alive. A SIGKILLed JVM can take the kernel a few
        seconds to tear down under load (its environment is gone already, so no scan finds
        it): give a dying process 10 s; one that was never killed outlives them."""
        procs = self.procs.get(attempt.number, [])
        _, still = psutil.wait_procs(procs, timeout=10)
        return [ProcessInfo.of(p) for p in still if is_alive(p)]


def test_no_process_of_a_job_outlives_a_driver_fault_or_the_harness_kill(events_dir,
                                                                         tmp_path):
    """Attempt 1 is killed by a driver-side fault (after_intent in epoch 3), which kills the
    job's tree from inside; attempt 2 (the restart) is killed by the harness from outside
    right after its first epoch (the test's hook raises). Both times the harness's kill and
    check run before the attempt's end hook, so whatever is alive then outlived them.

    One file an epoch (8 epochs): the job reports epochs by polling every 0.5 s, so attempt
    1 must live a few epochs past its first for the snapshot to be taken (with the commit in
    the driver, epoch 1 could reach its intent before epoch 0 was reported), and attempt 2
    must have epochs left when the harness kills it."""
    snapshot = Snapshot()
    after_end: dict[int, tuple[list[ProcessInfo], list[ProcessInfo]]] = {}
    tokens: dict[int, str] = {}

    def on_line(attempt: Attempt, event: dict) -> None:
        if event.get("event") == "epoch":
            snapshot.take(attempt)
            if attempt.number == 2:
                raise StopAfterFirstEpoch

    def on_end(attempt: Attempt) -> None:  # right after the harness's kill and check
        after_end[attempt.number] = (
            snapshot.survivors(attempt),
            [ProcessInfo.of(p) for p in job_processes(attempt.token)])

    with pytest.raises(StopAfterFirstEpoch):
        run_with_crashes(pipeline(tmp_path, events_dir, files_per_epoch=1),
                         [FaultSpec(FaultPoint.AFTER_INTENT, 3)], on_line=on_line,
                         on_end=on_end, on_start=lambda a: tokens.update({a.number: a.token}),
                         timeout=300)
    # attempt 2 ended by the exception: checked here at once, without waiting
    after_end[2] = (snapshot.survivors(_attempt(2, tokens[2])),
                    [ProcessInfo.of(p) for p in job_processes(tokens[2])])

    for number in (1, 2):
        assert snapshot.daemons_elsewhere[number], (
            f"attempt {number}: no worker daemon outside the driver's process group; this "
            "test would pass with a plain killpg")
        assert len(snapshot.procs[number]) > 2  # more than the Python driver and its JVM
        assert after_end[number] == ([], []), after_end[number]


def _attempt(number: int, token: str) -> Attempt:
    return Attempt(number, None, 0, None, token=token)

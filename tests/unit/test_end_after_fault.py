"""``run_with_crashes(end_after_fault=...)``: an attempt that outlives its fault (a Spark
Connect client retrying the server the fault killed) is ended by the harness, its whole
process tree killed, and the run goes on with the next attempt. No Spark: a stand-in job
that claims its fault marker, as a fault does, then hangs."""

from __future__ import annotations

import sys

from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import run_with_crashes

#: with --fault-marker: claim it as the fault does, start a child, hang (a client retrying
#: a dead server); without: exit 0 (the input drained)
HANGS_AFTER_ITS_FAULT = """
import json, os, subprocess, sys, time
if "--fault-marker" in sys.argv:
    marker = sys.argv[sys.argv.index("--fault-marker") + 1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, json.dumps({"point": "after_intent", "epoch": 0}).encode())
    os.close(fd)
    time.sleep(600)
"""


def test_an_attempt_still_running_after_its_fault_fired_is_ended_with_its_process_tree():
    attempts = run_with_crashes([sys.executable, "-c", HANGS_AFTER_ITS_FAULT],
                                [FaultSpec(FaultPoint.AFTER_INTENT, 0)], timeout=120,
                                end_after_fault=0.5)
    first, last = attempts
    assert first.crashed and first.fired == {"point": "after_intent", "epoch": 0}
    assert not first.timed_out and first.returncode != 0
    assert len(first.killed) == 2  # the job and the child it started, both killed
    assert not last.crashed and last.returncode == 0

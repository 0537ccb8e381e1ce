"""The warm spare driver's settings, its state in job.json and in the views, and the fault
schedule of ``exactly run --fault A@E1,B@E2`` (no Spark)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from exactly.checkpoint.location import job_dir
from exactly.checkpoint.status import JobStatus, claim_job, update_status
from exactly.errors import ConfigError
from exactly.monitoring.flink_metrics import job_values
from exactly.monitoring.overview import load as load_overview
from exactly.monitoring.overview import spare_view
from exactly.monitoring.terminal import spare_line
from exactly.ops.spare import SpareDriver, spare_choice, spare_conf
from exactly.procs import current_process


def test_auto_keeps_a_spare_except_on_spark_connect_where_on_is_refused_with_the_reason():
    assert spare_choice("auto", remote=None).wanted
    assert spare_choice("on", remote=None).wanted
    off = spare_choice("off", remote=None)
    assert not off.wanted and off.why == "--spare-driver off"
    on_connect = spare_choice("auto", remote="sc://127.0.0.1:15002")
    assert not on_connect.wanted and "runs in the server" in on_connect.why
    with pytest.raises(ConfigError, match=r"--spare-driver on.*Spark Connect"):
        spare_choice("on", remote="sc://127.0.0.1:15002")
    with pytest.raises(ConfigError, match="give one of auto, on, off"):
        spare_choice("sometimes", remote=None)
    cluster = spare_choice("auto", remote=None, master="spark://127.0.0.1:7077")
    assert not cluster.wanted and "waits for executors" in cluster.why
    assert spare_choice("on", remote=None, master="spark://127.0.0.1:7077").wanted
    assert spare_choice("auto", remote=None, master="local[4]").wanted


def test_a_spare_on_a_cluster_master_asks_for_no_executor_until_it_takes_over():
    """Local masters run the spare's tasks in its own JVM (nothing to hold back); on a
    cluster master its session starts with dynamic allocation at zero executors, and keeps
    the job's executor count as its ceiling."""
    assert spare_conf("local[2]", {}) == {}
    assert spare_conf("local-cluster[2,1,1024]", {}) == {}
    cluster = spare_conf("spark://127.0.0.1:7077", {"spark.executor.instances": "2"})
    assert cluster["spark.dynamicAllocation.enabled"] == "true"
    assert cluster["spark.dynamicAllocation.initialExecutors"] == "0"
    assert cluster["spark.dynamicAllocation.minExecutors"] == "0"
    assert cluster["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert cluster["spark.dynamicAllocation.maxExecutors"] == "2"
    own_cap = spare_conf("spark://h:7077", {"spark.executor.instances": "4",
                                            "spark.dynamicAllocation.maxExecutors": "3"})
    assert "spark.dynamicAllocation.maxExecutors" not in own_cap


def test_job_json_carries_the_spare_and_the_views_show_whether_it_is_ready(tmp_path):
    """The launcher's record of its spare survives the driver's own status writes; the
    overview, ``exactly checkpoints`` and the Flink-named metrics show it while the job
    runs, and nothing once it ended."""
    directory = job_dir(tmp_path)
    claim_job(directory, JobStatus("r1", current_process(), "running"))
    since = time.time() - 31
    spare = {"process": current_process().to_json(), "state": "ready", "since": since}
    update_status(directory, run_id="r1", spare=spare)
    update_status(directory, run_id="r1", state="running", last_epoch=4)  # a driver's beat
    status = JobStatus.read(directory)
    assert status is not None and status.spare == spare
    view = spare_view(status, "running")
    assert view == {"state": "ready", "pid": current_process().pid, "since": since}
    assert spare_line(view) == f"spare driver: ready (pid {current_process().pid}, for 31s)"
    assert spare_view(status, "stopped") is None
    update_status(directory, run_id="r1", spare=None)
    none = spare_view(JobStatus.read(directory), "running")
    assert none == {"state": "none", "pid": None, "since": None}
    assert "from scratch" in spare_line(none)

    update_status(directory, run_id="r1", spare={**spare, "state": "starting"})
    (tmp_path / "offsets").mkdir()  # a Spark checkpoint
    loaded = load_overview(str(tmp_path))
    assert loaded.overview.spare["state"] == "starting"
    ready = [v for m, _, v in job_values(loaded, time.time())
             if m.endswith("spareDriverReady")]
    assert ready == [0.0]
    update_status(directory, run_id="r1", spare=spare)
    ready = [v for m, _, v in job_values(load_overview(str(tmp_path)), time.time())
             if m.endswith("spareDriverReady")]
    assert ready == [1.0]


def test_a_spare_that_cannot_get_warm_reports_its_cause_and_one_told_nothing_exits(tmp_path):
    """The launcher's side of the two pipes, against a stand-in spare: a spare that fails
    its warm-up is ``dead`` with the cause it wrote; a killed one is ``dead`` with the
    signal; neither leaves a process."""
    failing = _start([sys.executable, "-c", "import os,sys; os.write(int(sys.argv[1]), "
                      "b'failed: ConfigError: no job\\n')"])
    deadline = time.monotonic() + 30
    while failing.poll() != "dead" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failing.failure == "ConfigError: no job" and failing.warm_up_failed
    failing.discard("test")

    waiting = _start([sys.executable, "-c", "import os,sys,time; os.write(int(sys.argv[1]), "
                      "b'ready\\n'); sys.stdin.readline(); time.sleep(60)"])
    while waiting.poll() != "ready" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting.poll() == "ready"
    waiting.process.kill()
    waiting.process.wait()
    assert waiting.poll() == "dead" and waiting.failure == "killed by SIGKILL"
    assert not waiting.warm_up_failed
    waiting.discard("test")


def _start(command: list[str], job_file: str = "job.py") -> SpareDriver:
    """A :class:`SpareDriver` running ``command FD SPEC`` instead of a driver."""
    return SpareDriver(json.dumps({"job_file": job_file}), dict(os.environ),
                       program=tuple(command))


def test_a_fault_schedule_gives_each_fault_its_own_marker_and_the_next_driver_the_first_unfired(
        tmp_path):
    """``exactly run --fault A@E1,B@E2 --fault-marker FILE``: fault N records where it fired
    in FILE with -N before its suffix; each new driver arms the first fault whose marker is
    absent, then none."""
    from exactly.cli import _fault_schedule
    from exactly.ops.launcher import _armed

    marker = tmp_path / "fired.json"
    schedule = _fault_schedule("after_intent@3, after_commits@9", str(marker), None)
    assert [(f.point, f.min_epoch) for f in schedule] == [("after_intent", 3),
                                                           ("after_commits", 9)]
    assert [f.marker for f in schedule] == [str(tmp_path / "fired-1.json"),
                                            str(tmp_path / "fired-2.json")]
    assert _armed(schedule) == schedule[0]
    (tmp_path / "fired-1.json").write_text("{}")
    assert _armed(schedule) == schedule[1]
    (tmp_path / "fired-2.json").write_text("{}")
    assert _armed(schedule) is None
    single = _fault_schedule("before_intent", str(marker), None)
    assert [f.marker for f in single] == [str(marker)]
    assert _fault_schedule(None, None, None) == []
    with pytest.raises(ConfigError, match="unknown"):
        _fault_schedule("after_intent@3,nowhere@4", None, None)


def test_a_spare_of_a_job_file_edited_since_it_imported_it_is_dropped_at_the_takeover(
        tmp_path):
    """The spare imported the job file when it started: after an edit it would run the old
    code, so the takeover drops it (killed, with the launcher's word) and the next driver
    starts from scratch with the file as it is now; an unchanged file keeps the spare."""
    from exactly.ops.spare import SpareChoice, SpareKeeper

    job = tmp_path / "job.py"
    job.write_text("def build(spark): ...\n")
    directory = job_dir(tmp_path)
    claim_job(directory, JobStatus("r1", current_process(), "running"))
    said: list[str] = []
    for edit, kept in ((False, True), (True, False)):
        spare = _start([sys.executable, "-c", "import os,sys; os.write(int(sys.argv[1]), "
                        "b'ready\\n'); sys.stdin.readline()"], str(job))
        keeper = SpareKeeper("{}", {}, directory, "r1", choice=SpareChoice(True),
                             say=said.append, spare=spare)
        if edit:
            job.write_text("def build(spark): return None  # edited\n")
        taken = keeper.take()
        assert (taken is spare) is kept
        if kept:
            spare.discard("test")
        else:
            assert spare.process.poll() is not None  # killed
    assert said == [f"the job file {job} changed since the spare driver imported it; the "
                    "next driver starts from scratch with the file as it is now"]

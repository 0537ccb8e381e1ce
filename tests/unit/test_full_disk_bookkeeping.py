"""The job's bookkeeping writes (job.json, the restart log) wait out a full disk: a launcher
that met ENOSPC on its own status write ended the whole job (found by the nemesis run of the
PostgreSQL sink, tests/chaos/test_nemesis.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from exactly.checkpoint import space
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.status import JobStatus
from exactly.procs import current_process
from exactly.testing.nemesis.disk import SmallDisk, why_unavailable

pytestmark = pytest.mark.skipif(why_unavailable() is not None,
                                reason=f"a full disk: {why_unavailable()}")


def test_status_and_restart_log_writes_wait_for_space_and_leave_whole_lines(tmp_path,
                                                                           monkeypatch):
    tries: list[str] = []
    retry_call = space.retry_call

    def quick(fn, **kwargs):  # the retry policy of when_space, its waits 10 times shorter
        def counted():
            tries.append(kwargs["what"])
            return fn()
        return retry_call(counted, **{**kwargs, "initial": kwargs["initial"] / 10,
                                      "maximum": kwargs["maximum"] / 10})

    monkeypatch.setattr(space, "retry_call", quick)
    with SmallDisk(tmp_path / "disk", 1 << 20) as disk:
        job = disk.path / "ck" / "exactly-job"
        job.mkdir(parents=True)
        history = RestartHistory(job, "run-1")
        history.append("started")
        status = JobStatus("run-1", current_process(), "running")
        status.write(job)
        disk.fill()
        done: list[str] = []
        errors: list[BaseException] = []

        def bookkeeping() -> None:
            try:
                history.append("failure", kind="process", cause="x" * 3000)
                status.state = "restarting"
                status.write(job)
                done.append("written")
            except BaseException as exc:  # recorded: the test fails naming it
                errors.append(exc)

        tries.clear()
        writer = threading.Thread(target=bookkeeping)
        writer.start()
        deadline = time.monotonic() + 30
        while len(tries) < 4 and not errors and not done:  # met the full disk, tried again
            assert time.monotonic() < deadline, tries
            time.sleep(0.01)
        assert not errors, errors
        assert not done, "a write succeeded on a full disk"
        disk.free()
        writer.join(30)
        assert not errors, errors
        assert done == ["written"]
        lines = history.path.read_text().splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["started", "failure"]
        assert JobStatus.read(job).state == "restarting"

"""The views of a job run with ``exactly run --ha`` (``exactly checkpoints``, its ``--json``
and the dashboard's REST API), on HA records written here as the leader and its standbys
write them (docs: /work/helpers/i29/DESIGN.md): the leader, the live standbys, every
failover with its cause and duration (or how long it has been in progress), leadership
losses in the restart list, damaged records shown as unreadable, and non-HA jobs shown as
before."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from exactly.checkpoint.ha_view import LEADER, MEMBERS, failovers, leader_view
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.store import LogStore
from exactly.cli import main
from exactly.monitoring.overview import load
from exactly.monitoring.server import Jobs, create_app

LEASE_S = 15.0
FAILOVER_CAUSE = ("Failover: host-c took over the job from host-b (host-b stopped renewing "
                  "the leader lease: killed, paused or partitioned; last renewal 12:00:00)")
FIRST_CAUSE = ("Failover: host-b took over the job from host-a (host-a stopped renewing "
               "the leader lease: killed, paused or partitioned; last renewal 11:56:40)")
LOST_CAUSE = "LeadershipLost: host-b holds the leader lease (generation 4); driver killed"


def _write(store: LogStore, name: str, record: Any, *, modified: float | None = None) -> None:
    """Write ``record`` (JSON, or raw bytes) as ``name``; its modification time set to
    ``modified`` when given (a record its writer stopped rewriting)."""
    data = record if isinstance(record, bytes) else json.dumps(record).encode()
    store.write(name, data)
    if modified is not None:
        os.utime(store.root / name, (modified, modified))  # type: ignore[attr-defined]


def _job(run_id: str, host: str, leader: int | None, state: str = "running") -> dict:
    """job.json as the launcher writes it (JobStatus plus the HA leader generation)."""
    return {"run_id": run_id, "state": state, "heartbeat": time.time(), "restarts": 0,
            "supervisor": {"host": host, "pid": 4242, "start_ticks": 1, "pidns": ""},
            "driver": None, "last_epoch": 3, "detail": "", "strategy": None,
            "job": "datagen_job.py", "leader": leader}


def _lease(host: str, generation: int, acquired_at: float, **fields: Any) -> dict:
    return {"host": host, "launcher": {"host": host, "pid": 4242, "start_ticks": 1,
                                       "pidns": ""},
            "run_id": f"run-{host}", "generation": generation, "acquired_at": acquired_at,
            "renewed_at": time.time(), "lease_s": LEASE_S, "job": "datagen_job.py",
            "ended": None, "released": False, "token": "t", **fields}


def _member(host: str, role: str) -> dict:
    return {"host": host, "launcher": {"host": host, "pid": 4242, "start_ticks": 1},
            "boot_id": "b", "role": role, "run_id": f"run-{host}", "job": "datagen_job.py",
            "heartbeat": time.time(), "lease_s": LEASE_S}


@pytest.fixture
def ha_checkpoint(tmp_path: Path) -> tuple[Path, float]:
    """An HA job now led by host-c (generation 5): host-a led until it was killed (failover
    to host-b, recovered 5 s after its lease expired), host-b lost its lease 12 s ago and
    host-c's driver has completed no epoch yet (a failover in progress). host-b is back as
    a standby; host-a's standby record stopped being rewritten a minute ago."""
    ck = tmp_path / "ck"
    store = job_store(ck)
    now = time.time()
    _write(store, "job.json", _job("run-host-c", "host-c", 5))
    _write(store, LEADER, _lease("host-c", 5, now - 10))
    _write(store, f"{MEMBERS}/host-c.json", _member("host-c", "leader"))
    _write(store, f"{MEMBERS}/host-b.json", _member("host-b", "standby"))
    _write(store, f"{MEMBERS}/host-a.json", _member("host-a", "standby"), modified=now - 60)

    def append(run: str, event: str, **fields: Any) -> None:
        RestartHistory(store, run).append(event, **fields)

    append("run-host-a", "failure", kind="process", action="restart", at=now - 400,
           cause="DriverLost: exit 137")
    append("run-host-a", "recovered", at=now - 390, epoch=1, recovery_s=10.0)
    append("run-host-b", "failure", kind="failover", action="failover", at=now - 200,
           since=now - 203, from_host="host-a", to_host="host-b", from_run="run-host-a",
           generation=4, cause=FIRST_CAUSE)
    # the old leader's driver finished an epoch before it was killed: not host-b's recovery
    append("run-host-a", "recovered", at=now - 199.5, epoch=2, recovery_s=99.0)
    append("run-host-a", "failure", kind="leadership", action="standby", at=now - 199,
           host="host-a", taken_by="host-b", cause=LOST_CAUSE)
    append("run-host-b", "recovered", at=now - 198, epoch=2, recovery_s=5.0)
    append("run-host-c", "failure", kind="failover", action="failover", at=now - 10,
           since=now - 12, from_host="host-b", to_host="host-c", from_run="run-host-b",
           generation=5, cause=FAILOVER_CAUSE)
    return ck, now


def test_the_overview_shows_the_leader_its_live_standbys_and_every_failover_with_its_duration(
        ha_checkpoint):
    ck, now = ha_checkpoint
    data = load(ck).overview.to_json()
    read_by = time.time()
    leader = data["leader"]
    assert {k: leader[k] for k in ("host", "generation", "since", "standbys", "lease")} == {
        "host": "host-c", "generation": 5, "since": now - 10, "standbys": ["host-b"],
        "lease": "held"}
    first, current = data["failovers"]
    assert {k: first[k] for k in ("at", "since", "from_host", "to_host", "cause",
                                  "duration_s", "in_progress")} == {
        "at": now - 200, "since": now - 203, "from_host": "host-a", "to_host": "host-b",
        "cause": FIRST_CAUSE, "duration_s": 5.0, "in_progress": False}
    assert {k: current[k] for k in ("at", "since", "from_host", "to_host", "cause",
                                    "duration_s", "in_progress")} == {
        "at": now - 10, "since": now - 12, "from_host": "host-b", "to_host": "host-c",
        "cause": FAILOVER_CAUSE, "duration_s": None, "in_progress": True}
    assert 12 <= current["elapsed_s"] <= read_by - (now - 12) + 0.001  # rounded to ms
    lost = [e for e in data["restarts"] if e.get("kind") == "leadership"]
    assert [(e["host"], e["taken_by"], e["cause"]) for e in lost] == [
        ("host-a", "host-b", LOST_CAUSE)]
    assert data["counts"]["restarts"] == 1  # the process restart; failovers are not
    assert data["warnings"] == []


def test_checkpoints_prints_the_leader_line_and_a_failovers_block(ha_checkpoint):
    ck, _ = ha_checkpoint
    shown = CliRunner().invoke(main, ["checkpoints", str(ck)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    (leader,) = [line for line in lines if line.startswith("leader:")]
    assert leader.startswith("leader: host-c (generation 5, since ")
    assert leader.endswith(" · standbys: host-b")
    block = lines[[line.strip() for line in lines].index("failovers"):]
    rows = [line for line in block[:8] if "host-" in line]
    assert len(rows) == 2
    assert "host-a" in rows[0] and "5.0 s" in rows[0] and FIRST_CAUSE in rows[0]
    assert "in progress (" in rows[1] and FAILOVER_CAUSE in rows[1]
    assert any(LOST_CAUSE in line and "leadership" in line for line in lines)

    as_json = CliRunner().invoke(main, ["checkpoints", str(ck), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["leader"]["host"] == "host-c" and data["leader"]["standbys"] == ["host-b"]
    assert [(f["from_host"], f["to_host"], f["duration_s"], f["in_progress"])
            for f in data["failovers"]] == [("host-a", "host-b", 5.0, False),
                                            ("host-b", "host-c", None, True)]


def _get(app: Any, path: str) -> tuple[int, Any]:
    """GET ``path`` of the ASGI ``app`` in this process (no server, no socket)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [], "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 8081), "client": ("127.0.0.1", 1), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def test_the_rest_api_serves_the_leader_and_the_failovers(ha_checkpoint):
    ck, now = ha_checkpoint
    app = create_app(Jobs([ck]))
    status, jobs = _get(app, "/jobs")
    assert status == 200
    (job,) = jobs["jobs"]
    status, data = _get(app, f"/jobs/{job['id']}/checkpoints")
    assert status == 200
    assert (data["leader"]["host"], data["leader"]["generation"],
            data["leader"]["since"], data["leader"]["standbys"]) == (
        "host-c", 5, now - 10, ["host-b"])
    assert [(f["at"], f["since"], f["cause"], f["duration_s"], f["in_progress"])
            for f in data["failovers"]] == [(now - 200, now - 203, FIRST_CAUSE, 5.0, False),
                                            (now - 10, now - 12, FAILOVER_CAUSE, None, True)]


def test_damaged_ha_records_are_shown_unreadable_and_the_rest_still_shows(tmp_path):
    ck = tmp_path / "ck"
    store = job_store(ck)
    now = time.time()
    _write(store, "job.json", _job("run-host-b", "host-b", 4))
    _write(store, LEADER, b'{"host": "host-b", "generation": ')  # torn
    _write(store, f"{MEMBERS}/host-c.json", _member("host-c", "standby"))
    _write(store, f"{MEMBERS}/host-d.json", [1, 2])
    _write(store, f"{MEMBERS}/host-e.json", {**_member("host-e", "standby"), "lease_s": "x"})
    history = RestartHistory(store, "run-host-b")
    history.append("failure", kind="failover", at=now - 5, since="yesterday",
                   from_host=None, to_host="host-b", cause=FIRST_CAUSE)
    with open(history.path, "a") as log:
        log.write('{"event": "failure", "kind": "failov')  # torn by a crash mid-append

    view = load(ck).overview
    assert (view.leader["host"], view.leader["generation"], view.leader["lease"],
            view.leader["standbys"]) == ("host-b", 4, None, ["host-c"])
    unreadable = [w for w in view.warnings if w.startswith("unreadable HA record")]
    assert len(unreadable) == 3, view.warnings
    assert any(LEADER in w and "not valid JSON" in w for w in unreadable)
    assert any("host-d.json" in w and "not an object" in w for w in unreadable)
    assert any("host-e.json" in w and "lease_s" in w for w in unreadable)
    (failover,) = view.failovers
    assert (failover["since"], failover["from_host"], failover["to_host"],
            failover["in_progress"], failover["elapsed_s"]) == (None, None, "host-b", True,
                                                                 None)
    shown = CliRunner().invoke(main, ["checkpoints", str(ck)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert "leader: host-b (generation 4, lease unreadable) · standbys: host-c" in shown.output
    assert "warning: unreadable HA record ha/leader.json: not valid JSON" in shown.output


def test_the_lease_state_shows_when_it_is_expired_released_or_ended(tmp_path):
    store = job_store(tmp_path / "ck")
    now = time.time()
    _write(store, LEADER, _lease("host-a", 3, now - 100), modified=now - 40)
    expired = leader_view(store, now=now)
    assert expired is not None and expired["lease"] == "expired"
    assert expired["age_s"] == pytest.approx(40.0, abs=0.01)
    _write(store, LEADER, _lease("host-a", 3, now - 100, released=True))
    assert leader_view(store)["lease"] == "released"  # type: ignore[index]
    ended = {"state": "stopped", "at": now - 1, "detail": "stopped by exactly stop"}
    _write(store, LEADER, _lease("host-a", 3, now - 100, ended=ended))
    view = leader_view(store)
    assert view is not None and (view["lease"], view["ended"]) == ("ended", ended)


def test_a_failover_is_in_progress_until_the_new_run_completes_an_epoch(tmp_path):
    def failover(run: str, at: float, since: float) -> dict:
        return {"event": "failure", "kind": "failover", "action": "failover", "run": run,
                "at": at, "since": since, "from_host": "host-a", "to_host": "host-b",
                "cause": FIRST_CAUSE}

    entries = [
        failover("r1", 100.0, 97.0),
        {"event": "failure", "kind": "failover", "action": "failover", "run": "r2",
         "at": 120.0, "since": 118.0, "cause": FAILOVER_CAUSE},  # r1 never completed an epoch
        {"event": "failure", "kind": "query", "action": "restart", "run": "r2", "at": 125.0,
         "cause": "ValueError"},
        {"event": "recovered", "run": "r2", "at": 131.0, "epoch": 7, "recovery_s": 6.0},
    ]
    first, second = failovers(entries, now=200.0)
    assert (first["outcome"], first["duration_s"], first["in_progress"]) == (
        "superseded", None, False)
    # a failure of the new run came between: its recovery_s counts from that failure,
    # the failover lasted from the lease expiry (118) to the recovery (131)
    assert (second["outcome"], second["duration_s"], second["epoch"]) == ("recovered", 13.0, 7)
    (stopped,) = failovers([failover("r3", 100.0, 97.0)], job_state="stopped", now=200.0)
    assert (stopped["outcome"], stopped["in_progress"], stopped["elapsed_s"]) == (
        "ended", False, None)
    (going,) = failovers([failover("r3", 100.0, 97.0)], job_state="running", now=200.0)
    assert (going["outcome"], going["in_progress"], going["elapsed_s"]) == (
        "in_progress", True, 103.0)


def test_a_job_not_run_with_ha_shows_no_leader_and_no_failovers(tmp_path):
    ck = tmp_path / "ck"
    store = job_store(ck)
    _write(store, "job.json", _job("run-1", "host-a", None, state="stopped"))
    # a lease an earlier HA run of this checkpoint left when it ended
    _write(store, LEADER, _lease("host-a", 2, time.time() - 500,
                                 ended={"state": "stopped", "at": 1.0, "detail": ""}))
    view = load(ck).overview
    assert view.leader is None and view.failovers == []
    shown = CliRunner().invoke(main, ["checkpoints", str(ck)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert "leader" not in shown.output and "failovers" not in shown.output
    assert leader_view(job_store(tmp_path / "plain")) is None  # no record at all

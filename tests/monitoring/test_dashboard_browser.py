"""The dashboard in headless Chromium (Debian's chromium and chromedriver, driven by Selenium)
against a live ``exactly run`` job: the history table grows while the job runs, the duration
chart has one point per completed epoch, a failed epoch shows its cause, the page keeps
working after the job stopped, a damaged history line shows as a warning, and the browser
logs no error. The REST API and ``exactly checkpoints --json`` give the same counts. An HA
job's leader, standbys and failovers show (on records written here, no job)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from exactly.checkpoint.ha_view import LEADER, MEMBERS
from exactly.checkpoint.history import HistoryStore, history_dir
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.testing.supervised import SupervisedRun
from exactly.testing.ui import get_json, get_text, headless_chromium, ui_server
from exactly.testing.waits import wait_until

JOB = Path(__file__).parents[1] / "ops" / "jobs" / "datagen_job.py"


@pytest.fixture
def browser():
    with headless_chromium() as driver:
        yield driver


PAGE = """
const rows = [...document.querySelectorAll('#history tbody tr')];
const chart = (window.exactlyCharts || {})['chart-duration'];
return {
  updated: document.body.dataset.updated || null,
  rows: rows.length,
  completed: rows.filter(r => r.dataset.status === 'completed').length,
  failed: rows.filter(r => r.dataset.status === 'failed')
              .map(r => [Number(r.dataset.epoch), r.querySelector('.cause').textContent]),
  points: chart ? chart.data.datasets[0].data.length : null,
  status: document.getElementById('job-status').textContent,
  spare: document.getElementById('job-spare').hidden ? null
         : document.getElementById('job-spare').dataset.state,
  warnings: document.getElementById('warnings').hidden ? ''
            : document.getElementById('warnings').textContent,
  cards: Object.fromEntries([...document.querySelectorAll('[data-count]')]
            .map(c => [c.dataset.count, Number(c.querySelector('.n').textContent)])),
};
"""


def test_the_dashboard_follows_a_live_job_and_keeps_working_after_it_stopped(
        browser, tmp_path):
    ck = tmp_path / "ck"
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": "100000", "JOB_RATE": "150",
           "JOB_INTERVAL": "500ms", "JOB_FAIL_IDS": "200", "JOB_MARKERS": str(tmp_path)}
    run = SupervisedRun(JOB, ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs")
        with ui_server(ck) as base:
            browser.get(base + "/")
            page = lambda: browser.execute_script(PAGE)  # noqa: E731
            first = wait_until(lambda: (p := page())["updated"] and p["rows"] and p, "a history")
            grown = wait_until(lambda: (p := page())["rows"] >= first["rows"] + 3 and p,
                          "the history growing while the job runs")
            assert grown["status"] == "running"
            wait_until(lambda: page()["spare"] == "ready", "the warm spare driver, ready")
            (live,) = get_json(f"{base}/jobs")[1]["jobs"]
            assert (f'exactly_spare_driver_ready{{checkpoint="{ck}",job="{live["id"]}"}} 1.0'
                    in get_text(f"{base}/metrics"))
            failed = wait_until(lambda: page()["failed"], "a failed epoch")
            assert "injected UDF failure at id 200" in failed[0][1], failed
            now = page()
            assert now["points"] == now["completed"] > 0, now
            browser.save_screenshot(str(tmp_path / "dashboard.png"))
            assert (tmp_path / "dashboard.png").stat().st_size > 20_000

            stopped = run.command("stop", str(ck))
            assert stopped.returncode == 0, stopped.stderr
            assert run.wait(timeout=120) == 0, run.output()[-3000:]
            after = wait_until(lambda: (p := page())["status"] == "stopped" and p,
                               "the stopped job")
            assert after["spare"] is None  # a job that ended has no spare to show
            # one more refresh: the page goes on without a live job
            stamp = after["updated"]
            after = wait_until(lambda: (p := page())["updated"] != stamp and p,
                               "a refresh after the job stopped")
            assert after["completed"] == after["points"] == len(run.committed_epochs())
            assert after["cards"]["completed"] == len(run.committed_epochs())
            assert after["cards"]["failed"] == len(after["failed"]) >= 1

            (job,) = get_json(f"{base}/jobs")[1]["jobs"]
            status, rest = get_json(f"{base}/jobs/{job['id']}/checkpoints")
            assert status == 200
            cli = run.command("checkpoints", str(ck), "--json")
            assert cli.returncode == 0, cli.stderr
            assert json.loads(cli.stdout)["counts"] == rest["counts"] == job["counts"]
            epoch = rest["history"][0]["epoch"]
            status, details = get_json(f"{base}/jobs/{job['id']}/checkpoints/details/{epoch}")
            assert status == 200 and details["epoch"] == epoch
            _assert_duration_parts(base, job["id"], rest["history"])
            assert get_json(f"{base}/jobs/{job['id']}/checkpoints/details/999999")[0] == 404
            assert get_json(f"{base}/jobs/nope/checkpoints")[0] == 404
            assert get_json(f"{base}/jobs/{job['id']}/checkpoints/config")[1]["mode"] == \
                "exactly_once"
            metrics = get_text(f"{base}/metrics")
            completed_metric = (f'exactly_checkpoints{{checkpoint="{ck}",job="{job["id"]}",'
                                f'status="completed"}} {float(rest["counts"]["completed"])}')
            assert completed_metric in metrics, metrics
            assert f'exactly_job_running{{checkpoint="{ck}",job="{job["id"]}"}} 0.0' in metrics

            segment = HistoryStore(history_dir(ck)).segments()[-1]
            with open(segment, "ab") as f:
                f.write(b'{"kind": "epoch", "at": 1, "epoch": \n')
            damaged = wait_until(lambda: page()["warnings"], "the damaged line's warning")
            assert "skipped a damaged history line" in damaged and segment.name in damaged
            assert page()["completed"] == after["completed"]  # the rest still shows
            severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert severe == [], severe
    finally:
        run.close()


def _assert_duration_parts(base: str, job_id: str, history: list[dict]) -> None:
    """An epoch that wrote rows splits its duration into Spark's parts, the processing and
    the sink's pre-commit and commit, as measured by the sink (its completion record)."""
    for row in history:
        if row["status"] != "completed" or not row.get("rows_out"):
            continue
        record = get_json(f"{base}/jobs/{job_id}/checkpoints/details/{row['epoch']}")[1]["record"]
        if "parts_ms" not in record:
            continue  # recorded from the commit log after a restart: no Spark progress
        parts = record["parts_ms"]
        assert parts["sink_pre_commit"] == record["sink"]["pre_commit_ms"] > 0, record
        assert parts["sink_commit"] == record["sink"]["commit_ms"] > 0, record
        assert parts["processing"] > 0, record
        # the parts are disjoint pieces of Spark's triggerExecution (whole milliseconds)
        assert sum(parts.values()) <= record["duration_ms"] + 1, record
        return
    raise AssertionError(f"no completed epoch with rows and Spark's progress in {history}")


HA_PAGE = """
const leader = document.getElementById('job-leader');
const rows = [...document.querySelectorAll('#failovers tbody tr')];
return {
  updated: document.body.dataset.updated || null,
  leader: leader.hidden ? null : leader.textContent,
  panel: !document.getElementById('failovers-panel').hidden,
  failovers: rows.map(r => [r.dataset.outcome, ...[...r.cells].map(c => c.textContent)]),
};
"""


def test_the_dashboard_shows_the_leader_standbys_and_failovers_of_an_ha_job(browser, tmp_path):
    """No job runs: the HA records are written here as ``exactly run --ha`` writes them."""
    store = job_store(tmp_path / "ck")
    now = time.time()
    process = {"pid": 4242, "start_ticks": 1, "pidns": ""}
    store.write("job.json", json.dumps({
        "run_id": "run-c", "state": "running", "heartbeat": now, "job": "datagen_job.py",
        "supervisor": {"host": "host-c", **process}, "leader": 5}).encode())
    store.write(LEADER, json.dumps({
        "host": "host-c", "launcher": {"host": "host-c", **process}, "run_id": "run-c",
        "generation": 5, "acquired_at": now - 10, "renewed_at": now, "lease_s": 600.0,
        "ended": None, "released": False, "token": "t"}).encode())
    store.write(f"{MEMBERS}/host-b.json", json.dumps({
        "host": "host-b", "role": "standby", "run_id": "run-b", "heartbeat": now,
        "lease_s": 600.0}).encode())
    RestartHistory(store, "run-b").append(
        "failure", kind="failover", action="failover", at=now - 200, since=now - 203,
        from_host="host-a", to_host="host-b", generation=4, cause="Failover: from host-a")
    RestartHistory(store, "run-b").append("recovered", at=now - 198, epoch=2, recovery_s=5.0)
    RestartHistory(store, "run-c").append(
        "failure", kind="failover", action="failover", at=now - 10, since=now - 12,
        from_host="host-b", to_host="host-c", generation=5, cause="Failover: from host-b")
    with ui_server(tmp_path / "ck") as base:
        browser.get(base + "/")
        page = wait_until(lambda: (p := browser.execute_script(HA_PAGE))["updated"] and p,
                          "the page's first refresh")
    assert page["leader"].startswith("leader host-c (generation 5, since "), page
    assert page["leader"].endswith(" · standbys: host-b"), page
    assert page["panel"] and [row[:4] for row in page["failovers"]] == [
        ["in_progress", page["failovers"][0][1], "host-b", "host-c"],
        ["recovered", page["failovers"][1][1], "host-a", "host-b"]], page  # newest first
    assert page["failovers"][0][5].startswith("in progress (")
    assert page["failovers"][1][5:] == ["5.0 s", "Failover: from host-a"]
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe

"""The checkpoint overview (exactly.monitoring.overview) and the `exactly checkpoints` /
`exactly ui` commands on histories written here, without Spark: counts, latest, history,
summary, restores; damaged lines; bad directories; a port in use; --follow."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from exactly.checkpoint.history import HistoryStore, history_dir
from exactly.errors import ConfigError
from exactly.monitoring.overview import load

EXACTLY = [sys.executable, "-m", "exactly.cli"]


def _cli(*args: str, env: dict[str, str] | None = None):
    """``exactly ARGS`` in this process (its exit code, stdout and stderr), ``env`` set."""
    from click.testing import CliRunner

    from exactly.cli import main

    return CliRunner(env=env).invoke(main, list(args))


def _epoch(epoch: int, at: float, duration: float, full: int, new: int, rows: int) -> dict:
    return {"kind": "epoch", "at": at, "status": "completed", "epoch": epoch, "query_id": "q",
            "trigger_at": at - duration / 1000, "end_at": at, "duration_ms": duration,
            "rows_in": rows, "rows_out": rows,
            "checkpoint": {"new_bytes": new, "full_bytes": full}}


@pytest.fixture
def checkpoint(tmp_path):
    """A stopped job's checkpoint: epochs 0-3, epoch 2 failed once (query), a restart that
    resumed after epoch 1, a savepoint and a restore into it."""
    ck = tmp_path / "ck"
    for folder in ("offsets", "commits"):
        (ck / folder).mkdir(parents=True)
        for epoch in range(4):
            (ck / folder / str(epoch)).write_text("v1\n")
    store = HistoryStore(history_dir(ck))
    for record in [
        {"kind": "restore", "at": 90.0, "source": "savepoint", "path": "/sp/savepoint-7",
         "epoch": 7},
        {"kind": "run", "at": 100.0, "query_id": "q", "spark_run_id": "r1", "name": "orders",
         "resumed_after_epoch": None, "config": {"interval": "1s", "interval_s": 1.0,
                                                 "mode": "exactly_once"}},
        _epoch(0, 101.0, 900, 1000, 1000, 10), _epoch(1, 102.0, 300, 1500, 500, 20),
        {"kind": "epoch_failed", "at": 103.0, "query_id": "q", "epoch": 2,
         "failure": "query", "cause": "ValueError: bad row"},
        {"kind": "run_end", "at": 103.1, "query_id": "q", "outcome": "failed"},
        {"kind": "run", "at": 104.0, "query_id": "q", "spark_run_id": "r2", "name": "orders",
         "resumed_after_epoch": 1, "config": {"interval": "1s", "interval_s": 1.0,
                                              "mode": "exactly_once"}},
        _epoch(2, 105.0, 600, 2000, 700, 30), _epoch(3, 106.0, 200, 2200, 200, 40),
        {"kind": "savepoint", "at": 107.0, "epoch": 3, "path": "/sp/savepoint-3"},
        {"kind": "run_end", "at": 108.0, "query_id": "q", "outcome": "stopped"},
    ]:
        store.append(record)
    return ck


def test_the_overview_counts_and_summarises_what_the_history_holds(checkpoint):
    view = load(checkpoint).overview
    assert view.job_id == "q" and view.name == "orders" and view.status == "stopped"
    assert view.counts == {"triggered": 5, "in_progress": 0, "completed": 4, "failed": 1,
                           "restored": 2, "restarts": 0, "savepoints": 1,
                           "manual": 0}
    assert [(r.epoch, r.status) for r in view.history] == [
        (3, "completed"), (2, "completed"), (2, "failed"), (1, "completed"), (0, "completed")]
    assert [r.epoch for r in view.history if r.restored] == [2]
    assert view.latest["completed"]["epoch"] == 3
    assert view.latest["failed"]["cause"] == "ValueError: bad row"
    assert view.latest["savepoint"]["path"] == "/sp/savepoint-3"
    assert view.latest["restore"] == {"at": 104.0, "source": "checkpoint", "epoch": 1,
                                      "after_failure": "ValueError: bad row",
                                      "path": str(checkpoint)}
    assert view.summary["duration_ms"] == {"min": 200, "avg": 500.0, "max": 900, "count": 4}
    assert view.summary["full_bytes"]["max"] == 2200
    assert view.config["mode"] == "exactly_once" and view.warnings == []
    details = load(checkpoint).details(2)
    assert details["status"] == "completed"
    assert [a["cause"] for a in details["failed_attempts"]] == ["ValueError: bad row"]


def test_an_epoch_with_offsets_but_no_commit_is_in_progress_while_the_job_runs(checkpoint):
    (checkpoint / "offsets" / "4").write_text("v1\n")
    HistoryStore(history_dir(checkpoint)).append({"kind": "run", "at": time.time(),
                                                  "query_id": "q", "resumed_after_epoch": 3})
    view = load(checkpoint).overview
    assert view.status == "running"
    assert (view.history[0].epoch, view.history[0].status) == (4, "in_progress")
    assert view.counts["in_progress"] == 1 and view.counts["triggered"] == 6


def test_a_report_written_to_a_pipe_cuts_no_cell_and_folds_no_path(checkpoint):
    long_path = "/savepoints/" + "deep-folder/" * 12 + "savepoint-4-3df93a071b0b"
    HistoryStore(history_dir(checkpoint)).append(
        {"kind": "savepoint", "at": 109.0, "epoch": 3, "path": long_path})
    # a narrow terminal's width in the environment, where rich would lay out a file's lines
    shown = _cli("checkpoints", str(checkpoint), env={"COLUMNS": "40"})
    assert shown.exit_code == 0, shown.stderr
    assert "…" not in shown.stdout
    assert any(long_path in line for line in shown.stdout.splitlines())
    assert any(str(checkpoint) in line for line in shown.stdout.splitlines())


def test_a_damaged_line_is_a_warning_and_everything_else_still_shows(checkpoint):
    segment = HistoryStore(history_dir(checkpoint)).segments()[-1]
    with open(segment, "ab") as f:
        f.write(b"\x00\x01 not a record\n")
    view = load(checkpoint).overview
    assert view.counts["completed"] == 4
    assert len(view.warnings) == 1 and f"{segment.name} line 12" in view.warnings[0]
    shown = _cli("checkpoints", str(checkpoint))
    assert shown.exit_code == 0, shown.stderr
    assert "warning: skipped a damaged history line" in shown.stdout.replace("\n", " ")


def test_a_directory_that_is_not_a_checkpoint_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="is not a Spark checkpoint"):
        load(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nowhere")
    for command in (["checkpoints", str(tmp_path)], ["ui", str(tmp_path), "--port", "1"]):
        shown = _cli(*command)
        assert shown.exit_code == 3
        assert shown.stderr.strip().splitlines()[-1].endswith(
            "give the directory a job was started with as its checkpoint")


def test_ui_on_a_port_in_use_fails_in_one_line_naming_the_option(checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        shown = _cli("ui", str(checkpoint), "--port", str(port))
    assert shown.exit_code == 3
    last = shown.stderr.strip().splitlines()[-1]
    assert f"port {port} on 127.0.0.1 is in use" in last and "--port" in last


def test_follow_json_prints_every_record_then_the_new_ones(checkpoint):
    proc = subprocess.Popen([*EXACTLY, "checkpoints", str(checkpoint), "--follow", "--json"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(11)]
        assert [r["kind"] for r in first][:3] == ["restore", "run", "epoch"]
        HistoryStore(history_dir(checkpoint)).append({"kind": "run", "at": 200.0,
                                                      "query_id": "q"})
        assert json.loads(proc.stdout.readline()) == {"kind": "run", "at": 200.0,
                                                      "query_id": "q"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_epoch_of_a_manual_checkpoint_shows_as_manual_in_every_view(checkpoint):
    """A ``manual_checkpoint`` record (``exactly checkpoint``) marks its epoch ``manual`` in
    the overview (JSON and REST), the epoch's details and the terminal's table; the other
    epochs stay ``periodic``."""
    HistoryStore(history_dir(checkpoint)).append(
        {"kind": "manual_checkpoint", "at": 106.0, "epoch": 3, "request": "r",
         "requested_at": 105.5, "trigger": "manual"})
    loaded = load(checkpoint)
    triggers = {row.epoch: row.trigger for row in loaded.overview.history
                if row.status == "completed"}
    assert triggers[3] == "manual" and {t for e, t in triggers.items() if e != 3} == {"periodic"}
    assert loaded.overview.to_json()["counts"]["manual"] == 1
    assert loaded.details(3)["trigger"] == "manual" and loaded.details(1)["trigger"] == "periodic"
    from rich.console import Console

    from exactly.monitoring.terminal import render

    console = Console(width=200, record=True)
    console.print(render(loaded.overview, rows=10))
    assert "(manual)" in console.export_text()

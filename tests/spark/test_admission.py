"""Admission control under real Spark: exactly's sources honour the admission file.

The file is named by ``_EXACTLY_ADMISSION_FILE``, which Spark's Python workers inherit from the
driver process, so the queries run in a subprocess started with it set (``admission_job.py``,
one Spark for all scenarios of a module), each from an exactly source into Spark's ``noop``
sink with a 200 ms processingTime trigger. What each test proves, from the query's progress
and its checkpoint:

- ``max_rows=N``: every epoch reads at most N rows while a larger backlog waits, and every
  epoch but the last reads exactly N (the budget is used, not just respected).
- ``min_pause_s=P``: for every two consecutive epochs with data, the next epoch's input was
  fixed (its ``offsets/N`` entry, the barrier) at least P after the previous epoch completed
  (its ``commits/N`` entry). These two log entries are tied to the epochs of the progress.
- ``closed``: closed while a backlog waits, no epoch starts (no ``offsets/N`` entry is written)
  until the gate reopens; then the backlog drains.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from exactly.connectors.admission import ADMISSION_FILE_ENV
from exactly.connectors.datagen import generate
from exactly.demos.files import write_events
from exactly.demos.files_job import EVENT_SCHEMA

JOB = Path(__file__).with_name("admission_job.py")
TRIGGER_MS = 200
PAUSE_S = 1.0
#: attributing a log file to an epoch compares file mtimes (kernel ticks of 4 ms) with
#: progress times (whole ms): allow that much
CLOCK_SLACK_S = 0.010

Result = dict[str, Any]


def run_job(workdir: Path, scenarios: list[dict[str, Any]]) -> dict[str, Result]:
    """Run the scenarios in one Spark subprocess whose environment names the admission file."""
    spec, result = workdir / "spec.json", workdir / "result.json"
    spec.write_text(json.dumps({"scenarios": scenarios}))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           ADMISSION_FILE_ENV: str(workdir / "admission.json")}
    done = subprocess.run([sys.executable, str(JOB), str(spec), str(result)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in json.loads(result.read_text())}


def scenario(name: str, workdir: Path, source: str, rows: int, admission: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    return {"name": name, "workdir": str(workdir / name), "source": source, "rows": rows,
            "trigger_ms": TRIGGER_MS, "admission": admission, **extra}


def datagen(rows: int) -> dict[str, Any]:
    return {"source": "datagen", "rows": rows,
            "options": {"rowsPerSecond": "0", "totalRows": str(rows)}}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    workdir = tmp_path_factory.mktemp("admission")
    json_dir, parquet_dir = workdir / "json", workdir / "parquet"
    write_events(json_dir, 4000, 8, seed=1)  # 8 JSON-lines files of 500 rows
    parquet_dir.mkdir()
    for i in range(3):  # 3 Parquet files of 500 rows
        pq.write_table(generate(i * 500, (i + 1) * 500, 100, 0),
                       parquet_dir / f"part-{i:03d}.parquet")
    json_files = {"source": "files", "schema": EVENT_SCHEMA,
                  "options": {"path": str(json_dir), "format": "json"}, "rows": 4000}
    parquet_files = {"source": "files", "options": {"path": str(parquet_dir)}, "rows": 1500}
    closing = {"close_after_first_epoch_s": 2.0}
    return run_job(workdir, [
        scenario("datagen-max-rows", workdir, **datagen(3000), admission={"max_rows": 700}),
        scenario("files-max-rows", workdir, **json_files, admission={"max_rows": 1200}),
        scenario("datagen-pause", workdir, **datagen(1500),
                 admission={"max_rows": 500, "min_pause_s": PAUSE_S}),
        scenario("files-pause", workdir, **parquet_files,
                 admission={"max_rows": 500, "min_pause_s": PAUSE_S}),
        # the pause keeps the next epoch away from the moment the gate closes
        scenario("datagen-closed", workdir, **datagen(1000),
                 admission={"max_rows": 500, "min_pause_s": 1.5}, **closing),
        scenario("files-closed", workdir, **parquet_files,
                 admission={"max_rows": 1000, "min_pause_s": 1.5}, **closing),
    ])


# -- checks shared with the PostgreSQL test ------------------------------------------------
def data_epochs(result: Result) -> list[dict[str, Any]]:
    return [p for p in result["progress"] if int(p["numInputRows"]) > 0]


def epoch_rows(result: Result) -> list[int]:
    return [int(p["numInputRows"]) for p in data_epochs(result)]


def assert_capped(result: Result, max_rows: int, total: int) -> None:
    rows = epoch_rows(result)
    assert sum(rows) == total
    assert all(r <= max_rows for r in rows), rows
    # while the backlog was larger than the budget, every epoch took the whole budget
    assert len(rows) == math.ceil(total / max_rows), rows


def window(progress: dict[str, Any]) -> tuple[float, float]:
    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start, start + progress["durationMs"]["triggerExecution"] / 1000


def assert_paused(result: Result, pause_s: float) -> None:
    epochs = data_epochs(result)
    assert len(epochs) >= 3, epoch_rows(result)
    for before, after in itertools.pairwise(epochs):
        n, m = int(before["batchId"]), int(after["batchId"])
        completed = result["commits"][str(n)]
        barrier = result["offsets"][str(m)]
        # the log entries belong to these epochs ...
        start_n, end_n = window(before)
        start_m, end_m = window(after)
        assert start_n - CLOCK_SLACK_S <= completed <= end_n + CLOCK_SLACK_S
        assert start_m - CLOCK_SLACK_S <= barrier <= end_m + CLOCK_SLACK_S
        # ... no epoch completed in between, and the next one was admitted only after the pause
        assert max(int(c) for c in result["commits"] if int(c) < m) == n
        assert barrier - completed >= pause_s, (n, m, barrier - completed)


def assert_held_while_closed(result: Result, total: int) -> None:
    closed, reopened = result["closed_at"], result["reopened_at"]
    assert result["rows_while_closed"] < total  # a backlog waited at the closed gate
    started = sorted(t for t in result["offsets"].values() if closed <= t <= reopened)
    assert started == [], f"epochs started while closed at {started} ({closed}..{reopened})"
    assert sum(epoch_rows(result)) == total  # reopened, it drained


# -- tests ---------------------------------------------------------------------------------
def test_datagen_epochs_take_at_most_the_admitted_rows(results):
    assert_capped(results["datagen-max-rows"], 700, 3000)


def test_file_epochs_take_whole_files_within_the_admitted_rows(results):
    result = results["files-max-rows"]
    assert_capped(result, 1200, 4000)
    assert epoch_rows(result) == [1000] * 4  # two 500-row files fit, a third would not


@pytest.mark.parametrize("name", ["datagen-pause", "files-pause"])
def test_the_next_epoch_is_admitted_no_sooner_than_the_min_pause_after_the_last(results,
                                                                               name):
    result = results[name]
    assert_capped(result, 500, 1500)
    assert_paused(result, PAUSE_S)


@pytest.mark.parametrize("name", ["datagen-closed", "files-closed"])
def test_a_closed_gate_starts_no_epoch_while_the_backlog_waits(results, name):
    assert_held_while_closed(results[name], {"datagen-closed": 1000, "files-closed": 1500}[name])


@pytest.mark.server
def test_postgres_epochs_honour_the_row_budget_the_pause_and_the_closed_gate(
        pg, conn, table_name, tmp_path):
    conn.execute(f'CREATE TABLE "{table_name}" (id bigint PRIMARY KEY, amount double precision)')
    conn.execute(f'INSERT INTO "{table_name}" SELECT g, g / 10.0 FROM generate_series(1, 1800) g')
    table = {"source": "postgres", "rows": 1800,
             "options": {"dsn": pg.dsn, "table": table_name, "keyColumn": "id"}}
    results = run_job(tmp_path, [
        scenario("pg-budget-pause", tmp_path, **table,
                 admission={"max_rows": 600, "min_pause_s": PAUSE_S}),
        scenario("pg-closed", tmp_path, **table, admission={"max_rows": 1000, "min_pause_s": 1.5},
                 close_after_first_epoch_s=2.0),
    ])
    assert_capped(results["pg-budget-pause"], 600, 1800)
    assert_paused(results["pg-budget-pause"], PAUSE_S)
    assert_held_while_closed(results["pg-closed"], 1800)

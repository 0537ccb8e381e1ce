"""Admission-control scenarios, run by tests/spark/test_admission.py in a subprocess whose
environment names the admission file (``_EXACTLY_ADMISSION_FILE``): Spark's Python workers
inherit it from this process, so it must be set before Spark starts.

Usage: ``admission_job.py SPEC.json RESULT.json``. SPEC holds ``{"scenarios": [...]}``; each
scenario starts one query (a fresh checkpoint under ``workdir``) from an exactly source into
Spark's ``noop`` sink with a processingTime trigger, with the admission file written as the
scenario says:

``name``, ``workdir``, ``source`` (datagen | files | postgres), ``options`` (source options),
``schema`` (optional), ``rows`` (the backlog: rows the query must read in all), ``trigger_ms``,
``admission`` (``max_rows`` / ``min_pause_s`` / ``closed`` at start),
``close_after_first_epoch_s`` (optional: once an epoch has read rows, close the gate, keep it
closed this long, then reopen it).

RESULT gets, per scenario, every progress entry (``query.recentProgress`` as JSON), the
modification times of the checkpoint's ``offsets/N`` (epoch N's input fixed: its barrier) and
``commits/N`` (epoch N complete), and for a closed gate when it closed and reopened and the
rows read by then. Spark's ``noop`` sink keeps the epochs' own cost small.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from exactly.connectors.admission import Admission, admission_path
from exactly.fsutil import atomic_write_json
from exactly.spark.session import spark_session

TIMEOUT_S = 60.0
POLL_S = 0.1


def progress(query) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def rows_read(query) -> int:
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def wait_for(query, name: str, condition) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if query.exception() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{name}: gave up after reading {rows_read(query)} rows: "
                             f"{query.exception()}")
        time.sleep(POLL_S)


def log_times(checkpoint: Path, log: str) -> dict[str, float]:
    directory = checkpoint / log
    return {p.name: p.stat().st_mtime for p in directory.iterdir() if p.name.isdigit()}


def run(spark, scenario: dict[str, Any], admission_file: Path) -> dict[str, Any]:
    workdir = Path(scenario["workdir"])
    checkpoint = workdir / "checkpoint"
    settings = scenario.get("admission", {})
    admission = Admission(checkpoint=str(checkpoint), min_pause_s=settings.get("min_pause_s", 0.0),
                          max_rows=settings.get("max_rows"), closed=settings.get("closed", False))
    atomic_write_json(admission_file, admission.to_json())

    reader = spark.readStream.format(f"exactly.{scenario['source']}")
    if scenario.get("schema"):
        reader = reader.schema(scenario["schema"])
    for key, value in scenario.get("options", {}).items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=f"{scenario['trigger_ms']} milliseconds").start())
    result: dict[str, Any] = {"name": scenario["name"]}
    try:
        hold_s = scenario.get("close_after_first_epoch_s")
        if hold_s is not None:  # a graceful stop's gate: close it while the backlog is there
            wait_for(query, scenario["name"], lambda: rows_read(query) > 0)
            atomic_write_json(admission_file, replace(admission, closed=True).to_json())
            result["closed_at"] = time.time()
            time.sleep(float(hold_s))
            result["rows_while_closed"] = rows_read(query)
            atomic_write_json(admission_file, admission.to_json())
            result["reopened_at"] = time.time()
        wait_for(query, scenario["name"], lambda: rows_read(query) >= scenario["rows"])
    finally:
        query.stop()
        admission_file.unlink()
    result["progress"] = progress(query)
    result["offsets"] = log_times(checkpoint, "offsets")
    result["commits"] = log_times(checkpoint, "commits")
    return result


def main(spec_path: str, result_path: str) -> None:
    admission_file = admission_path()
    if admission_file is None:
        raise SystemExit("set _EXACTLY_ADMISSION_FILE before starting this job")
    spec = json.loads(Path(spec_path).read_text())
    spark = spark_session(app_name="exactly-admission-test",
                          conf={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
    try:
        results = [run(spark, scenario, admission_file) for scenario in spec["scenarios"]]
    finally:
        spark.stop()
    Path(result_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

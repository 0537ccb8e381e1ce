"""``exactly demo``: generate events, run the pipeline under random crashes, audit the result."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

from rich.console import Console

from exactly.auditor import AuditSpec, FilesLocation, VerifyReport, run_audit
from exactly.connectors.datagen import generate
from exactly.demos.console import ConsoleProgress, DemoResult, demo_env
from exactly.testing.chaos import python_command, random_schedule, run_with_crashes, unfired

EVENTS_PER_FILE_TARGET = 20  # files in the input; epochs = files / files per epoch


def write_events(directory: Path, events: int, files: int, seed: int) -> None:
    """``events`` JSON-lines events with ids 0..events-1 in ``files`` files, in name order."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = math.ceil(events / files)
    for index, start in enumerate(range(0, events, per_file)):
        table = generate(start, min(start + per_file, events), keys=100, seed=seed)
        rows = table.to_pylist()
        lines = [json.dumps({"id": r["id"], "key": r["key"], "amount": r["amount"],
                             "event_time": r["event_time"].isoformat()}) for r in rows]
        tmp = directory / f".events-{index:05d}.jsonl.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"events-{index:05d}.jsonl")


def run_demo(events: int, crashes: int, seed: int, workdir: Path, *, output_format: str,
             files_per_epoch: int = 4, console: Console | None = None) -> DemoResult:
    """Write the events, run the pipeline under ``crashes`` random crashes until it has
    drained the input, printing progress, then audit the output files."""
    console = console or Console()
    for sub in ("input", "output", "checkpoint"):
        shutil.rmtree(workdir / sub, ignore_errors=True)
    files = min(EVENTS_PER_FILE_TARGET, max(1, events))
    write_events(workdir / "input", events, files, seed)
    epochs = math.ceil(files / files_per_epoch)
    schedule = random_schedule(crashes, epochs, random.Random(seed))
    console.print(f"[bold]exactly demo[/]: {events} events in {files} files -> {epochs} epochs; "
                  f"{len(schedule)} crash(es) planned: "
                  + (", ".join(s.render() for s in schedule) or "none"))
    command = python_command(
        "pipeline", "--input", str(workdir / "input"), "--output", str(workdir / "output"),
        "--checkpoint", str(workdir / "checkpoint"), "--format", output_format,
        "--max-files-per-epoch", str(files_per_epoch))
    attempts = run_with_crashes(command, schedule, env=demo_env(),
                                **ConsoleProgress(console).hooks())
    for spec in unfired(schedule, attempts):
        console.print(f"  [yellow]fault {spec.render()} was not reached[/] before the input "
                      "drained")
    report = audit_demo_output(workdir / "input", workdir / "output")
    return DemoResult(attempts, report, files, epochs)


#: the demo job's projection (exactly.demos.files_job.build) as SQL over its input
EXPECTED_OUTPUT = ("SELECT id, key, concat(key, ':', id) AS key_id, "
                   "CAST(round(amount * 100) AS BIGINT) AS amount_cents FROM input")


def audit_demo_output(input_dir: Path, output_dir: Path) -> VerifyReport:
    """``exactly verify`` on the demo: every input id once in the output, with the values
    the job's projection gives it."""
    return run_audit(AuditSpec(output=FilesLocation(output_dir), input=FilesLocation(input_dir),
                               expect=EXPECTED_OUTPUT,
                               compare=("key", "key_id", "amount_cents")))

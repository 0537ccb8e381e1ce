"""``exactly demo``: generate events, run the pipeline under random crashes, audit the result."""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from exactly.audit import AuditReport, verify
from exactly.connectors.datagen import generate
from exactly.testing.chaos import (
    Attempt,
    python_command,
    random_schedule,
    run_with_crashes,
    unfired,
)

EVENTS_PER_FILE_TARGET = 20  # files in the input; epochs = files / files per epoch


@dataclass
class DemoResult:
    attempts: list[Attempt]
    report: AuditReport
    files: int
    epochs_expected: int

    @property
    def ok(self) -> bool:
        """Every id exactly once (sink-specific results add their own checks)."""
        return self.report.ok


@dataclass
class ConsoleProgress:
    """Prints a crash-and-restart run as it happens (hooks for ``run_with_crashes``)."""

    console: Console

    def on_line(self, attempt: Attempt, event: dict) -> None:
        if event.get("event") == "epoch":
            self.console.print(f"  attempt {attempt.number}: epoch {event['epoch']} committed "
                               f"({event['rows']} rows)")

    def on_start(self, attempt: Attempt) -> None:
        armed = attempt.armed.render() if attempt.armed else "no fault"
        self.console.print(f"attempt {attempt.number}: starting ({armed} armed)")

    def on_end(self, attempt: Attempt) -> None:
        if attempt.crashed:
            fired = attempt.fired or {}
            self.console.print(f"  attempt {attempt.number}: [red]killed[/] at "
                               f"{fired.get('point')} in epoch {fired.get('epoch')}; restarting")
        else:
            self.console.print(f"  attempt {attempt.number}: input drained")
        print_leftovers(attempt, self.console)


def print_leftovers(attempt: Attempt, console: Console) -> None:
    """Name the processes of the attempt that outlived its driver (the harness killed them
    and checked that none of its processes is alive)."""
    if attempt.killed:
        names = ", ".join(sorted({p.cmdline.split(" -m ")[1].split(" ")[0]
                                  if " -m " in p.cmdline else p.name for p in attempt.killed}))
        console.print(f"  attempt {attempt.number}: {len(attempt.killed)} leftover "
                      f"process(es) killed ({names}); none of the job's processes is alive")


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
             files_per_epoch: int = 2, console: Console | None = None) -> DemoResult:
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

    hooks = ConsoleProgress(console)
    attempts = run_with_crashes(command, schedule, on_line=hooks.on_line,
                                on_start=hooks.on_start, on_end=hooks.on_end)
    for spec in unfired(schedule, attempts):
        console.print(f"  [yellow]fault {spec.render()} was not reached[/] before the input "
                      "drained")
    report = verify(workdir / "input", workdir / "output")
    return DemoResult(attempts, report, files, epochs)


def print_result(result: DemoResult, console: Console) -> None:
    crashes = Table(title="injected crashes")
    for column in ("attempt", "armed", "fired at", "epoch", "exit", "leftovers killed"):
        crashes.add_column(column)
    for a in result.attempts:
        crashes.add_row(str(a.number), a.armed.render() if a.armed else "-",
                        (a.fired or {}).get("point", "-"), str((a.fired or {}).get("epoch", "-")),
                        str(a.returncode), str(len(a.killed)))
    console.print(crashes)
    console.print("after every attempt the job's whole process tree (driver, JVM, PySpark "
                  "worker daemons and workers) was killed and checked: no process left")
    audit = Table(title="audit: input ids vs committed output")
    audit.add_column("check")
    audit.add_column("result")
    for name, value in result.report.rows():
        audit.add_row(name, value)
    console.print(audit)

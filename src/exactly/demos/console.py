"""What the demos print: a crash-and-restart run as it happens, then its result as tables.

:class:`ConsoleProgress` holds the hooks of :func:`exactly.testing.chaos.run_with_crashes`
(``run_with_crashes(command, schedule, **progress.hooks())``); :func:`print_result` prints
a :class:`DemoResult`: the injected crashes and the id audit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from rich.console import Console
from rich.table import Table

from exactly.audit import AuditReport
from exactly.auditor import VerifyReport
from exactly.testing.chaos import Attempt

#: exactly.spark.session.DRIVER_JAVA_OPTIONS_ENV (not imported: that module loads PySpark)
_DRIVER_JAVA_OPTIONS_ENV = "EXACTLY_DRIVER_JAVA_OPTIONS"
#: a demo's drivers live seconds: the optimizing JIT compiler would spend the CPU the job needs
SHORT_LIVED_DRIVER_OPTIONS = "-XX:TieredStopAtLevel=1"


def demo_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a demo's attempts run with: ``env`` plus JVM options for drivers that
    live seconds (C1 JIT only), unless the user set ``EXACTLY_DRIVER_JAVA_OPTIONS``. JVM
    options change how fast Spark runs, never what it computes."""
    merged = dict(env or {})
    if _DRIVER_JAVA_OPTIONS_ENV not in os.environ:
        merged[_DRIVER_JAVA_OPTIONS_ENV] = SHORT_LIVED_DRIVER_OPTIONS
    return merged


@dataclass
class DemoResult:
    attempts: list[Attempt]
    report: AuditReport | VerifyReport
    files: int
    epochs_expected: int

    @property
    def ok(self) -> bool:
        """Every id exactly once (sink-specific results add their own checks)."""
        return self.report.ok


class Hooks(TypedDict):
    """The progress hooks of :func:`exactly.testing.chaos.run_with_crashes`."""

    on_start: Callable[[Attempt], None]
    on_line: Callable[[Attempt, dict], None]
    on_end: Callable[[Attempt], None]


@dataclass
class ConsoleProgress:
    """Prints a crash-and-restart run as it happens (hooks for ``run_with_crashes``)."""

    console: Console

    def hooks(self) -> Hooks:
        """The keyword arguments ``on_start``, ``on_line``, ``on_end`` of ``run_with_crashes``."""
        return {"on_start": self.on_start, "on_line": self.on_line, "on_end": self.on_end}

    def on_start(self, attempt: Attempt) -> None:
        armed = attempt.armed.render() if attempt.armed else "no fault"
        self.console.print(f"attempt {attempt.number}: starting ({armed} armed)")

    def on_line(self, attempt: Attempt, event: dict) -> None:
        if event.get("event") == "epoch":
            self.console.print(f"  attempt {attempt.number}: epoch {event['epoch']} committed "
                               f"({event['rows']} rows)")

    def on_end(self, attempt: Attempt) -> None:
        if attempt.crashed:
            fired = attempt.fired or {}
            self.console.print(f"  attempt {attempt.number}: [red]killed[/] at "
                               f"{fired.get('point')} in epoch {fired.get('epoch')}; restarting")
        else:
            self.console.print(f"  attempt {attempt.number}: input drained")
        self.leftovers(attempt)

    def leftovers(self, attempt: Attempt) -> None:
        """Name the processes of the attempt that outlived its driver (the harness killed
        them and checked that none of its processes is alive)."""
        if attempt.killed:
            names = ", ".join(sorted({p.cmdline.split(" -m ")[1].split(" ")[0]
                                      if " -m " in p.cmdline else p.name
                                      for p in attempt.killed}))
            self.console.print(f"  attempt {attempt.number}: {len(attempt.killed)} leftover "
                               f"process(es) killed ({names}); none of the job's processes "
                               "is alive")


def crash_table(attempts: list[Attempt]) -> Table:
    """One row per attempt: the fault armed, where it fired, the exit code, leftovers."""
    crashes = Table(title="injected crashes")
    for column in ("attempt", "armed", "fired at", "epoch", "exit", "leftovers killed"):
        crashes.add_column(column)
    for a in attempts:
        fired = a.fired or {}
        crashes.add_row(str(a.number), a.armed.render() if a.armed else "-",
                        fired.get("point", "-"), str(fired.get("epoch", "-")),
                        str(a.returncode), str(len(a.killed)))
    return crashes


def check_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column ``check | result`` table."""
    table = Table(title=title)
    table.add_column("check")
    table.add_column("result")
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_result(result: DemoResult, console: Console) -> None:
    """The injected crashes and the audit, as tables."""
    console.print(crash_table(result.attempts))
    console.print("after every attempt the job's whole process tree (driver, JVM, PySpark "
                  "worker daemons and workers) was killed and checked: no process left")
    console.print(check_table("audit: input ids vs committed output", result.report.rows()))

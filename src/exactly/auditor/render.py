"""The audit report as terminal tables (``exactly verify`` without ``--json``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from exactly.auditor.report import VerifyReport

#: epochs listed one by one up to this many; beyond it only the epochs with mismatches
ALL_EPOCHS_UP_TO = 20


def print_report(report: VerifyReport, console: Console) -> None:
    """The checks table, then the per-epoch table when the output records epochs."""
    table = Table(title=f"audit: {report.input} -> {report.output}")
    table.add_column("check")
    table.add_column("result")
    for name, value in report.rows():
        style = "" if name != "verdict" else ("bold green" if report.ok else "bold red")
        table.add_row(name, value, style=style)
    console.print(table)
    if not report.epochs:
        return
    bad = [e for e in report.epochs if not e.ok]
    shown = report.epochs if len(report.epochs) <= ALL_EPOCHS_UP_TO else bad
    title = (f"per epoch: {len(report.epochs)} epochs, {len(bad)} with mismatches"
             + ("" if shown is report.epochs else " (only those listed)"))
    epochs = Table(title=title)
    for column in ("epoch", "rows", "duplicated rows", "unexpected rows", "differing rows"):
        epochs.add_column(column, justify="right")
    for e in shown:
        epochs.add_row("none" if e.epoch is None else str(e.epoch), str(e.rows),
                       str(e.duplicated_rows), str(e.unexpected_rows), str(e.differing_rows),
                       style="" if e.ok else "red")
    console.print(epochs)

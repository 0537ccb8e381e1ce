"""``exactly demo --sink postgres``: events -> Spark -> PostgreSQL 2PC sink, under random crashes.

Same contract as :func:`exactly.demos.files.run_demo`: generate events (the deterministic generator,
ids ``0 .. events-1``), run the pipeline as a subprocess under randomly placed ``kill -9``
crashes (:func:`exactly.testing.chaos.run_with_crashes`), restart until the input is drained, then
audit: every id exactly once in the table, and no prepared transaction left behind.

The PostgreSQL server is the one named by ``EXACTLY_PG_DSN``, or, when that is unset, a
temporary one started for the demo (Debian's ``postgresql`` binaries, see
``scripts/setup.sh``) and removed afterwards.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from exactly.auditor import AuditSpec, PostgresLocation, run_audit
from exactly.connectors.sql import TableName, pg_connect, redact_dsn
from exactly.demos.console import ConsoleProgress, DemoResult, check_table, demo_env
from exactly.demos.console import print_result as print_demo_result
from exactly.demos.postgres_job import DSN_ENV, command
from exactly.testing.chaos import random_schedule, run_with_crashes

TABLE = "exactly_demo_events"


@dataclass
class PostgresDemoResult(DemoResult):
    """A :class:`DemoResult` plus the prepared transactions the run left behind (must be 0)."""

    prepared_left: int = 0

    @property
    def ok(self) -> bool:
        return self.report.ok and self.prepared_left == 0


EPOCHS_TARGET = 10


@contextlib.contextmanager
def postgres_server(console: Console) -> Iterator[str]:
    """The DSN of ``EXACTLY_PG_DSN``, or of a temporary server for the demo's duration."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        console.print(f"PostgreSQL: {redact_dsn(dsn)} (from {DSN_ENV})")
        yield dsn
        return
    from exactly.testing.pgcluster import TempPostgres

    with TempPostgres(max_prepared_transactions=10) as server:
        console.print(f"PostgreSQL: temporary server on 127.0.0.1:{server.port} "
                      f"(set {DSN_ENV} to use your own)")
        yield server.dsn


def run_demo(events: int, crashes: int, seed: int, workdir: Path,
             console: Console | None = None) -> PostgresDemoResult:
    """Run the PostgreSQL demo; ``files`` holds the number of epochs (there are no files).

    ``result.ok`` is True only when every id is in the table exactly once and no prepared
    transaction is left behind (``result.report.ok`` alone covers the ids).
    """
    console = console or Console()
    checkpoint = workdir / "checkpoint-postgres"
    shutil.rmtree(checkpoint, ignore_errors=True)
    per_epoch = max(1, math.ceil(events / EPOCHS_TARGET))
    epochs = math.ceil(events / per_epoch)
    schedule = random_schedule(crashes, epochs, random.Random(seed))
    console.print(f"[bold]exactly demo --sink postgres[/]: {events} events -> {epochs} epochs "
                  f"into table {TABLE} via two-phase commit; {len(schedule)} crash(es) planned: "
                  + (", ".join(s.render() for s in schedule) or "none"))

    with postgres_server(console) as dsn:
        with pg_connect(dsn, application="exactly-demo", autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{TABLE}" CASCADE')
        args = ["--sink", "2pc", "--table", TABLE, "--checkpoint", str(checkpoint),
                "--rows", str(events), "--rows-per-epoch", str(per_epoch), "--keys", "100"]
        attempts = run_with_crashes(command(*args), schedule, env=demo_env({DSN_ENV: dsn}),
                                    **ConsoleProgress(console).hooks())
        with pg_connect(dsn, application="exactly-demo", autocommit=True) as conn:
            prepared = int(conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE "
                                        "'exactly:%'").fetchone()[0])
        # the job reads exactly.datagen rows 0..events-1: the expected ids are a range
        report = run_audit(AuditSpec(output=PostgresLocation(dsn, TableName.parse(TABLE)),
                                     expect=f"SELECT range AS id FROM range({events})"))
    if prepared:
        console.print(f"[red]{prepared} prepared transaction(s) left behind[/]")
    return PostgresDemoResult(attempts, report, epochs, epochs, prepared)


def print_result(result: PostgresDemoResult, console: Console) -> None:
    """The injected crashes and the audit, as tables."""
    print_demo_result(result, console)
    console.print(check_table("PostgreSQL", [
        ("epochs", str(result.epochs_expected)),
        ("prepared transactions left", str(result.prepared_left)),
        ("verdict", "EXACTLY ONCE" if result.ok else "MISMATCH")]))


def main() -> None:  # pragma: no cover - manual entry point
    import sys

    console = Console()
    result = run_demo(int(os.environ.get("EVENTS", 20_000)), 3, 7,
                      Path("demo-work").absolute(), console)
    print_result(result, console)
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()

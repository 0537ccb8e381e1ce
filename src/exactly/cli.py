"""The ``exactly`` command line: demo, pipeline, verify, doctor, restore-offsets, faults.

Every command that fails ends its standard error with one line naming the root cause
(``pipeline failed: OSError: [Errno 30] Read-only file system: '/x/out'``), found under
Spark's and Py4J's wrapping by :func:`root_cause`; ``exactly --verbose COMMAND`` prints the
full traceback above it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from exactly.causes import remedy, root_cause
from exactly.ops.doctor import RefusedError

if TYPE_CHECKING:
    from exactly.protocol.faults import FaultSpec

#: exit code of a command that could not do its work (its root cause is the last line)
FAILED = 3


@click.group()
@click.version_option(package_name="exactly")
@click.option("--verbose", is_flag=True,
              help="On failure, print the full traceback above the root cause.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Flink's end-to-end exactly-once model for PySpark Structured Streaming."""
    from exactly.logs import configure

    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    configure()


class _CheckpointType(click.ParamType):
    """A checkpoint argument: a local directory or ``s3a://bucket/prefix``, never a URI
    turned into a local path (``s3a://`` as a local directory ``s3a:``)."""

    name = "CHECKPOINT"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from exactly.checkpoint.location import checkpoint_uri
        from exactly.checkpoint.reach import check_reachable
        from exactly.errors import ConfigError

        try:
            uri = checkpoint_uri(value)
            check_reachable(uri)  # S3: credentials, endpoint, bucket; one line if not
            return uri
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class _PlaceType(click.ParamType):
    """A savepoint or its directory: a local path or ``s3://bucket/prefix``."""

    name = "PATH"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from exactly.checkpoint.location import location_uri
        from exactly.errors import ConfigError

        try:
            return location_uri(value, "savepoint")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


CHECKPOINT = _CheckpointType()
PLACE = _PlaceType()


def reports_failure(command: str, refused: tuple[type[BaseException], ...] = (),
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run a command; on an exception end stderr with ``<command> failed: <root cause>``
    (the traceback above it only with ``--verbose``) and exit with :data:`FAILED`, or with 1
    for the ``refused`` exception types (a refusal that changed nothing)."""

    def decorate(body: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(body)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return body(*args, **kwargs)
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise
            except KeyboardInterrupt:  # Ctrl-C: one line, not Py4J's tracebacks
                sys.stdout.flush()
                sys.stderr.write(f"{command} interrupted (Ctrl-C); committed epochs stay, "
                                 "a restart on the same checkpoint continues from them\n")
                sys.exit(130)
            except Exception as exc:  # every failure gets its root cause
                text = "".join(traceback.format_exception(exc))
                sys.stdout.flush()
                if _verbose():
                    sys.stderr.write(text if text.endswith("\n") else text + "\n")
                cause = root_cause(text)
                fix = remedy(cause)
                if fix is not None:  # above the cause: the root cause stays the last line
                    sys.stderr.write(f"{fix}\n")
                sys.stderr.write(f"{command} failed: {cause}\n")
                sys.stderr.flush()
                sys.exit(1 if isinstance(exc, refused) else FAILED)

        return wrapper

    return decorate


#: the line width of a report written to a file or a pipe: wide enough that no table cell is
#: cut to "…" and no path is folded, so what a script reads or greps is what was printed
PIPED_WIDTH = 1000


def report_console(min_width: int = 0) -> Console:
    """The console a command prints its report to: the terminal's width (at least
    ``min_width``) on a terminal, ``PIPED_WIDTH`` where stdout is a file or a pipe (without
    it rich lays tables out for 80 columns there, or for the width of whatever terminal
    stdin or stderr is attached to, and cuts the cells that do not fit)."""
    if not sys.stdout.isatty():
        return Console(width=PIPED_WIDTH)
    console = Console()
    console.width = max(console.width, min_width)
    return console


def _verbose() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and (ctx.find_root().obj or {}).get("verbose"))


def fault_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--fault``, ``--fault-marker``, ``--fault-action``: fault injection for tests and
    drills (the only way a command arms a crash point; the environment arms none)."""
    for option in reversed((
            click.option("--fault", metavar="POINT[@EPOCH]", default=None,
                         help="Fault injection for tests and drills: crash at this protocol "
                              "point the first time an epoch >= EPOCH passes it (points: "
                              "`exactly faults`)."),
            click.option("--fault-marker", metavar="FILE", default=None,
                         help="With --fault: fire at most once across restarts; FILE records "
                              "where it fired."),
            click.option("--fault-action", metavar="kill|kill-process|pause:FILE",
                         default=None,
                         help="With --fault: SIGKILL the driver's process tree (kill, the "
                              "default), SIGKILL only the process at the point (kill-process: "
                              "on Spark Connect the server's foreachBatch runner) or stall at "
                              "the point while FILE exists."))):
        command = option(command)
    return command


def _fault(fault: str | None, marker: str | None, action: str | None) -> FaultSpec | None:
    from exactly.protocol.faults import FaultSpec

    return FaultSpec.from_flags(fault, str(Path(marker).absolute()) if marker else None,
                                action)


def _fault_schedule(fault: str | None, marker: str | None,
                    action: str | None) -> list[FaultSpec]:
    """``exactly run --fault A@E1,B@E2,...``: one fault per driver in turn, each firing once
    in the run; with ``--fault-marker FILE`` the N-th of several records where it fired in
    FILE's name with ``-N`` before its suffix."""
    from exactly.protocol.faults import FaultSpec

    parts = [part for part in (fault or "").split(",") if part.strip()]
    if len(parts) <= 1:
        single = _fault(fault, marker, action)
        return [single] if single is not None else []
    markers: list[str | None] = [None] * len(parts)
    if marker:
        path = Path(marker).absolute()
        markers = [str(path.with_name(f"{path.stem}-{i}{path.suffix}"))
                   for i in range(1, len(parts) + 1)]
    return [FaultSpec.parse(part, m, action) for part, m in zip(parts, markers, strict=True)]


@main.command()
@click.option("--events", default=20_000, show_default=True, type=click.IntRange(1),
              help="Events to generate (each with a unique id).")
@click.option("--crashes", default=2, show_default=True, type=click.IntRange(0),
              help="Crashes to inject at randomly chosen protocol points.")
@click.option("--seed", default=7, show_default=True, type=int,
              help="Seed of the event values and of the crash schedule.")
@click.option("--workdir", default="demo-work", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for input, output and checkpoint (emptied first).")
@click.option("--format", "output_format", default="parquet", show_default=True,
              type=click.Choice(["parquet", "json"]), help="Output file format (files sink).")
@click.option("--sink", default="files", show_default=True,
              type=click.Choice(["files", "postgres", "kafka"]),
              help="Where the pipeline writes: local files, PostgreSQL or Kafka.")
@reports_failure("demo")
def demo(events: int, crashes: int, seed: int, workdir: Path, output_format: str,
         sink: str) -> None:
    """Generate events, run an exactly-once pipeline under crashes, audit the output.

    Exit code 0 when every event is in the output exactly once, 1 otherwise.
    """
    from importlib import import_module

    from exactly.demos.console import print_result
    from exactly.demos.files import run_demo

    console = Console()
    if sink == "files":
        result = run_demo(events, crashes, seed, workdir.absolute(),
                          output_format=output_format, console=console)
    else:
        module = import_module(f"exactly.demos.{sink}")
        result = module.run_demo(events, crashes, seed, workdir.absolute(), console)
        print_result = getattr(module, "print_result", print_result)
    print_result(result, console)
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option("--input", "input_dir", required=True, type=click.Path(exists=True,
              file_okay=False), help="Directory of JSON-lines events.")
@click.option("--output", "output_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory of the 2PC file sink; with --sink delta the table "
                   "(a directory or an s3:// URI); with --sink iceberg the table's address, "
                   "iceberg:CATALOG?table=NS.NAME (CATALOG: a warehouse directory, "
                   "sqlite:///..., postgresql://..., http://... for REST).")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(file_okay=False),
              help="Checkpoint directory (Spark's offset and commit logs), or s3a://bucket/"
                   "prefix (S3 settings: AWS_* environment variables).")
@click.option("--mode", default="exactly_once", show_default=True,
              type=click.Choice(["exactly_once", "at_least_once"]))
@click.option("--format", "output_format", default="parquet", show_default=True,
              type=click.Choice(["parquet", "json"]))
@click.option("--max-files-per-epoch", default=2, show_default=True, type=click.IntRange(1))
@click.option("--dead-letter", "dead_letter_dir", default=None,
              type=click.Path(file_okay=False), help="Route malformed rows here and go on.")
@click.option("--sink", default="files", show_default=True,
              type=click.Choice(["files", "delta", "iceberg"]),
              help="exactly.files, exactly.delta or exactly.iceberg (S3 settings: AWS_* "
                   "environment variables).")
@click.option("--writer", default="start_query", show_default=True,
              type=click.Choice(["start_query", "datasource"]),
              help="start_query: the sink commits in the driver (foreachBatch); datasource: "
                   "PySpark's own writeStream.format(...).start(), the sink's data source "
                   "writer commits in Spark's commit process.")
@fault_options
@reports_failure("pipeline")
def pipeline(input_dir: str, output_dir: str, checkpoint_dir: str, mode: str,
             output_format: str, max_files_per_epoch: int, dead_letter_dir: str | None,
             sink: str, writer: str, fault: str | None, fault_marker: str | None,
             fault_action: str | None) -> None:
    """Drain an input directory through the demo pipeline into the file sink (or a Delta
    table with --sink delta, an Iceberg table with --sink iceberg), then stop.

    Fault injection (tests and drills): --fault POINT[@EPOCH] (see `exactly faults`). Spark's
    own log is off unless --verbose (or EXACTLY_SPARK_LOG_LEVEL) asks for it.
    """
    from exactly.demos.files_job import PipelineSpec, run
    from exactly.spark.session import spark_session

    armed = _fault(fault, fault_marker, fault_action)
    if not _verbose():  # Spark's ERROR log repeats the worker's traceback per task
        os.environ.setdefault("EXACTLY_SPARK_LOG_LEVEL", "OFF")
    spec = PipelineSpec(input_dir, output_dir, checkpoint_dir, mode, output_format,
                        max_files_per_epoch, dead_letter_dir, sink, writer, armed)
    spark = spark_session(app_name="exactly-pipeline",
                          s3a=checkpoint_dir.startswith("s3a://"))
    try:
        run(spark, spec)
    finally:
        spark.stop()  # before the root cause is printed, so it stays the last line


VERIFY_EPILOG = """\b
Locations (--input, --output):
  DIR or FILE                       JSON lines, Parquet or CSV files (the file sink's output)
  s3://bucket/prefix (or s3a://)    the same files on S3 (settings: AWS_ENDPOINT_URL,
                                    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, ...)
  DIR or s3://... with _delta_log/  a Delta table: only the files of its newest version
                                    (delta:LOCATION: must be one; LOCATION?version=N)
  iceberg:CATALOG?table=NS.NAME     an Iceberg table through its catalog: the files of its
                                    current snapshot (CATALOG: a warehouse DIR,
                                    sqlite:////path/catalog.db, postgresql://user@host/db or
                                    http://host:port (REST); &snapshot=ID,
                                    &catalog.name=NAME, &warehouse=DIR|s3://...)
  postgresql://user@host/db?table=T a PostgreSQL table or view (or --dsn-env with --table)
  kafka://host:port/topic           every record of a topic, JSON values
  sqlite:///file.db?table=T         a SQLite table (sqlite:////abs/path.db: absolute)
\b
Examples:
  exactly verify --input data/in --output data/out --where "amount > 0"
  exactly verify --input data/in --output s3://exports/out --compare-columns '*'
  exactly verify --input data/in --output delta:s3://lake/events
  exactly verify --input data/in --output 'iceberg:data/lake?table=db.events'
  exactly verify --input data/in --dsn-env PG_DSN --table totals --key key \\
      --expect "select key, count(*) as n from input group by key" --compare-columns n
Exit status: 0 exactly once, 1 any mismatch, 2 bad input, 3 the audit failed.
"""


@main.command(epilog=VERIFY_EPILOG)
@click.option("--input", "input_path", metavar="LOCATION",
              help="The job's input: files, a table or a topic (see below).")
@click.option("--output", "output_path", metavar="LOCATION",
              help="What the sink made visible: files (local or S3), a Delta or Iceberg "
                   "table, a table or a topic.")
@click.option("--table", help="PostgreSQL table of --output, with --dsn-env (or for a URL "
                              "without ?table=).")
@click.option("--input-table", help="PostgreSQL table of --input, with --dsn-env.")
@click.option("--dsn-env", metavar="VARIABLE",
              help="Environment variable holding the PostgreSQL DSN (the password stays out "
                   "of the command line and is never printed).")
@click.option("--key", "--id-column", "keys", default="id", show_default=True,
              help="Column(s) identifying a row, comma-separated: an event id, or the "
                   "group-by keys of an aggregation.")
@click.option("--where", metavar="SQL", help="The job's filter, as a SQL predicate over the "
                                             "input's columns: expected = input WHERE SQL.")
@click.option("--expect", metavar="SQL",
              help="The expected rows as a SQL query over the table `input` (DuckDB SQL), "
                   "e.g. a projection or the batch truth of an aggregation.")
@click.option("--compare-columns", metavar="COLS",
              help="Columns whose values must agree too, comma-separated; * for every expected "
                   "column the output has.")
@click.option("--tolerance", default=1e-9, show_default=True, type=click.FloatRange(0),
              help="Float difference allowed, relative to the larger value (absolute below 1).")
@click.option("--latest-by-key", is_flag=True,
              help="Compare each key's newest row of the output (a topic of updates, "
                   "upserts across epoch directories, Delta or Iceberg commits).")
@click.option("--monotonic", metavar="COLUMN",
              help="Report keys whose COLUMN moved backwards along the output's history "
                   "(a topic's offsets, the file sink's epochs, a Delta or Iceberg table's "
                   "commits).")
@click.option("--isolation", default="read_committed", show_default=True,
              type=click.Choice(["read_committed", "read_uncommitted"]),
              help="How Kafka topics are read; read_uncommitted adds aborted transactions.")
@click.option("--epoch-column", default="exactly_epoch", show_default=True,
              help="A table column holding each row's epoch (for the per-epoch breakdown).")
@click.option("--memory-limit", default="1GB", show_default=True,
              help="Memory the audit engine may use before it spills to a temporary "
                   "directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@reports_failure("verify")
def verify(input_path: str | None, output_path: str | None, table: str | None,
           input_table: str | None, dsn_env: str | None, keys: str, where: str | None,
           expect: str | None, compare_columns: str | None, tolerance: float,
           latest_by_key: bool, monotonic: str | None, isolation: str, epoch_column: str,
           memory_limit: str, as_json: bool) -> None:
    """Audit a job's output against its input: every expected row exactly once.

    Reports keys missing, duplicated and unexpected, values that differ, and per epoch
    where the output records epochs. Exit 1 on any mismatch, 2 on bad input.
    """
    from exactly.auditor import AuditSpec, parse_location, run_audit
    from exactly.errors import AuditInputError

    def columns(text: str | None) -> tuple[str, ...]:
        return tuple(c.strip() for c in (text or "").split(",") if c.strip())

    try:
        spec = AuditSpec(
            output=parse_location(output_path, table=table, dsn_env=dsn_env,
                                  what="--output"),
            input=(parse_location(input_path, table=input_table,
                                  dsn_env=dsn_env if input_table else None, what="--input")
                   if input_path or input_table else None),
            keys=columns(keys), where=where, expect=expect, compare=columns(compare_columns),
            tolerance=tolerance, latest_by_key=latest_by_key, monotonic=monotonic,
            isolation=isolation, epoch_column=epoch_column, memory_limit=memory_limit)
        report = run_audit(spec)
    except AuditInputError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"verify: bad input: {exc}\n")
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        from exactly.auditor.render import print_report

        print_report(report, report_console())
    sys.exit(0 if report.ok else 1)


@main.command()
def faults() -> None:
    """List the points where a crash can be injected: the protocol's and the sinks' own.

    Arm one with `exactly run --fault POINT[@EPOCH]` or `exactly pipeline --fault ...`, or
    the sink option exactly.fault (fault injection for tests and drills).
    """
    from exactly.protocol.faults import registered_points
    from exactly.spark import formats  # noqa: F401  (loading the sinks registers their points)

    for info in registered_points().values():
        where = "driver" if info.on_driver else "executor"
        click.echo(f"{info.name:24} {where:9} {info.description}")


@main.command()
@click.option("--kafka", is_flag=True, help="Spark's Kafka connector (format(\"kafka\")).")
@click.option("--s3a", is_flag=True, help="Spark's S3A file system (checkpoints on s3a://).")
@click.option("--submit", is_flag=True, help="Print spark-submit arguments, not settings.")
@click.option("--download", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Resolve the jars from Maven Central and copy them into this directory "
                   "(for EXACTLY_KAFKA_CONNECTOR_JARS / EXACTLY_S3A_JARS offline).")
@reports_failure("packages")
def packages(kafka: bool, s3a: bool, submit: bool, download: Path | None) -> None:
    """The jars PySpark lacks, the Spark way: the settings (`key=value` a line) that make
    Spark resolve them from Maven Central when the driver starts, for spark-submit --conf
    or a notebook's session builder. spark_session(kafka=True, s3a=True) applies the same.
    """
    from exactly.spark import packages as jars

    if not (kafka or s3a):
        raise click.UsageError("name what to load: --kafka, --s3a or both")
    if download is not None:
        for jar in jars.download(download, kafka=kafka, s3a=s3a):
            click.echo(str(jar))
    elif submit:
        click.echo(" ".join(shlex.quote(a) for a in jars.submit_args(kafka=kafka, s3a=s3a)))
    else:
        for key, value in jars.packages_conf(kafka=kafka, s3a=s3a).items():
            click.echo(f"{key}={value}")


@main.command()
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--sink-log", default=None, type=click.Path(file_okay=False),
              help="The exactly sink's commit-log directory (default: CHECKPOINT/exactly-sink "
                   "when it exists).")
@click.option("--sink-path", default=None, type=click.Path(file_okay=False),
              help="Output directory of the file sink (its log is OUTPUT/_exactly).")
@click.option("--table", default=None, metavar="iceberg:CATALOG?table=NS.NAME",
              help="The Iceberg table the job writes: its epochs, pending attempts and stray "
                   "data files are checked against the sink log.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@reports_failure("doctor")
def doctor(checkpoint: str, sink_log: str | None, sink_path: str | None, table: str | None,
           as_json: bool) -> None:
    """Check a checkpoint and an exactly sink's log offline; changes nothing.

    Reports damaged, missing or stray files, gaps, a sink of another query, pending
    recovery, epochs Spark would re-plan, and the lease holder, each with the safe repair.
    Exit code 0 when there is no error, 1 otherwise.
    """
    from exactly.ops.doctor import diagnose

    report = diagnose(checkpoint, sink_log, sink_path, table)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        shown = Table(title=f"doctor: {checkpoint}" + (f" + {report.sink_log}"
                                                       if report.sink_log else ""))
        for column in ("severity", "file", "finding", "safe repair"):
            shown.add_column(column, overflow="fold")
        colours = {"error": "red", "warning": "yellow", "info": "cyan"}
        for f in sorted(report.findings, key=lambda f: ("error", "warning", "info")
                        .index(f.severity)):
            shown.add_row(f"[{colours[f.severity]}]{f.severity}[/]", f.path, f.problem,
                          f.repair)
        console = report_console(min_width=160)
        console.print(shown)
        errors = sum(f.severity == "error" for f in report.findings)
        console.print("clean: no errors" if report.ok else f"{errors} error(s)")
    sys.exit(0 if report.ok else 1)


@main.command(context_settings={"show_default": True})
@click.argument("table")
@click.option("--target-file-mb", type=click.IntRange(1), default=None,
              help="Largest compacted file, MiB (default: Delta 128, Iceberg 512).")
@click.option("--min-files", type=click.IntRange(2), default=2,
              help="Write a compacted file only when it replaces at least this many.")
@click.option("--keep-newest-epochs", type=click.IntRange(0), default=0,
              help="Leave each query's newest N epochs as they are.")
@click.option("--split-after", type=click.IntRange(0), multiple=True,
              help="An epoch no compacted file goes past (a savepoint's: a retract to it "
                   "stays possible). Repeatable.")
@click.option("--dry-run", is_flag=True, help="Print what would be compacted; write nothing.")
@click.option("--every", "every", type=click.FloatRange(min=0.1), default=None,
              metavar="SECONDS", help="Compact every SECONDS until stopped (Ctrl-C, SIGTERM).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@reports_failure("compact")
def compact(table: str, target_file_mb: int | None, min_files: int, keep_newest_epochs: int,
            split_after: tuple[int, ...], dry_run: bool, every: float | None,
            as_json: bool) -> None:
    """Compact the small files an exactly Delta or Iceberg sink wrote into TABLE, in one
    commit that changes no row and never makes the job's epoch commits fail.

    TABLE: iceberg:CATALOG?table=NS.NAME, or a Delta table (delta:PATH, or a directory /
    s3:// prefix holding _delta_log/). Safe while the job runs. Exit code 0 done (also
    when there was nothing to compact), 2 bad input, 3 a failure (nothing changed).
    """
    import signal
    import threading

    from exactly.errors import ConfigError
    from exactly.ops.compaction import CompactionPlan, check_table, compact_every, compact_once

    try:
        check_table(table)  # a bad TABLE fails before anything runs
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="TABLE") from None
    plan = CompactionPlan(table, None if target_file_mb is None else target_file_mb << 20,
                          min_files, keep_newest_epochs, tuple(split_after), dry_run)
    if every is None:
        result = compact_once(plan)
        if as_json:
            click.echo(json.dumps(result, indent=1))
        else:
            done = "would rewrite" if dry_run else "rewrote"
            click.echo(f"{table}: {done} {result['rewritten_files']} file(s) into "
                       f"{result['written_files']}; live files {result['files_before']} -> "
                       f"{result['files_after']}")
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        compact_every(plan, every, click.echo, stop, failures=(Exception,))


@main.command("restore-offsets")
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--sink-log", default=None, type=click.Path(file_okay=False),
              help="The exactly sink's commit-log directory.")
@click.option("--sink-path", default=None, type=click.Path(file_okay=False),
              help="Output directory of the file sink (its log is OUTPUT/_exactly).")
@click.option("--epoch", required=True, type=click.IntRange(0),
              help="The epoch whose offsets entry to put back.")
@reports_failure("restore-offsets", refused=(RefusedError,))
def restore_offsets(checkpoint: str, sink_log: str | None, sink_path: str | None,
                    epoch: int) -> None:
    """Write the offsets entry the sink recorded for EPOCH back into the checkpoint.

    The repair for a re-planned epoch (ReplannedEpochError): Spark then replays the epoch
    over the input it was committed with. Refuses while a driver holding the sink's lease is
    alive, when the sink has no record of the epoch, and when offsets/EPOCH already holds it.
    """
    from exactly.ops.doctor import restore_from_sink_log

    target = restore_from_sink_log(checkpoint, sink_log, sink_path, epoch)
    click.echo(f"restored {target} from the sink's record; start the query again: Spark "
               f"replays epoch {epoch} over the input it was committed with")


@main.command(context_settings={"show_default": True})
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--checkpoint", "checkpoint_dir", default=None,
              type=CHECKPOINT,
              help="Checkpoint directory: the job's address for stop, cancel and restarts "
                   "[default: the job's CheckpointConfig(storage=...), learnt by building the "
                   "job once before it starts].")
@click.option("--restart-strategy", "strategy", default=None, metavar="NAME",
              callback=lambda ctx, param, value: _strategy_name(value),
              help="Flink's restart strategies: exponential-delay, fixed-delay, failure-rate, "
                   "none (and Flink's other spellings: fixeddelay, off, disable, ...) "
                   "[default: the job's, else exponential-delay].")
@click.option("--restart-option", "strategy_options", multiple=True, metavar="KEY=VALUE",
              help="A strategy option with Flink's name, e.g. attempts=3, delay=10s, "
                   "initial-backoff=1s (repeatable).")
@click.option("--master", default=None, help="Spark master URL [default: local[2]].")
@click.option("--remote", default=None, metavar="sc://HOST:PORT",
              help="Run the job on this Spark Connect server [default: $SPARK_REMOTE, as "
                   "PySpark reads it; unset: a Spark driver of its own]. A lost server: the "
                   "driver process is restarted, reconnects and resumes from the checkpoint.")
@click.option("--spark-ui", is_flag=True, help="Keep Spark's web UI on.")
@click.option("--shuffle-partitions", default=None, type=click.IntRange(1),
              help="spark.sql.shuffle.partitions of a new checkpoint.")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting (repeatable).")
@click.option("--stop-timeout", default="10min",
              help="How long a stop waits for the epoch in flight before cancelling it.")
@click.option("-s", "--from-savepoint", "savepoint", default=None, type=PLACE,
              help="Restore this savepoint, or the last completed epoch of this retained "
                   "checkpoint (CHECKPOINT@N: its retained epoch N, listed by `exactly "
                   "checkpoints`), into the new checkpoint first.")
@click.option("--allow-non-restored-state", is_flag=True,
              help="Drop the savepoint's state of operators the job no longer has.")
@click.option("--state-backend", type=click.Choice(["rocksdb", "hashmap"]), default=None,
              help="The state backend, over the job's CheckpointConfig: with -s the restore "
                   "rewrites the state into it; a checkpoint that holds the other one is "
                   "refused [default: the job's, else the checkpoint's, else rocksdb].")
@click.option("--savepoint-dir", default=None, type=PLACE, metavar="PATH",
              help="Where savepoints go when none is named (`exactly savepoint`, `stop "
                   "--savepoint`, `upgrade`), over the job's CheckpointConfig(savepoint_dir) "
                   "[default: <CHECKPOINT>.savepoints].")
@click.option("--restore-mode", type=click.Choice(["no_claim", "claim"]), default="no_claim",
              help="no_claim: never change or depend on the savepoint; claim: the job takes "
                   "it over (deleted once the restore completed).")
@click.option("--parallelism", default=None, type=click.IntRange(1),
              help="State partitions of the restored job [default: --shuffle-partitions, "
                   "the job's spark.sql.shuffle.partitions, else the savepoint's].")
@click.option("--sink-rollback", type=click.Choice(["refuse", "retract", "keep"]),
              default="refuse",
              help="When the sink target already holds epochs newer than the savepoint "
                   "(of its job or of jobs restored from it): refuse, retract them (file "
                   "sink, PostgreSQL append, Delta) or keep them.")
@click.option("--spare-driver", type=click.Choice(["auto", "on", "off"]), default="auto",
              help="Keep a warm spare driver (session started, job built, no query) that "
                   "takes the job over when the driver process dies, so a restart skips the "
                   "driver's start. auto: on with a local master, off on Spark Connect and "
                   "on cluster masters (where it does not help). See docs/operations.md.")
@click.option("--ha", is_flag=True,
              help="High availability: run this on several hosts; one leads (a lease in the "
                   "checkpoint store), the others stand by and take the job over when the "
                   "leader's host dies, pauses or is cut off. See docs/ha.md.")
@click.option("--host-id", default=None, metavar="NAME",
              help="This host's id for --ha and leases [default: $EXACTLY_HOST_ID, else the "
                   "host name]; unique per live launcher.")
@click.option("--ha-lease-duration", default="15s",
              help="How long the leader's lease lasts without a renewal: a standby takes "
                   "over this long after the leader stopped renewing.")
@click.option("--ha-renew-interval", default="3s", help="How often the leader renews.")
@click.option("--ha-renew-deadline", default="10s",
              help="A leader that could not renew for this long kills its driver (less "
                   "than the lease duration).")
@click.option("--ha-standby-poll", default="3s",
              help="How often a standby looks at the lease.")
@click.option("--ha-warm-standby", is_flag=True,
              help="A standby keeps a warm spare driver (session started, job built, no "
                   "query), so a failover costs the lease wait and a takeover, not a driver "
                   "start. Costs the spare's memory on every standby host.")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve the job's Prometheus metrics (Flink's names) on "
                   "http://HOST:PORT/metrics while it runs, across driver restarts [default: "
                   "off]. See docs/monitoring.md.")
@click.option("--metrics-host", default="127.0.0.1",
              help="Address of --metrics-port; the default keeps it on this machine.")
@fault_options
@reports_failure("run")
def run(job_file: str, checkpoint_dir: str | None, strategy: str | None,
        strategy_options: tuple[str, ...], master: str | None, remote: str | None,
        spark_ui: bool, shuffle_partitions: int | None, spark_conf: tuple[str, ...],
        stop_timeout: str, savepoint: str | None, allow_non_restored_state: bool,
        state_backend: str | None, savepoint_dir: str | None,
        restore_mode: str, parallelism: int | None, sink_rollback: str, spare_driver: str,
        ha: bool,
        host_id: str | None, ha_lease_duration: str, ha_renew_interval: str,
        ha_renew_deadline: str, ha_standby_poll: str, ha_warm_standby: bool,
        metrics_port: int | None,
        metrics_host: str, fault: str | None, fault_marker: str | None,
        fault_action: str | None) -> None:
    """Run JOB_FILE (a Python file with build(spark) -> exactly.Job) under a supervisor.

    Failed queries restart in the same driver process, a dead driver process restarts as a
    new one, both as the restart strategy says. Stop it with `exactly stop CHECKPOINT`,
    SIGTERM or Ctrl-C; cancel it with `exactly cancel CHECKPOINT`. Exit code 0 when it
    stopped, 3 when it failed (the cause is the last line).

    Fault injection (tests and drills): --fault POINT[@EPOCH] crashes the driver at a point
    of the job's exactly sink, of a savepoint or of a restore, once per run (--fault-marker
    FILE: once across runs).

    On Spark Connect (--remote sc://HOST:PORT, or SPARK_REMOTE) the query runs in the
    server; this command supervises it the same way, and a lost server (its restart) means
    a new driver process that reconnects and resumes from the checkpoint.
    """
    from exactly.checkpoint.store import is_remote
    from exactly.config import parse_duration
    from exactly.ops.driver import DriverSpec, refuse_on_connect
    from exactly.ops.job_savepoints import RestoreRequest, is_checkpoint, retained_epoch
    from exactly.ops.restart import parse_option_pairs
    from exactly.savepoints.manifest import read_manifest
    from exactly.savepoints.restore import RestoreMode
    from exactly.savepoints.sinks import SinkRollback
    from exactly.spark.connect import remote_url

    if not _verbose():
        os.environ.setdefault("EXACTLY_SPARK_LOG_LEVEL", "OFF")
    remote = remote_url(remote)  # --remote, else SPARK_REMOTE; an URL not sc:// fails here
    restore = None
    if savepoint is not None:
        place, epoch = retained_epoch(savepoint)
        if not is_checkpoint(place):
            if epoch is not None:
                raise click.UsageError(f"-s {savepoint}: @{epoch} names an epoch of a "
                                       f"retained checkpoint, and {place} is not one")
            # a damaged or incomplete one fails before Spark starts (one on S3 by its sizes
            # here: the driver downloads it and checks every file's SHA-256 before a write)
            read_manifest(savepoint, checksums=not is_remote(savepoint))
        elif restore_mode == "claim":
            raise click.UsageError(f"{savepoint} is a checkpoint, which a restore only reads: "
                                   "--restore-mode claim applies to savepoints")
        restore = RestoreRequest(savepoint, allow_non_restored_state,
                                 RestoreMode(restore_mode), parallelism,
                                 SinkRollback(sink_rollback)).to_json()
    elif allow_non_restored_state or parallelism or restore_mode != "no_claim" or (
            sink_rollback != "refuse"):
        raise click.UsageError("--allow-non-restored-state, --restore-mode, --parallelism "
                               "and --sink-rollback belong to a restore: add -s SAVEPOINT")
    spec = DriverSpec(job_file=str(Path(job_file).absolute()), checkpoint=checkpoint_dir,
                      strategy=strategy,
                      strategy_options=parse_option_pairs(strategy_options), master=master,
                      spark_ui=spark_ui, shuffle_partitions=shuffle_partitions,
                      spark_conf=_pairs(spark_conf, "--conf"),
                      stop_timeout_s=parse_duration(stop_timeout, name="--stop-timeout"),
                      restore=restore, fault_schedule=_fault_schedule(fault, fault_marker,
                                                                      fault_action),
                      remote=remote, spare_driver=spare_driver,
                      checkpoint_settings=_checkpoint_settings(state_backend, savepoint_dir))
    refuse_on_connect(spec, ha=ha)  # before anything starts
    endpoint = None
    if metrics_port is not None:
        from dataclasses import replace

        from exactly.monitoring.endpoint import start
        from exactly.ops.launcher import checkpoint_of

        endpoint = start(metrics_host, metrics_port)  # a port in use fails here, before Spark
    try:
        if endpoint is not None:
            spec = replace(spec, checkpoint=checkpoint_of(spec))
            endpoint.watch(spec.checkpoint or "")
        _run(spec, ha, host_id, ha_lease_duration, ha_renew_interval, ha_renew_deadline,
             ha_standby_poll, ha_warm_standby)
    finally:
        if endpoint is not None:
            endpoint.close()


def _run(spec: Any, ha: bool, host_id: str | None, ha_lease_duration: str,
         ha_renew_interval: str, ha_renew_deadline: str, ha_standby_poll: str,
         ha_warm_standby: bool = False) -> None:
    """``exactly run`` once its options are checked: one launcher, or an HA one."""
    from exactly.checkpoint.leader import host_id_from
    from exactly.config import parse_duration

    if ha_warm_standby and not ha:
        raise click.UsageError("--ha-warm-standby belongs to --ha (a standby launcher's "
                               "spare); a plain `exactly run` keeps a spare by default "
                               "(--spare-driver)")
    if ha_warm_standby and spec.remote:
        raise click.UsageError("--ha-warm-standby: --ha does not run on Spark Connect")
    if not ha:
        from exactly.ops.launcher import launch

        if host_id is not None:
            from exactly.procs import HOST_ID_ENV

            os.environ[HOST_ID_ENV] = str(host_id_from(host_id))
        sys.exit(launch(spec))
    from exactly.errors import ConfigError
    from exactly.ops.ha import HaSettings, launch_ha

    settings = HaSettings(
        lease_s=parse_duration(ha_lease_duration, name="--ha-lease-duration"),
        renew_s=parse_duration(ha_renew_interval, name="--ha-renew-interval"),
        renew_deadline_s=parse_duration(ha_renew_deadline, name="--ha-renew-deadline"),
        standby_poll_s=parse_duration(ha_standby_poll, name="--ha-standby-poll"),
        host_id=host_id_from(host_id), warm_standby=ha_warm_standby)
    try:
        settings.check()
    except ConfigError as exc:  # options that do not go together: a usage error
        raise click.UsageError(str(exc)) from None
    sys.exit(launch_ha(spec, settings))


def _checkpoint_settings(state_backend: str | None,
                         savepoint_dir: str | None) -> dict[str, str]:
    """The CheckpointConfig settings ``exactly run`` gives over the job's own."""
    given = {"state_backend": state_backend, "savepoint_dir": savepoint_dir}
    return {name: value for name, value in given.items() if value is not None}


def _strategy_name(value: str | None) -> str | None:
    """A restart strategy's name as Flink spells it (any of its spellings, any case)."""
    from exactly.ops.restart import STRATEGY_NAMES

    if value is None or value.strip().lower() in STRATEGY_NAMES:
        return value
    raise click.BadParameter(f"{value!r} is not one of {', '.join(STRATEGY_NAMES)}",
                             param_hint="--restart-strategy")


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: write KEY=VALUE", param_hint=option)
        pairs[key.strip()] = rest.strip()
    return pairs


@main.command(context_settings={"show_default": True})
@click.argument("checkpoint", required=False, type=CHECKPOINT)
@click.option("--drain", is_flag=True,
              help="First process all input available now (a bounded end), then run one "
                   "final epoch with the event-time watermark at the end of time (every "
                   "window and event-time timer fires and is committed), then stop "
                   "(Flink's stop --drain).")
@click.option("--timeout", "wait", default="15min", help="How long to wait for the answer.")
@click.option("--savepoint", "savepoint_target", is_flag=False, flag_value="", default=None,
              metavar="[TARGET]",
              help="Take a savepoint after the stop (into TARGET, default the job's "
                   "savepoint directory, else <CHECKPOINT>.savepoints): Flink's "
                   "stop-with-savepoint. "
                   "`stop --savepoint CHECKPOINT` takes it into the default target.")
@click.option("--savepoint-path", "-p", "savepoint_path", default=None, metavar="TARGET",
              help="Take a savepoint after the stop into TARGET (Flink's --savepointPath).")
@reports_failure("stop")
def stop(checkpoint: str | None, drain: bool, wait: str, savepoint_target: str | None,
         savepoint_path: str | None) -> None:
    """Stop the job running on CHECKPOINT: the epoch in flight commits, then it stops."""
    if checkpoint is None and savepoint_target:
        # `stop --savepoint CK`: the option's optional value was the checkpoint itself
        checkpoint, savepoint_target = CHECKPOINT.convert(savepoint_target, None, None), ""
    if checkpoint is None:
        raise click.UsageError("give the CHECKPOINT of the job to stop")
    if savepoint_path is not None:
        if savepoint_target:
            raise click.UsageError("give the savepoint's TARGET once: --savepoint TARGET or "
                                   "--savepoint-path TARGET")
        savepoint_target = savepoint_path
    params: dict[str, Any] = {"drain": drain}
    if savepoint_target is not None:
        params["savepoint"] = PLACE.convert(savepoint_target, None, None) \
            if savepoint_target else ""
    _control(checkpoint, "stop", wait, **params)


@main.command(context_settings={"show_default": True})
@click.argument("checkpoint", type=CHECKPOINT)
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--parallelism", default=None, type=click.IntRange(1),
              help="State partitions of the new job [default: its "
                   "spark.sql.shuffle.partitions, else the savepoint's].")
@click.option("--allow-non-restored-state", is_flag=True,
              help="Drop the savepoint's state of operators the new job no longer has.")
@click.option("--sink-rollback", type=click.Choice(["refuse", "retract", "keep"]),
              default="refuse",
              help="A rollback to the old job (the new one failed in its first epochs) when "
                   "the sink target already holds the new job's epochs: refuse (the job "
                   "then fails, the savepoint kept), retract them, or keep them.")
@click.option("--epochs", default=3, type=click.IntRange(1),
              help="Epochs the new job must commit before the upgrade is done; a failure "
                   "before that rolls back to the old job file.")
@click.option("--savepoint", "target", default=None, type=PLACE, metavar="TARGET",
              help="Where the upgrade's savepoint goes [default: <CHECKPOINT>.savepoints].")
@click.option("--timeout", "wait", default="15min", help="How long to wait for the answer.")
@reports_failure("upgrade")
def upgrade(checkpoint: str, job_file: str, parallelism: int | None,
            allow_non_restored_state: bool, sink_rollback: str, epochs: int,
            target: str | None, wait: str) -> None:
    """Upgrade the job running on CHECKPOINT to JOB_FILE through a savepoint, without a
    driver start in the gap.

    The `exactly run` of the job starts JOB_FILE's driver warm beside the running one and
    checks the restore (operators, state schemas, sources, the sink) before it touches the
    running job; then it stops the job with a savepoint, restores the savepoint into the
    same checkpoint in the warm driver and watches the new job's first --epochs epochs. If
    the new job fails before, the old job file is restored from the same savepoint (with
    --sink-rollback) and the upgrade ends as rolled back. From the restore on, the checkpoint
    is JOB_FILE's: later restarts run it, and the next time you start the job, start
    JOB_FILE (the old file is refused). Exit code 0 when upgraded, 3 when refused (the
    running job untouched), rolled back or failed. See docs/savepoints.md.
    """
    from exactly.checkpoint.location import job_store
    from exactly.checkpoint.status import JobStatus
    from exactly.ops.upgrade import UpgradeRequest

    status = JobStatus.read(job_store(checkpoint))
    if status is not None and status.in_process and status.alive():
        click.echo(f"upgrade: refused: the job on {checkpoint} runs inside its own process "
                   "(run_job or start_query), with no `exactly run` launcher to carry an "
                   "upgrade out: stop it with a savepoint and start the new version from it "
                   "(docs/savepoints.md)")
        sys.exit(FAILED)
    request = UpgradeRequest(str(Path(job_file).absolute()), parallelism,
                             allow_non_restored_state, sink_rollback, epochs, target)
    _control(checkpoint, "upgrade", wait, **request.params())


@main.command("checkpoint", context_settings={"show_default": True})
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--timeout", "wait", default="5min", help="How long to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as one JSON object.")
@reports_failure("checkpoint")
def checkpoint_now(checkpoint: str, wait: str, as_json: bool) -> None:
    """Trigger a checkpoint of the job running on CHECKPOINT now (Flink's `flink
    checkpoint`); prints the epoch's number once it committed.

    The answer is the first epoch that starts after the request and commits (an epoch in
    flight does not count); the min pause is waived for it, Spark's trigger still starts it
    (at most one trigger interval). With no new input Spark runs no epoch: the answer is
    then the last committed epoch, marked nothing-new. Exit code 0 when answered, non-zero
    when no job runs on CHECKPOINT, the job ends first or --timeout passes.
    """
    from exactly.checkpoint.control import ControlChannel
    from exactly.config import parse_duration

    channel = ControlChannel(checkpoint)
    request = channel.send("checkpoint")
    answer = channel.wait_answer(request, parse_duration(wait, name="--timeout"))
    if answer is None:
        raise TimeoutError(f"no manual checkpoint of the job on {checkpoint} committed "
                           f"within {wait}; the request stays queued (its epoch is still "
                           "recorded as manual when it commits); give a longer --timeout")
    if as_json:
        click.echo(json.dumps({k: answer.get(k) for k in
                               ("status", "epoch", "nothing_new", "detail", "id")}))
    elif answer.get("status") == "done":
        click.echo(str(answer.get("epoch")) if not answer.get("nothing_new")
                   else f"{answer.get('epoch')} ({answer.get('detail')})")
    else:
        click.echo(f"checkpoint: {answer.get('status')}: {answer.get('detail')}")
    if answer.get("status") != "done":
        sys.exit(FAILED)


@main.command(context_settings={"show_default": True})
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--timeout", "wait", default="5min", help="How long to wait for the answer.")
@reports_failure("cancel")
def cancel(checkpoint: str, wait: str) -> None:
    """Cancel the job running on CHECKPOINT at once (the epoch in flight is aborted).

    With externalized_cleanup='delete_on_cancellation' the checkpoint is deleted.
    """
    _control(checkpoint, "cancel", wait)


@main.command(context_settings={"show_default": True})
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--json", "as_json", is_flag=True,
              help="Print the overview as one JSON object (with --follow: every history "
                   "record as a JSON line, old ones first, then new ones as they come).")
@click.option("--follow", is_flag=True, help="Keep watching the job; Ctrl-C ends.")
@click.option("--rows", default=10, type=click.IntRange(1), help="History rows shown.")
@reports_failure("checkpoints")
def checkpoints(checkpoint: str, as_json: bool, follow: bool, rows: int) -> None:
    """A job's checkpoints: counts, latest, history, summary, restarts, configuration.

    Reads the history exactly records in CHECKPOINT/exactly-job/history while the job runs;
    works as well after the job stopped. A damaged history line is skipped with a warning.
    """
    from exactly.monitoring import overview, terminal

    loaded = overview.load(checkpoint)
    console = report_console()
    if follow and as_json:
        _follow_records(checkpoint, terminal.follow_interval(loaded.overview))
        return
    if as_json:
        click.echo(json.dumps({**loaded.overview.to_json(),
                               "restorable_epochs": _restorable(checkpoint)}))
        return
    if not follow:
        console.print(terminal.render(loaded.overview, rows=rows))
        _print_restorable(console, checkpoint)
        return
    from rich.live import Live

    with Live(terminal.render(loaded.overview, rows=rows), console=console,
              refresh_per_second=2, screen=False) as live:
        while True:
            time.sleep(terminal.follow_interval(loaded.overview))
            loaded = overview.load(checkpoint)
            live.update(terminal.render(loaded.overview, rows=rows))


def _restorable(checkpoint: str) -> list[int]:
    """The epochs ``exactly run -s CHECKPOINT@N`` can restore: none for a checkpoint that
    holds no query yet, or whose files cannot be read (the overview names the damage)."""
    from exactly.errors import ExactlyError
    from exactly.savepoints.take import restorable_epochs

    try:
        return restorable_epochs(checkpoint)
    except (FileNotFoundError, ExactlyError):
        return []


def _print_restorable(console: Any, checkpoint: str) -> None:
    from exactly.savepoints.take import spans

    epochs = _restorable(checkpoint)
    console.print(f"restorable epochs: {spans(epochs)}"
                  + (f" (exactly run JOB --checkpoint NEW -s {checkpoint}@N)" if epochs
                     else ""))


@main.command(context_settings={"show_default": True})
@click.argument("checkpoints_", nargs=-1, required=True, metavar="CHECKPOINT...",
                type=CHECKPOINT)
@click.option("--port", default=8081, type=click.IntRange(1, 65535),
              help="Port to listen on (Flink's web UI uses 8081 too).")
@click.option("--host", default="127.0.0.1",
              help="Address to listen on; the default keeps the dashboard on this machine.")
@reports_failure("ui")
def ui(checkpoints_: tuple[str, ...], port: int, host: str) -> None:
    """Serve the checkpoint dashboard, its REST API (/jobs, /jobs/<id>/checkpoints,
    .../details/<epoch>, .../config) and Prometheus metrics (/metrics) for one or several
    jobs, until Ctrl-C. Works while the jobs run and after they stopped."""
    from exactly.monitoring.server import serve

    def ready(url: str) -> None:
        click.echo(f"exactly ui: dashboard on {url} ({len(checkpoints_)} job(s)); Ctrl-C "
                   "stops it")

    serve(list(checkpoints_), host=host, port=port, ready=ready)


def _follow_records(checkpoint: str, interval: float) -> None:
    """Print every history record of ``checkpoint`` as a JSON line, then new ones as they are
    appended, until Ctrl-C."""
    from exactly.checkpoint.history import open_history

    store = open_history(checkpoint)
    printed: list[str] = []
    while True:
        lines = [json.dumps(r, sort_keys=True) for r in store.read().records]
        # the records already printed are a prefix of what is kept, minus rotated-out ones
        start = 0
        if printed:
            last = printed[-1]
            start = len(lines) - lines[::-1].index(last) if last in lines else 0
        for line in lines[start:]:
            click.echo(line)
            printed.append(line)
        del printed[:-1]
        sys.stdout.flush()
        time.sleep(interval)


@main.command(context_settings={"show_default": True})
@click.argument("paths", nargs=-1, metavar="CHECKPOINT [TARGET]")
@click.option("--dispose", "dispose_path", default=None, type=PLACE,
              help="Delete the savepoint at this path (complete or incomplete).")
@click.option("--inspect", "inspect_path", default=None, type=PLACE,
              help="Print the manifest of the savepoint at this path.")
@click.option("--json", "as_json", is_flag=True, help="With --inspect: the manifest as JSON.")
@click.option("--timeout", "wait", default="15min", help="How long to wait for the answer.")
@reports_failure("savepoint")
def savepoint(paths: tuple[str, ...], dispose_path: str | None, inspect_path: str | None,
              as_json: bool, wait: str) -> None:
    """Take a savepoint of the job running on CHECKPOINT (it keeps running) into TARGET
    [default: the job's savepoint directory (`exactly run --savepoint-dir`,
    CheckpointConfig(savepoint_dir)), else <CHECKPOINT>.savepoints]; or --inspect /
    --dispose one."""
    from exactly.savepoints.manifest import dispose

    if sum(x is not None for x in (dispose_path, inspect_path)) + bool(paths) != 1:
        raise click.UsageError("give CHECKPOINT [TARGET], or --inspect PATH, or --dispose PATH")
    if dispose_path is not None:
        click.echo(f"savepoint: disposed {dispose(dispose_path)}")
        return
    if inspect_path is not None:
        _inspect_savepoint(inspect_path, as_json)
        return
    if len(paths) > 2:
        raise click.UsageError("give CHECKPOINT and at most one TARGET")
    params = {"target": PLACE.convert(paths[1], None, None)} if len(paths) == 2 else {}
    _control(CHECKPOINT.convert(paths[0], None, None), "savepoint", wait, **params)


def _inspect_savepoint(path: str, as_json: bool) -> None:
    from exactly.savepoints.manifest import read_manifest

    manifest = read_manifest(path)
    if as_json:
        click.echo(json.dumps(manifest.to_json(), indent=2, sort_keys=True))
        return
    console = report_console()
    total = sum(f["size"] for f in manifest.files)
    console.print(f"savepoint {path}: complete, {len(manifest.files)} files ({total} bytes) "
                  "verified against the manifest")
    console.print(f"epoch {manifest.epoch} of query {manifest.query_id}, taken "
                  f"{manifest.created_at} ({manifest.trigger}), Spark {manifest.spark_version}, "
                  f"state backend {manifest.state_backend}, {manifest.shuffle_partitions} "
                  f"state partitions, format version {manifest.format_version}")
    table = Table("uid", "operator", "kind", "partitions", "store", "rows", "bytes",
                  "key schema", "value schema")
    for op in manifest.operators:
        for store in op.stores:
            table.add_row(op.uid or "-", str(op.operator_id), op.name, str(op.partitions),
                          store.name, str(store.rows), str(store.bytes),
                          _schema_text(store.key_schema), _schema_text(store.value_schema))
    console.print(table)
    for sink in manifest.sinks:
        console.print(f"sink {sink.format} -> {sink.target}: last committed epoch "
                      f"{sink.committed_epoch}")


def _schema_text(schema_json: str) -> str:
    if not schema_json:
        return "-"
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(schema_json)).simpleString()


def _control(checkpoint: str, action: str, wait: str, **params) -> None:
    from exactly.checkpoint.control import ControlChannel
    from exactly.config import parse_duration

    channel = ControlChannel(checkpoint)
    request = channel.send(action, **params)
    answer = channel.wait_answer(request, parse_duration(wait, name="--timeout"))
    if answer is None and not channel.exists():
        click.echo(f"{action}: done; the checkpoint {checkpoint} was deleted")
        return
    if answer is None and action == "upgrade":
        raise TimeoutError(f"no answer within {wait}: the upgrade goes on in the job's "
                           f"`exactly run` (the new job must commit its first epochs; `exactly "
                           f"checkpoints {checkpoint}` shows where it is)")
    if answer is None:
        raise TimeoutError(f"no answer from the job on {checkpoint} within {wait}; the "
                           f"request stays queued (it is handled when the driver polls)")
    click.echo(f"{action}: {answer.get('status')}: {answer.get('detail')}")
    if answer.get("status") != "done":
        sys.exit(FAILED)


if __name__ == "__main__":
    main()

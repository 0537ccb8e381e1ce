"""The ``exactly`` command line: demo, pipeline, verify, faults."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from exactly.faults import FaultPoint

ERR = Console(stderr=True)


@click.group()
@click.version_option(package_name="exactly")
def main() -> None:
    """Flink's end-to-end exactly-once model for PySpark Structured Streaming."""
    from exactly.logs import configure

    configure()


@main.command()
@click.option("--events", default=20_000, show_default=True, type=click.IntRange(1),
              help="Events to generate (each with a unique id).")
@click.option("--crashes", default=3, show_default=True, type=click.IntRange(0),
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
def demo(events: int, crashes: int, seed: int, workdir: Path, output_format: str,
         sink: str) -> None:
    """Generate events, run an exactly-once pipeline under crashes, audit the output.

    Exit code 0 when every event is in the output exactly once, 1 otherwise.
    """
    from importlib import import_module

    from exactly.demo import print_result, run_demo

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
              help="Output directory of the 2PC file sink.")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(file_okay=False),
              help="Checkpoint directory (Spark's offset and commit logs).")
@click.option("--mode", default="exactly_once", show_default=True,
              type=click.Choice(["exactly_once", "at_least_once"]))
@click.option("--format", "output_format", default="parquet", show_default=True,
              type=click.Choice(["parquet", "json"]))
@click.option("--max-files-per-epoch", default=2, show_default=True, type=click.IntRange(1))
@click.option("--dead-letter", "dead_letter_dir", default=None,
              type=click.Path(file_okay=False), help="Route malformed rows here and go on.")
def pipeline(input_dir: str, output_dir: str, checkpoint_dir: str, mode: str,
             output_format: str, max_files_per_epoch: int, dead_letter_dir: str | None) -> None:
    """Drain an input directory through the demo pipeline into the file sink, then stop.

    Fault injection: set EXACTLY_FAULT=POINT[@EPOCH] (see `exactly faults`).
    """
    from exactly.pipeline import PipelineSpec, run
    from exactly.session import spark_session

    spec = PipelineSpec(input_dir, output_dir, checkpoint_dir, mode, output_format,
                        max_files_per_epoch, dead_letter_dir)
    spark = spark_session(app_name="exactly-pipeline")
    try:
        run(spark, spec)
    except Exception as exc:  # the query's error, already logged by Spark
        ERR.print(f"[red]pipeline failed:[/] {_root_cause(exc)}")
        sys.exit(3)
    finally:
        spark.stop()


@main.command()
@click.option("--input", "input_path", required=True, type=click.Path(exists=True),
              help="Source files (JSON lines or Parquet) or a directory of them.")
@click.option("--output", "output_path", required=True, type=click.Path(exists=True),
              help="Sink output directory.")
@click.option("--id-column", default="id", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(input_path: str, output_path: str, id_column: str, as_json: bool) -> None:
    """Audit: every input id exactly once in the output. Exit 1 on any mismatch."""
    from exactly.audit import verify as run_verify

    report = run_verify(input_path, output_path, id_column)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        table = Table(title=f"audit: {input_path} -> {output_path}")
        table.add_column("check")
        table.add_column("result")
        for name, value in report.rows():
            table.add_row(name, value)
        Console().print(table)
    sys.exit(0 if report.ok else 1)


@main.command()
def faults() -> None:
    """List the protocol points where a crash can be injected."""
    for point in FaultPoint:
        where = "driver" if point.on_driver else "executor"
        click.echo(f"{point.value:16} {where}")


def _root_cause(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "exactly.errors." in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    main()

"""Benchmark of the ``exactly.files`` two-phase-commit sink against Spark's own sinks.

What is measured
----------------
One input of ``--files`` Parquet files (``--rows`` rows from
``exactly.connectors.datagen.generate``) is written once to ``WORKDIR/input``. Four streaming
queries then read that same input with Spark's built-in file source
(``maxFilesPerTrigger=--max-files-per-epoch``, ``trigger(availableNow=True)``), so every sink
sees identical epochs, in one SparkSession (``local[2]``) with a fresh checkpoint and output
directory per run:

``exactly_once``   ``exactly.files`` sink, mode ``exactly_once`` (staged files, driver-side
                   commit, whole epochs published by one directory rename)
``at_least_once``  ``exactly.files`` sink, mode ``at_least_once`` (files renamed into place
                   by the tasks themselves)
``spark_parquet``  Spark's built-in Parquet file sink (``_spark_metadata`` log)
``noop``           Spark's ``noop`` sink: the cost of reading and of running epochs with no
                   sink work, to put per-epoch overheads in context

Reported per sink: wall-clock seconds from ``start()`` to termination and records/s (the
median over ``--repeat`` repetitions, whose order alternates), and the median / p99 of
Spark's ``addBatch`` duration per epoch (``recentProgress[i]["durationMs"]["addBatch"]``).
For ``exactly_once``: the driver-side commit protocol time per epoch (``commit_ms`` of
``OUT/_exactly/complete/*.json``). For both ``exactly.files`` modes: visibility latency, the
time from a data file's last write (its mtime, which renames keep) until a thread polling
``OUT/epoch-*/`` every 10 ms first sees it. In ``at_least_once`` mode a file appears as soon
as its task finishes; in ``exactly_once`` mode only once the whole epoch is committed. The
mtime comes from the kernel's coarse clock, so latencies carry a few ms of bias upwards.

Every output is read back (``pyarrow.dataset``, which skips ``_``-prefixed entries such as
``_exactly``, ``_staging`` and ``_spark_metadata``): its row count and its number of
distinct ``id`` values must equal the input rows, else the script exits with status 1.
Before the measured runs, each sink runs once on a tiny input so that JVM warm-up and
Python worker start-up do not count against whichever sink runs first (``--no-warmup``).

Run from the repository root::

    .venv/bin/python bench/file_sink.py [--rows 2000000] [--files 40]
        [--max-files-per-epoch 4] [--workdir DIR] [--repeat 1]

The table goes to stdout; the same numbers go to ``WORKDIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from exactly.config import CheckpointConfig
from exactly.connectors.datagen import SCHEMA, generate
from exactly.spark.runner import start_query
from exactly.spark.session import spark_session

SINKS = ("exactly_once", "at_least_once", "spark_parquet", "noop")
LABELS = {
    "exactly_once": "exactly.files exactly_once",
    "at_least_once": "exactly.files at_least_once",
    "spark_parquet": "Spark parquet sink",
    "noop": "Spark noop sink (baseline)",
}
#: sinks whose output directory is polled for visibility latency
POLLED = ("exactly_once", "at_least_once")
POLL_INTERVAL_S = 0.010
WARMUP_ROWS = 20_000
WARMUP_FILES = 2


@dataclass
class RunResult:
    """One measured run of one sink."""

    sink: str
    repetition: int
    rows: int
    seconds: float
    epochs: int
    input_rows_reported: int
    add_batch_ms: list[float]
    commit_ms: list[float] = field(default_factory=list)
    visibility_ms: list[float] = field(default_factory=list)
    output_rows: int | None = None
    output_distinct_ids: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


class VisibilityPoller(threading.Thread):
    """Records when each ``epoch-*/*.parquet`` file under ``root`` first becomes visible."""

    def __init__(self, root: Path, interval: float = POLL_INTERVAL_S) -> None:
        super().__init__(name=f"visibility-poller-{root.name}", daemon=True)
        self.root = root
        self.interval = interval
        self.seen: dict[str, tuple[float, float]] = {}  # path -> (first seen, mtime)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._scan()
            self._stop_event.wait(self.interval)
        self._scan()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def _scan(self) -> None:
        try:
            epochs = [e.path for e in os.scandir(self.root)
                      if e.name.startswith("epoch-") and e.is_dir()]
        except FileNotFoundError:
            return
        for epoch_dir in epochs:
            try:
                files = [f for f in os.scandir(epoch_dir)
                         if f.name.endswith(".parquet") and f.path not in self.seen]
            except FileNotFoundError:
                continue
            # Taken after the listing: a file in it was visible at or before this instant.
            now = time.time()
            for entry in files:
                try:
                    self.seen[entry.path] = (now, entry.stat().st_mtime)
                except FileNotFoundError:
                    continue

    def latencies_ms(self) -> list[float]:
        return [(seen - mtime) * 1000.0 for seen, mtime in self.seen.values()]


# -- input ---------------------------------------------------------------------------------
def write_input(directory: Path, rows: int, files: int) -> None:
    """Write ``rows`` generated rows as ``files`` Parquet files that sort in row order.

    Reuses an existing input written with the same parameters.
    """
    marker = directory.parent / f"{directory.name}.json"
    params = {"rows": rows, "files": files, "keys": 100, "seed": 0}
    if directory.is_dir() and marker.exists() and json.loads(marker.read_text()) == params:
        return
    shutil.rmtree(directory, ignore_errors=True)
    marker.unlink(missing_ok=True)
    directory.mkdir(parents=True)
    for i in range(files):
        start, end = rows * i // files, rows * (i + 1) // files
        pq.write_table(generate(start, end, keys=100, seed=0),
                       directory / f"part-{i:05d}.parquet")
    marker.write_text(json.dumps(params))


def read_stream(spark: SparkSession, input_dir: Path, max_files: int) -> DataFrame:
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", max_files)
            .parquet(str(input_dir)))


# -- runs ----------------------------------------------------------------------------------
def start_sink(sink: str, df: DataFrame, out: Path, ck: Path, retain_epochs: int
               ) -> StreamingQuery:
    """Start ``df`` into ``sink`` with an availableNow trigger."""
    if sink in ("exactly_once", "at_least_once"):
        return start_query(df, sink_format="exactly.files", path=str(out),
                           checkpoint=CheckpointConfig(storage=str(ck), mode=sink),
                           options={"exactly.retainEpochs": str(retain_epochs)},
                           available_now=True).query
    writer = df.writeStream.option("checkpointLocation", str(ck)).trigger(availableNow=True)
    if sink == "spark_parquet":
        return writer.format("parquet").option("path", str(out)).start()
    if sink == "noop":
        return writer.format("noop").start()
    raise ValueError(f"unknown sink {sink!r}")


def run_sink(spark: SparkSession, sink: str, input_dir: Path, rows: int, max_files: int,
             run_dir: Path, repetition: int, retain_epochs: int) -> RunResult:
    """Run ``sink`` once over the whole input; measure, then verify its output."""
    shutil.rmtree(run_dir, ignore_errors=True)
    out, ck = run_dir / "out", run_dir / "checkpoint"
    run_dir.mkdir(parents=True)
    df = read_stream(spark, input_dir, max_files)
    poller = VisibilityPoller(out) if sink in POLLED else None
    if poller is not None:
        poller.start()
    errors: list[str] = []
    started = time.perf_counter()
    query = start_sink(sink, df, out, ck, retain_epochs)
    try:
        query.awaitTermination()
    except Exception as exc:  # the run failed: report it, keep benchmarking the others
        errors.append(f"query failed: {exc}")
    seconds = time.perf_counter() - started
    if poller is not None:
        poller.stop()

    progress = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
    result = RunResult(
        sink=sink, repetition=repetition, rows=rows, seconds=seconds, epochs=len(progress),
        input_rows_reported=sum(int(p["numInputRows"]) for p in progress),
        add_batch_ms=[float(p["durationMs"]["addBatch"]) for p in progress
                      if "addBatch" in p["durationMs"]],
        visibility_ms=poller.latencies_ms() if poller is not None else [],
        errors=errors,
    )
    if sink == "exactly_once":
        result.commit_ms = read_commit_ms(out)
    verify(result, out)
    return result


def read_commit_ms(out: Path) -> list[float]:
    """``commit_ms`` of every completed epoch in the sink's commit log, in epoch order."""
    values = []
    for path in sorted((out / "_exactly" / "complete").glob("*.json")):
        data = json.loads(path.read_text())
        if "commit_ms" in data:
            values.append(float(data["commit_ms"]))
    return values


def verify(result: RunResult, out: Path) -> None:
    """Check that Spark read every row, and that the output holds each row exactly once."""
    if result.input_rows_reported != result.rows:
        result.errors.append(f"Spark reported {result.input_rows_reported} input rows in "
                             f"progress, expected {result.rows}")
    if result.sink == "noop":
        return
    if not out.is_dir():
        result.errors.append(f"no output directory {out}")
        return
    ids = ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"]
    result.output_rows = len(ids)
    result.output_distinct_ids = int(pc.count_distinct(ids).as_py())
    if result.output_rows != result.rows:
        result.errors.append(f"output holds {result.output_rows} rows, expected {result.rows}")
    if result.output_distinct_ids != result.rows:
        result.errors.append(f"output holds {result.output_distinct_ids} distinct ids, "
                             f"expected {result.rows}")
    if result.sink == "exactly_once":
        if len(result.commit_ms) != result.epochs:
            result.errors.append(f"{len(result.commit_ms)} epochs with commit_ms in "
                                 f"_exactly/complete, but Spark ran {result.epochs} epochs")
        staging = out / "_staging"
        if staging.is_dir() and any(staging.iterdir()):
            result.errors.append(f"{staging} is not empty after a clean run")


def warm_up(spark: SparkSession, workdir: Path) -> None:
    """Run every sink once over a tiny input (JIT, Python workers, class loading)."""
    input_dir = workdir / "warmup-input"
    write_input(input_dir, WARMUP_ROWS, WARMUP_FILES)
    for sink in SINKS:
        result = run_sink(spark, sink, input_dir, WARMUP_ROWS, 1, workdir / "warmup" / sink,
                          0, retain_epochs=100)
        if result.errors:
            raise SystemExit(f"warm-up of {sink} failed: {'; '.join(result.errors)}")
    shutil.rmtree(workdir / "warmup", ignore_errors=True)


# -- statistics and report -----------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def median(values: Sequence[float]) -> float:
    return pct(values, 50)


def pooled(results: Sequence[RunResult], sink: str,
           attribute: Callable[[RunResult], list[float]]) -> list[float]:
    return [v for r in results if r.sink == sink for v in attribute(r)]


def summarize(results: Sequence[RunResult], rows: int) -> dict[str, Any]:
    """Per-sink medians across repetitions, ratios, commit and visibility statistics."""
    per_sink: dict[str, dict[str, Any]] = {}
    for sink in SINKS:
        seconds = [r.seconds for r in results if r.sink == sink]
        add_batch = pooled(results, sink, lambda r: r.add_batch_ms)
        sec = median(seconds)
        per_sink[sink] = {
            "rows": rows, "seconds": sec, "records_per_s": rows / sec,
            "repetitions": len(seconds),
            "add_batch_ms_median": median(add_batch), "add_batch_ms_p99": pct(add_batch, 99),
            "epochs": median([r.epochs for r in results if r.sink == sink]),
        }
    parquet_rps = per_sink["spark_parquet"]["records_per_s"]
    for stats in per_sink.values():
        stats["ratio_vs_spark_parquet"] = stats["records_per_s"] / parquet_rps
    commit = pooled(results, "exactly_once", lambda r: r.commit_ms)
    visibility = {
        sink: {"p50_ms": median(v), "p99_ms": pct(v, 99), "files": len(v)}
        for sink in POLLED
        for v in [pooled(results, sink, lambda r: r.visibility_ms)]
    }
    eo, alo = per_sink["exactly_once"], per_sink["at_least_once"]
    return {
        "sinks": per_sink,
        "ratios": {
            "exactly_once_over_at_least_once": eo["records_per_s"] / alo["records_per_s"],
            "exactly_once_over_spark_parquet": eo["records_per_s"] / parquet_rps,
            "exactly_once_add_batch_median_over_noop": (
                eo["add_batch_ms_median"] / per_sink["noop"]["add_batch_ms_median"]),
        },
        "commit_overhead_ms": {"median": median(commit), "p99": pct(commit, 99),
                               "epochs": len(commit)},
        "visibility_latency_ms": visibility,
    }


def report(summary: dict[str, Any], args: argparse.Namespace) -> str:
    sinks, ratios = summary["sinks"], summary["ratios"]
    epochs = math.ceil(args.files / args.max_files_per_epoch)
    lines = [
        f"exactly file sink benchmark: {args.rows:,} rows in {args.files} files, "
        f"{args.max_files_per_epoch} files/epoch ({epochs} epochs), local[2], "
        f"median of {args.repeat} repetition(s)",
        "",
        f"{'sink':<30} {'rows':>11} {'seconds':>9} {'records/s':>12} {'vs Spark parquet':>17}",
        "-" * 83,
    ]
    for sink in SINKS:
        s = sinks[sink]
        lines.append(f"{LABELS[sink]:<30} {s['rows']:>11,} {s['seconds']:>9.2f} "
                     f"{s['records_per_s']:>12,.0f} {s['ratio_vs_spark_parquet']:>16.2f}x")
    commit, vis = summary["commit_overhead_ms"], summary["visibility_latency_ms"]
    lines += [
        "",
        f"exactly_once / at_least_once throughput:  "
        f"{ratios['exactly_once_over_at_least_once']:.2f}x",
        f"exactly_once / spark parquet throughput:  "
        f"{ratios['exactly_once_over_spark_parquet']:.2f}x",
        f"commit overhead per epoch (exactly_once, driver-side protocol): "
        f"median {commit['median']:.1f} ms, p99 {commit['p99']:.1f} ms "
        f"({commit['epochs']} epochs)",
        "addBatch per epoch, median / p99 ms:",
    ]
    for sink in SINKS:
        s = sinks[sink]
        lines.append(f"  {LABELS[sink]:<30} {s['add_batch_ms_median']:>8.0f} / "
                     f"{s['add_batch_ms_p99']:>6.0f}")
    lines += [
        f"addBatch median exactly_once / noop: "
        f"{ratios['exactly_once_add_batch_median_over_noop']:.2f}x",
        "visibility latency (file written -> visible in epoch-*/), p50 / p99 ms:",
    ]
    for sink in POLLED:
        v = vis[sink]
        lines.append(f"  {LABELS[sink]:<30} {v['p50_ms']:>8.1f} / {v['p99_ms']:>6.1f}  "
                     f"({v['files']} files)")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="input rows")
    parser.add_argument("--files", type=int, default=40, help="input Parquet files")
    parser.add_argument("--max-files-per-epoch", type=int, default=4,
                        help="maxFilesPerTrigger of the file source (epoch size)")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "exactly-bench-file-sink",
                        help="input, run directories and results.json")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions of each sink")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unmeasured warm-up run of each sink")
    args = parser.parse_args(argv)
    for name in ("rows", "files", "max_files_per_epoch", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.files > args.rows:
        parser.error("--files cannot exceed --rows")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir: Path = args.workdir.absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    input_dir = workdir / "input"
    print(f"writing input to {input_dir} ...", file=sys.stderr)
    write_input(input_dir, args.rows, args.files)
    expected_epochs = math.ceil(args.files / args.max_files_per_epoch)
    retain_epochs = max(100, expected_epochs + 10)  # keep every commit_ms record

    spark = spark_session(conf={
        "spark.sql.streaming.numRecentProgressUpdates": str(max(100, expected_epochs + 10)),
        "spark.ui.showConsoleProgress": "false",
    })
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    if args.warmup:
        print("warming up ...", file=sys.stderr)
        warm_up(spark, workdir)

    results: list[RunResult] = []
    for rep in range(args.repeat):
        order = SINKS if rep % 2 == 0 else tuple(reversed(SINKS))
        for sink in order:
            print(f"repetition {rep + 1}/{args.repeat}: {sink} ...", file=sys.stderr)
            result = run_sink(spark, sink, input_dir, args.rows, args.max_files_per_epoch,
                              workdir / "runs" / f"{sink}-{rep}", rep, retain_epochs)
            for error in result.errors:
                print(f"ERROR {sink} repetition {rep}: {error}", file=sys.stderr)
            results.append(result)
    spark.stop()

    summary = summarize(results, args.rows)
    errors = [f"{r.sink} repetition {r.repetition}: {e}" for r in results for e in r.errors]
    print(report(summary, args))
    results_path = workdir / "results.json"
    results_path.write_text(json.dumps({
        "params": {"rows": args.rows, "files": args.files,
                   "max_files_per_epoch": args.max_files_per_epoch, "repeat": args.repeat,
                   "warmup": args.warmup, "master": "local[2]"},
        **summary,
        "runs": [{**asdict(r), "records_per_s": r.records_per_s} for r in results],
        "errors": errors,
    }, indent=1))
    print(f"\nresults: {results_path}")
    if errors:
        print(f"\nFAILED: {len(errors)} verification error(s):", file=sys.stderr)
        for error in errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

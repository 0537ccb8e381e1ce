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

Reported per sink: rows/s per repetition (wall-clock seconds from ``start()`` to
termination), and ratios per repetition pair (median and range): exactly_once / Spark's
Parquet sink, exactly_once / at_least_once, and the median ``addBatch`` of exactly_once /
noop. For ``exactly_once``: the driver-side commit protocol time per epoch (``commit_ms`` of
``OUT/_exactly/complete/*.json``), p50 and p99 over every epoch of every repetition and p99
per run (a p99 needs >= 100 epochs: the default is 100 epochs a run). For both
``exactly.files`` modes: visibility latency, the time from a data file's last write (its
mtime, which renames keep) until a thread polling ``OUT/epoch-*/`` every 10 ms first sees
it. In ``at_least_once`` mode a file appears as soon as its task finishes; in
``exactly_once`` mode only once the whole epoch is committed. The mtime comes from the
kernel's coarse clock, so latencies carry a few ms of bias upwards.

Every output is read back (``pyarrow.dataset``, which skips ``_``-prefixed entries such as
``_exactly``, ``_staging`` and ``_spark_metadata``) and checked by id: each input id exactly
once, else the script exits with status 1. Before the measured runs, each sink runs once on
``--warmup-rows`` rows so that JVM warm-up and Python worker start-up do not count against
whichever sink runs first (``--no-warmup``). The rules are :mod:`harness`'s.

Run from the repository root::

    .venv/bin/python bench/file_sink.py [--rows 2000000] [--files 100]
        [--max-files-per-epoch 1] [--workdir DIR] [--repeat 3] [--warmup-rows 100000]

The table goes to stdout; the same numbers go to ``WORKDIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly.config import CheckpointConfig
from exactly.connectors.datagen import SCHEMA, generate
from exactly.ops.query import start_query
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
WARMUP_FILES = 10


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
    problem = h.check_ids(ids.to_numpy(), result.rows, f"{result.sink} output")
    if problem:
        result.errors.append(problem)
    if result.sink == "exactly_once":
        if len(result.commit_ms) != result.epochs:
            result.errors.append(f"{len(result.commit_ms)} epochs with commit_ms in "
                                 f"_exactly/complete, but Spark ran {result.epochs} epochs")
        staging = out / "_staging"
        if staging.is_dir() and any(staging.iterdir()):
            result.errors.append(f"{staging} is not empty after a clean run")


def warm_up(spark: SparkSession, workdir: Path, rows: int) -> None:
    """Run every sink once over ``rows`` rows (JIT, Python workers, class loading)."""
    input_dir = workdir / "warmup-input"
    write_input(input_dir, rows, WARMUP_FILES)
    for sink in SINKS:
        result = run_sink(spark, sink, input_dir, rows, 1, workdir / "warmup" / sink,
                          0, retain_epochs=100)
        if result.errors:
            raise SystemExit(f"warm-up of {sink} failed: {'; '.join(result.errors)}")
    shutil.rmtree(workdir / "warmup", ignore_errors=True)


# -- statistics and report -----------------------------------------------------------------
def as_runs(results: Sequence[RunResult]) -> list[h.Run]:
    return [h.Run(r.repetition, r.sink, {"seconds": r.seconds,
                                         "add_batch_p50": h.p50(r.add_batch_ms) or 0.0},
                  r.errors) for r in results]


def pooled(results: Sequence[RunResult], sink: str,
           attribute: Callable[[RunResult], list[float]]) -> list[float]:
    return [v for r in results if r.sink == sink for v in attribute(r)]


def summarize(results: Sequence[RunResult], rows: int) -> dict[str, Any]:
    """Per-pair ratios (median and range), commit and visibility statistics."""
    runs = as_runs(results)
    speed = {sink: [rows / s for s in h.per_rep(runs, "seconds", sink)] for sink in SINKS}

    def ratio(a: str, b: str) -> list[float]:
        return h.paired(runs, "seconds", b, a)  # a's speed / b's speed = b's time / a's time

    commit_per_run = [(r.repetition, h.p99(r.commit_ms)) for r in results
                      if r.sink == "exactly_once"]
    commit = pooled(results, "exactly_once", lambda r: r.commit_ms)
    return {
        "speed_k_rows_per_s": {k: [v / 1000 for v in vals] for k, vals in speed.items()},
        "ratios": {
            "exactly_once / spark_parquet": ratio("exactly_once", "spark_parquet"),
            "exactly_once / at_least_once": ratio("exactly_once", "at_least_once"),
            "at_least_once / spark_parquet": ratio("at_least_once", "spark_parquet"),
            "addBatch p50 exactly_once / noop": h.paired(runs, "add_batch_p50",
                                                         "exactly_once", "noop"),
        },
        "commit_ms": {"p50": h.p50(commit), "p99": h.p99(commit), "epochs": len(commit),
                      "p99_per_run": commit_per_run},
        "visibility_ms": {sink: {"p50": h.p50(v), "p99": h.p99(v), "files": len(v)}
                          for sink in POLLED
                          for v in [pooled(results, sink, lambda r: r.visibility_ms)]},
    }


def report(summary: dict[str, Any], args: argparse.Namespace) -> str:
    epochs = math.ceil(args.files / args.max_files_per_epoch)
    lines = [h.machine(),
             f"exactly file sink benchmark: {args.rows:,} rows in {args.files} files, "
             f"{args.max_files_per_epoch} files/epoch ({epochs} epochs), local[2], "
             f"{args.repeat} repetitions in alternating order. "
             + h.sizes_note(args.rows, args.warmup_rows if args.warmup else 0, args.repeat),
             "",
             h.table(["sink", "k rows/s per repetition: median (range)"],
                     [[LABELS[s], h.spread(summary["speed_k_rows_per_s"][s], ".0f")]
                      for s in SINKS]),
             "",
             h.table(["ratio per repetition pair", "median (range)"],
                     [[k, h.spread(v)] for k, v in summary["ratios"].items()])]
    commit, vis = summary["commit_ms"], summary["visibility_ms"]
    per_run = ", ".join(h.fmt_ms(v) for _, v in commit["p99_per_run"])
    lines += [
        "",
        f"driver-side commit per epoch (exactly_once): p50 {h.fmt_ms(commit['p50'])} ms, "
        f"p99 {h.fmt_ms(commit['p99'])} ms over {commit['epochs']} epochs "
        f"(p99 per run: {per_run})",
        "visibility latency (file written -> visible in epoch-*/), p50 / p99 ms:",
    ]
    for sink in POLLED:
        v = vis[sink]
        lines.append(f"  {LABELS[sink]:<30} {h.fmt_ms(v['p50'])} / {h.fmt_ms(v['p99'])}  "
                     f"({v['files']} files)")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="input rows")
    parser.add_argument("--files", type=int, default=100, help="input Parquet files")
    parser.add_argument("--max-files-per-epoch", type=int, default=1,
                        help="maxFilesPerTrigger of the file source (epoch size)")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "exactly-bench-file-sink",
                        help="input, run directories and results.json")
    parser.add_argument("--repeat", type=int, default=h.MIN_REPEAT,
                        help="repetitions of each sink")
    parser.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS,
                        help="rows of each sink's warm-up run")
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
        warm_up(spark, workdir, args.warmup_rows)

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
    ratio = summary["ratios"]["exactly_once / spark_parquet"]
    p99 = summary["commit_ms"]["p99"]
    h.write_headlines(workdir, [
        h.Headline("file_sink", "exactly_once / Spark parquet sink, rows/s", h.spread(ratio),
                   ">= 0.9", statistics.median(ratio) >= 0.9 if ratio else None),
        h.Headline("file_sink", "driver-side commit p99 ms (all epochs)", h.fmt_ms(p99),
                   "<= 50", None if p99 is None else p99 <= 50),
    ])
    print(f"\nresults: {results_path}")
    if errors:
        print(f"\nFAILED: {len(errors)} verification error(s):", file=sys.stderr)
        for error in errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

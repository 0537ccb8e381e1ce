"""Benchmark of epoch sizing: epoch durations of a backlog with and without a target.

What is measured
----------------
A backlog of ``--rows`` rows (``exactly.datagen``, ``rowsPerSecond=0``: all of it available at
once, ``--partitions`` read tasks per epoch) flows through a Python transform that processes
``--rate`` rows/s (``mapInArrow``; each task sleeps ``len(batch) / (rate / partitions)`` s, so
the tasks of an epoch together take ``rows / rate`` s, as an expensive UDF would) into the
``exactly.files`` sink (exactly_once, Parquet, column ``id`` only), with a processingTime
trigger of ``--trigger-ms``:

``unsized``  no admission file: the first epoch takes the whole backlog
``sized``    a :class:`~exactly.ops.pacing.Pacer` with ``target_s=--target``: the driver
             polls ``query.recentProgress`` every 200 ms and feeds each new epoch to it; the
             sources admit at most the sizer's budget per epoch

Each variant runs in a subprocess of its own (the admission file's environment variable must
be set before Spark starts), ``local[2]``, after an unmeasured warm-up query through the same
pipeline in that process (JVM, Python workers; ``--no-warmup`` skips it). With ``--repeat``
the variants alternate their order. Reported per variant: epochs with data, p50 / p90 / max
epoch duration (progress ``durationMs.triggerExecution``), total seconds from ``start()`` to
the end of the last epoch, and the output read back (``pyarrow.dataset``): its row count and
distinct ids must equal ``--rows``, else exit status 1. For ``sized``: the budgets the pacer
wrote, and whether the sizer found the target unreachable. The machine's load average is
printed with each run (the machine may be shared: compare variants of one run).

Run from the repository root::

    .venv/bin/python bench/epoch_sizing.py [--rows 2000000] [--target 2] [--rate 50000]
        [--trigger-ms 500] [--repeat 1] [--workdir DIR]

The table goes to stdout; the numbers to ``WORKDIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exactly.connectors.admission import ADMISSION_FILE_ENV
from exactly.options import RETAIN_EPOCHS

VARIANTS = ("unsized", "sized")
POLL_S = 0.2
WARMUP_ROWS = 20_000
TIMEOUT_S = 1800.0


# -- one variant, in its own process ---------------------------------------------------------
def slow_transform(per_task_rate: float):
    """A mapInArrow function that costs ``1 / per_task_rate`` s per row, keeping ``id``."""
    def transform(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            time.sleep(batch.num_rows / per_task_rate)
            yield batch.select(["id"])
    return transform


def start(spark, rows: int, args: argparse.Namespace, out: Path, ck: Path):
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
          .option("totalRows", rows).option("numPartitions", args.partitions).load())
    transformed = df.mapInArrow(slow_transform(args.rate / args.partitions), "id long")
    return (transformed.writeStream.format("exactly.files").option("path", str(out))
            .option("checkpointLocation", str(ck)).option(RETAIN_EPOCHS, 10_000)
            .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())


def drain(query, rows: int, pacer=None, budgets: list[int | None] | None = None
          ) -> list[dict[str, Any]]:
    """Wait until the query has read ``rows`` rows; feed new epochs to ``pacer`` and note
    each budget it writes in ``budgets``."""
    deadline = time.monotonic() + TIMEOUT_S
    seen: dict[int, dict[str, Any]] = {}
    while True:
        for entry in query.recentProgress:
            progress = json.loads(entry.json)
            if int(progress["numInputRows"]) > 0:
                seen.setdefault(int(progress["batchId"]), progress)
            if pacer is not None and pacer.observe_progress(progress) and budgets is not None:
                budgets.append(pacer.admission.max_rows)
        if sum(int(p["numInputRows"]) for p in seen.values()) >= rows:
            return [seen[b] for b in sorted(seen)]
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


def epoch_seconds(progress: dict[str, Any]) -> float:
    return float(progress["durationMs"]["triggerExecution"]) / 1000


def progress_end(progress: dict[str, Any]) -> float:
    from datetime import datetime

    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + epoch_seconds(progress)


def read_back(out: Path) -> tuple[int, int]:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    ids = ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"]
    return len(ids), int(pc.count_distinct(ids).as_py())


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    from exactly.connectors.admission import admission_path
    from exactly.ops.pacing import Pacer
    from exactly.spark.session import spark_session

    run_dir = Path(args.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spark = spark_session(app_name=f"exactly-bench-epoch-sizing-{args.variant}", conf={
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
        "spark.ui.showConsoleProgress": "false",
    })
    try:
        if args.warmup:  # before the admission file exists: admission is open
            warm = start(spark, WARMUP_ROWS, args, run_dir / "warm-out", run_dir / "warm-ck")
            drain(warm, WARMUP_ROWS)
            warm.stop()
        out, ck = run_dir / "out", run_dir / "checkpoint"
        pacer = None
        if args.variant == "sized":
            path = admission_path()
            if path is None:
                raise SystemExit(f"the sized variant needs {ADMISSION_FILE_ENV}")
            pacer = Pacer(path, str(ck), target_s=args.target)
            pacer.open()
        load_before = os.getloadavg()
        started = time.time()
        query = start(spark, args.rows, args, out, ck)
        budgets = [pacer.admission.max_rows] if pacer is not None else []
        try:
            epochs = drain(query, args.rows, pacer, budgets)
        finally:
            query.stop()
            if pacer is not None:
                pacer.remove()
        total_s = progress_end(epochs[-1]) - started
        output_rows, distinct = read_back(out)
    finally:
        spark.stop()
    return {
        "variant": args.variant, "rows": args.rows, "target_s": args.target,
        "epoch_rows": [int(p["numInputRows"]) for p in epochs],
        "epoch_s": [epoch_seconds(p) for p in epochs],
        "total_s": total_s, "output_rows": output_rows, "distinct_ids": distinct,
        "budgets": budgets,
        "unreachable": bool(pacer and pacer.sizer and pacer.sizer.unreachable),
        "load_before": load_before, "load_after": os.getloadavg(),
    }


# -- the parent: variants in subprocesses, report ---------------------------------------------
def spawn(variant: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    result = run_dir.with_suffix(".json")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop(ADMISSION_FILE_ENV, None)
    if variant == "sized":
        env[ADMISSION_FILE_ENV] = str(run_dir.with_suffix(".admission.json"))
    command = [sys.executable, __file__, "--variant", variant, "--run-dir", str(run_dir),
               "--result", str(result), "--rows", str(args.rows), "--target", str(args.target),
               "--rate", str(args.rate), "--partitions", str(args.partitions),
               "--trigger-ms", str(args.trigger_ms)]
    if not args.warmup:
        command.append("--no-warmup")
    done = subprocess.run(command, env=env, timeout=TIMEOUT_S + 300)
    if done.returncode != 0:
        raise SystemExit(f"{variant} run failed with exit status {done.returncode}")
    return json.loads(result.read_text())


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: epoch durations pooled over repetitions, medians of the totals."""
    summary = {}
    for variant in VARIANTS:
        runs = [r for r in results if r["variant"] == variant]
        durations = [d for r in runs for d in r["epoch_s"]]
        summary[variant] = {
            "repetitions": len(runs),
            "epochs": float(np.median([len(r["epoch_s"]) for r in runs])),
            "epoch_s_p50": pct(durations, 50), "epoch_s_p90": pct(durations, 90),
            "epoch_s_max": max(durations),
            "total_s": float(np.median([r["total_s"] for r in runs])),
            "rows_ok": all(r["output_rows"] == r["rows"] == r["distinct_ids"] for r in runs),
        }
    return summary


def report(summary: dict[str, dict[str, Any]], results: Sequence[dict[str, Any]],
           args: argparse.Namespace) -> str:
    lines = [
        f"epoch sizing: {args.rows:,} rows backlog, transform {args.rate:,} rows/s, "
        f"trigger {args.trigger_ms} ms, target {args.target:g} s, local[2], "
        f"{os.cpu_count()} cores, {args.repeat} repetition(s)",
        "",
        f"{'variant':<9} {'epochs':>7} {'p50 s':>7} {'p90 s':>7} {'max s':>7} {'total s':>8} "
        f"{'rows checked':>13}",
        "-" * 63,
    ]
    for variant in VARIANTS:
        s = summary[variant]
        lines.append(f"{variant:<9} {s['epochs']:>7.0f} {s['epoch_s_p50']:>7.2f} "
                     f"{s['epoch_s_p90']:>7.2f} {s['epoch_s_max']:>7.2f} {s['total_s']:>8.1f} "
                     f"{'ok' if s['rows_ok'] else 'MISMATCH':>13}")
    lines.append("")
    for r in results:
        load = "/".join(f"{v:.1f}" for v in r["load_before"])
        lines.append(f"{r['variant']}: load average {load} at start; epoch rows "
                     f"{r['epoch_rows'][:12]}{' ...' if len(r['epoch_rows']) > 12 else ''}")
        if r["variant"] == "sized":
            lines.append(f"  budgets written {r['budgets'][:12]}"
                         f"{' ...' if len(r['budgets']) > 12 else ''}; "
                         f"epochs over target {sum(d > r['target_s'] for d in r['epoch_s'])}"
                         f"/{len(r['epoch_s'])}; unreachable: {r['unreachable']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="backlog rows")
    parser.add_argument("--target", type=float, default=2.0, help="sized: target epoch seconds")
    parser.add_argument("--rate", type=float, default=50_000,
                        help="rows/s the transform processes (all tasks together)")
    parser.add_argument("--partitions", type=int, default=2, help="read tasks per epoch")
    parser.add_argument("--trigger-ms", type=int, default=500, help="processingTime trigger")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions of each variant")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "exactly-bench-epoch-sizing")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unmeasured warm-up query in each variant's process")
    # internal: run one variant in this process
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rows", "partitions", "trigger_ms", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.target > 0 or not args.rate > 0:
        parser.error("--target and --rate must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.variant:
        Path(args.result).write_text(json.dumps(run_variant(args)))
        return 0
    workdir: Path = args.workdir.absolute()
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    (workdir / "runs").mkdir(parents=True)
    results = []
    for rep in range(args.repeat):
        order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            print(f"repetition {rep + 1}/{args.repeat}: {variant} ...", file=sys.stderr)
            results.append(spawn(variant, args, workdir / "runs" / f"{variant}-{rep}"))
    summary = summarize(results)
    print(report(summary, results, args))
    results_path = workdir / "results.json"
    results_path.write_text(json.dumps({
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k not in ("variant", "run_dir", "result")},
        "summary": summary, "runs": results}, indent=1))
    print(f"\nresults: {results_path}")
    if not all(s["rows_ok"] for s in summary.values()):
        print("FAILED: an output does not hold every id exactly once", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

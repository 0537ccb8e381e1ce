"""What recording the checkpoint history costs: the same job with history on and off.

What is measured
----------------
One input of ``--files`` Parquet files (``--rows`` rows, ``bench/file_sink.py``'s generator)
is read by Spark's file source one file an epoch (``maxFilesPerTrigger=1``, ``availableNow``),
so each run has ``--files`` epochs, into the ``exactly.files`` sink in ``exactly_once`` mode,
in one SparkSession (``local[2]``), a fresh checkpoint and output per run. The two variants
differ only in ``CheckpointConfig(history=...)``:

``history``     every epoch recorded by exactly's listener and background writer into
                ``CHECKPOINT/exactly-job/history`` (the default)
``no_history``  ``history=False``

Per run: wall-clock seconds from ``start()`` to termination, rows/s, and per epoch Spark's
``triggerExecution`` (the epoch end to end, commit included) and the sink's ``commit_ms``
(from ``OUT/_exactly/complete``): p50 and p99 over all epochs of the run (``--files`` >= 100).
The variants alternate their order in every repetition, after a warm-up run of each
(``--warmup-rows``, 200k in 40 epochs). The ratios are per repetition pair
(history / no_history): median and range. Every output is
read back: its rows and distinct ids must equal the input rows, and the history run's
history must hold one completed record per epoch, else exit status 1.

Run from the repository root::

    .venv/bin/python bench/history_overhead.py [--rows 1200000] [--files 120] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
from file_sink import read_stream, write_input

from exactly.checkpoint.history import HistoryStore, history_dir
from exactly.config import CheckpointConfig
from exactly.monitoring import recorder
from exactly.ops.query import start_query
from exactly.protocol.commitlog import CommitLog
from exactly.spark.session import spark_session

VARIANTS = ("history", "no_history")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def run_once(spark, variant: str, input_dir: Path, rows: int, run_dir: Path) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    out, ck = run_dir / "out", run_dir / "ck"
    config = CheckpointConfig(storage=str(ck), history=variant == "history")
    started = time.perf_counter()
    query = start_query(read_stream(spark, input_dir, 1), sink_format="exactly.files",
                        path=str(out), checkpoint=config,
                        options={"exactly.retainEpochs": "100000"}, available_now=True).query
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = [json.loads(p.json) for p in query.recentProgress]
    epochs = [p for p in progress if "addBatch" in (p.get("durationMs") or {})]
    trigger_ms = [float(p["durationMs"]["triggerExecution"]) for p in epochs]
    log = CommitLog(out / "_exactly")
    commit_ms = [float((log.completion(e) or {}).get("commit_ms", "nan"))
                 for e in log.completed_epochs()]
    table = ds.dataset(str(out), format="parquet").to_table(columns=["id"])
    distinct = len(pc.unique(table["id"]))
    errors = []
    if table.num_rows != rows or distinct != rows:
        errors.append(f"output has {table.num_rows} rows, {distinct} distinct ids; "
                      f"expected {rows}")
    recorded = None
    if variant == "history":
        recorder.flush(30)
        recorded = sum(1 for r in HistoryStore(history_dir(ck)).read().records
                       if r["kind"] == "epoch")
        if recorded != len(log.completed_epochs()):
            errors.append(f"history holds {recorded} epochs, the sink completed "
                          f"{len(log.completed_epochs())}")
    return {"variant": variant, "seconds": seconds, "rows_per_s": rows / seconds,
            "epochs": len(epochs), "trigger_p50": percentile(trigger_ms, 50),
            "trigger_p99": percentile(trigger_ms, 99), "commit_p50": percentile(commit_ms, 50),
            "commit_p99": percentile(commit_ms, 99), "recorded": recorded, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--files", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup-rows", type=int, default=200_000,
                        help="rows of each variant's warm-up run (default 200000, in 40 epochs)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-history-"))
    input_dir = work / "input"
    write_input(input_dir, args.rows, args.files)
    warm_dir = work / "warm-input"
    write_input(warm_dir, args.warmup_rows, 40)
    # every epoch's progress kept (Spark keeps the last 100 by default): p99 over all epochs
    spark = spark_session(app_name="bench-history",
                          conf={"spark.sql.streaming.numRecentProgressUpdates": "100000"})
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; "
          f"{args.rows:,} rows in {args.files} epochs per run", flush=True)
    for variant in VARIANTS:  # warm-up: JVM, Python workers, the recorder's thread
        run_once(spark, variant, warm_dir, args.warmup_rows, work / f"warm-{variant}")
    results: list[dict] = []
    for rep in range(args.repeat):
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            result = run_once(spark, variant, input_dir, args.rows, work / f"run-{variant}")
            result["rep"] = rep
            results.append(result)
            print(f"rep {rep} {variant:10} {result['seconds']:7.2f} s "
                  f"{result['rows_per_s']:10,.0f} rows/s  epochs {result['epochs']}  "
                  f"epoch p50/p99 {result['trigger_p50']:.0f}/{result['trigger_p99']:.0f} ms  "
                  f"commit p50/p99 {result['commit_p50']:.1f}/{result['commit_p99']:.1f} ms"
                  f"  load {os.getloadavg()[0]:.2f}"
                  + (f"  ERRORS {result['errors']}" if result["errors"] else ""), flush=True)
    spark.stop()

    def ratios(key: str) -> list[float]:
        found = []
        for rep in range(args.repeat):
            pair = {r["variant"]: r for r in results if r["rep"] == rep}
            found.append(pair["history"][key] / pair["no_history"][key])
        return found

    print("\nhistory / no_history, per repetition pair (median, range):")
    for key, label in (("rows_per_s", "throughput"), ("trigger_p99", "epoch p99"),
                       ("trigger_p50", "epoch p50"), ("commit_p99", "commit p99")):
        values = ratios(key)
        print(f"  {label:12} {statistics.median(values):.3f} "
              f"({min(values):.3f} - {max(values):.3f})  per pair: "
              + ", ".join(f"{v:.3f}" for v in values))
    print(f"load average after: {os.getloadavg()}")
    throughput = ratios("rows_per_s")
    h.write_headlines(work, [h.Headline(
        "history_overhead", "throughput history on / off", h.spread(throughput, ".3f"),
        ">= 0.98", statistics.median(throughput) >= 0.98)])
    (work / "results.json").write_text(json.dumps(results, indent=1))
    failed = [r for r in results if r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

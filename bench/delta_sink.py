"""Benchmark of the ``exactly.delta`` sink against ``deltalake.write_deltalake`` of the same rows.

What is measured
----------------
The same ``--rows`` rows (``exactly.datagen``: id, key, amount, event_time), in epochs of
``--rows-per-epoch`` rows on 2 partitions (``trigger(availableNow=True)``), are written once
per repetition by each variant into a fresh Delta table, in one SparkSession
(``local[2]``), on each store of ``--stores``: a local directory (``local``) and an
``s3://`` table on an S3Proxy server this script starts (``s3``; the Spark checkpoint and
exactly's commit log stay on the local disk):

``exactly_once``    ``exactly.delta``, mode ``exactly_once``, started with
                    ``exactly.start_query`` as users run it: each task writes one Parquet
                    file, the driver makes one Delta commit per epoch with the query's
                    application transaction
``at_least_once``   ``exactly.delta``, mode ``at_least_once``: each task commits its own file
``write_deltalake`` the reference, what a user writes today (no Spark Delta writer runs on
                    PySpark 4.3): ``foreachBatch`` calling
                    ``deltalake.write_deltalake(table, batch.toArrow(), mode="append")`` per
                    epoch (at least once: a replay appends the epoch again)
``python_noop``     ``foreachBatch`` + ``mapInArrow`` that only counts the rows: Spark
                    handing the rows to Python as Arrow, nothing written
``noop``            Spark's ``noop`` sink: the job alone

Writer settings are equal on both sides: Parquet with ``--compression`` (default snappy),
the same storage options. Every table is read back with ``deltalake`` (the files of its
newest version) and checked by id: the ids ``0 .. rows-1``, each once; for
``exactly_once`` also one Delta commit per epoch and the query's ``txn`` version = its last
epoch. ``python_noop`` is checked by the count and sum of the ids it received.

Reported per store: rows/s per variant, and per repetition pair (median and range):
``exactly_once / write_deltalake`` and ``exactly_once / at_least_once`` (goals >= 0.9
each), and each variant's time over ``noop``.

Then, with ``--trigger-epochs N`` (default 120), the per-epoch cost at a 200 ms trigger:
``exactly_once`` runs ``N`` epochs of a rate-limited datagen stream
(``--trigger-rows-per-second``) with ``CheckpointConfig(interval="200ms")`` on each store,
and the commit log's completion records give ``commit_ms`` (the driver's step 2: intent,
Delta commit, markers deleted, completion written) and ``pre_commit_ms`` (the slowest
task's file close) per epoch: p50 and p99 (a p99 needs >= 100 epochs).

Run from the repository root (not part of the test suite)::

    .venv/bin/python bench/delta_sink.py [--rows 1000000] [--rows-per-epoch 100000]
        [--repeat 3] [--stores local,s3] [--trigger-epochs 120]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query
from exactly.spark.session import spark_session

VARIANTS = ("exactly_once", "at_least_once", "write_deltalake", "python_noop", "noop")
STORES = ("local", "s3")
#: variants per store. ``at_least_once`` commits each task's file from the task: two writers
#: append to one table at once, which S3Proxy cannot serve (a LIST overlapping a PUT omits
#: settled objects, exactly.testing.s3_server; deltalake then sees a gap in _delta_log and
#: fails). Real S3 has no such gap; on S3Proxy that variant is not run.
STORE_VARIANTS = {"local": VARIANTS,
                  "s3": tuple(v for v in VARIANTS if v != "at_least_once")}
BUCKET = "bench"
#: storage options that are no secrets: given to both writers as options (the keys come
#: from the environment for the sink, explicitly for write_deltalake)
PUBLIC_OPTIONS = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ALLOW_HTTP", "conditional_put")


class Store:
    """Where the tables go: a local directory or a bucket on S3Proxy."""

    def __init__(self, name: str, workdir: Path, server: Any = None) -> None:
        self.name = name
        self.workdir = workdir
        self.server = server

    def table_uri(self, table: str) -> str:
        if self.name == "local":
            return str(self.workdir / "tables" / table)
        return f"s3://{BUCKET}/tables/{table}"

    def options(self) -> dict[str, str]:
        """``storage_options`` for ``deltalake`` (credentials included)."""
        return {} if self.server is None else self.server.storage_options()

    def sink_options(self) -> dict[str, str]:
        """The same settings as ``storage.<KEY>`` sink options, less the secrets (those
        come from the environment, as docs/delta.md advises)."""
        return {f"storage.{k}": v for k, v in self.options().items() if k in PUBLIC_OPTIONS}


def stream(spark: Any, rows: int, per_epoch: int) -> Any:
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch)
            .option("numPartitions", 2).load())


def run_variant(spark: Any, store: Store, variant: str, rows: int, per_epoch: int,
                run_dir: Path, table: str, compression: str,
                received: list[tuple[int, int]]) -> tuple[float, Any]:
    """Run ``variant`` once over ``rows`` rows into ``table``; (seconds, the query)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    ck = str(run_dir / "checkpoint")
    uri = store.table_uri(table)
    df = stream(spark, rows, per_epoch)
    started = time.perf_counter()
    if variant in ("exactly_once", "at_least_once"):
        query = start_query(
            df, sink_format="exactly.delta", path=uri, available_now=True,
            checkpoint=CheckpointConfig(storage=ck, mode=variant),
            options={"compression": compression, "exactly.retainEpochs": "1000",
                     **store.sink_options()}).query
    elif variant == "write_deltalake":
        options = store.options()

        def write(batch: Any, _epoch: int) -> None:
            from deltalake import WriterProperties, write_deltalake

            write_deltalake(uri, batch.toArrow(), mode="append", storage_options=options,
                            writer_properties=WriterProperties(
                                compression=compression.upper()))

        query = (df.writeStream.foreachBatch(write).option("checkpointLocation", ck)
                 .trigger(availableNow=True).start())
    elif variant == "python_noop":
        query = h.python_noop(df, ck, received)
    elif variant == "noop":
        query = (df.writeStream.format("noop").option("checkpointLocation", ck)
                 .trigger(availableNow=True).start())
    else:
        raise ValueError(f"unknown variant {variant!r}")
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{variant}: {query.exception()}")
    return seconds, query


def tree_cpu() -> float:
    """CPU seconds used so far by this process and its descendants (the JVM, Spark's Python
    workers, S3Proxy), reaped children included: the work a run costs, which a busy machine
    stretches less than it stretches the wall clock."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # it exited meanwhile
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def check(store: Store, variant: str, table: str, rows: int, epochs: int,
          received: list[tuple[int, int]]) -> list[str]:
    """What is wrong with ``variant``'s output (empty: the ids 0 .. rows-1, each once)."""
    if variant == "noop":
        return []
    if variant == "python_noop":
        got = (sum(n for n, _ in received), sum(t for _, t in received))
        if got != (rows, rows * (rows - 1) // 2):
            return [f"python_noop received {got[0]} rows (id sum {got[1]}); expected ids "
                    f"0..{rows - 1} once"]
        return []
    from deltalake import DeltaTable

    dt = DeltaTable(store.table_uri(table), storage_options=store.options())
    errors = []
    problem = h.check_ids(dt.to_pyarrow_table(columns=["id"]).column("id").to_numpy(), rows,
                          f"{variant} table")
    if problem:
        errors.append(problem)
    if variant == "exactly_once":
        commits = [c for c in dt.history() if "exactly.epoch" in c]
        if len(commits) != epochs:
            errors.append(f"{len(commits)} exactly commits for {epochs} epochs")
    return errors


def commit_stats(ck: Path) -> tuple[list[float], list[float]]:
    """``commit_ms`` and ``pre_commit_ms`` of every completion record of the sink's log."""
    commit, pre = [], []
    for path in sorted((ck / "exactly-sink" / "complete").glob("*.json")):
        record = json.loads(path.read_text())
        if "commit_ms" in record:
            commit.append(float(record["commit_ms"]))
        if "pre_commit_ms" in record:
            pre.append(float(record["pre_commit_ms"]))
    return commit, pre


def throughput(spark: Any, store: Store, args: argparse.Namespace,
               workdir: Path) -> tuple[list[h.Run], dict[str, list[float]]]:
    """Warm-up, then every variant ``--repeat`` times in alternating order."""
    epochs = -(-args.rows // args.rows_per_epoch)
    commit_ms: dict[str, list[float]] = {"commit_ms": [], "pre_commit_ms": []}
    variants = STORE_VARIANTS[store.name]
    for variant in variants:  # JVM, Python workers, first connections
        run_variant(spark, store, variant, args.warmup_rows, args.rows_per_epoch,
                    workdir / "warm" / f"{store.name}-{variant}", f"warm_{variant}",
                    args.compression, [])
    runs = []
    for rep, variant in h.schedule(variants, args.repeat):
        table = f"{variant}_{rep}"
        received: list[tuple[int, int]] = []
        run_dir = workdir / "runs" / f"{store.name}-{table}"
        cpu = tree_cpu()
        seconds, _ = run_variant(spark, store, variant, args.rows, args.rows_per_epoch,
                                 run_dir, table, args.compression, received)
        cpu = tree_cpu() - cpu
        errors = check(store, variant, table, args.rows, epochs, received)
        if variant == "exactly_once":
            commit, pre = commit_stats(run_dir / "checkpoint")
            commit_ms["commit_ms"] += commit
            commit_ms["pre_commit_ms"] += pre
        runs.append(h.Run(rep, variant, {"seconds": seconds, "cpu": cpu}, errors))
        print(f"{store.name} rep {rep} {variant:16} {seconds:7.2f} s  cpu {cpu:6.2f} s  "
              f"{h.load()}"
              + (f"  ERRORS {errors}" if errors else ""), flush=True)
    return runs, commit_ms


def trigger_cost(spark: Any, store: Store, args: argparse.Namespace,
                 workdir: Path) -> dict[str, Any]:
    """``exactly_once`` at a 200 ms trigger for ``--trigger-epochs`` epochs: the commit
    log's ``commit_ms`` and ``pre_commit_ms`` per epoch."""
    run_dir = workdir / "runs" / f"{store.name}-trigger"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    ck = run_dir / "checkpoint"
    uri = store.table_uri("trigger")
    df = (spark.readStream.format("exactly.datagen")
          .option("rowsPerSecond", args.trigger_rows_per_second)
          .option("numPartitions", 2).load())
    query = start_query(
        df, sink_format="exactly.delta", path=uri,
        checkpoint=CheckpointConfig(storage=str(ck), interval="200ms"),
        options={"compression": args.compression, "exactly.retainEpochs": "100000",
                 **store.sink_options()}).query
    try:
        while True:
            done = len(list((ck / "exactly-sink" / "complete").glob("*.json")))
            if done >= args.trigger_epochs or not query.isActive:
                break
            time.sleep(0.5)
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"trigger run: {query.exception()}")
    commit, pre = commit_stats(ck)
    epochs = [float(p["durationMs"]["triggerExecution"]) for p in query.recentProgress
              if int(p["numInputRows"]) > 0]
    return {"commit_ms": commit, "pre_commit_ms": pre, "trigger_execution_ms": epochs}


def start_server(workdir: Path) -> Any:
    """S3Proxy with this benchmark's bucket (:func:`harness.start_s3`)."""
    return h.start_s3(workdir, BUCKET)


def report(store: str, runs: Sequence[h.Run], rows: int) -> tuple[str, list[h.Headline]]:
    per_m = 1_000_000 / rows
    lines = [h.table(
        ["variant", "k rows/s", "over noop, s per 1M rows", "CPU s per 1M rows"],
        [[v, h.spread([rows / s / 1000 for s in h.per_rep(runs, "seconds", v)], ".0f"),
          h.spread([s * per_m for s in h.per_rep(runs, "seconds", v, minus="noop")])
          if v != "noop" else "-",
          h.spread([s * per_m for s in h.per_rep(runs, "cpu", v)])]
         for v in STORE_VARIANTS[store]])]
    ratios = {
        "exactly_once / write_deltalake": h.paired(runs, "seconds", "write_deltalake",
                                                   "exactly_once"),
        "exactly_once / at_least_once": h.paired(runs, "seconds", "at_least_once",
                                                 "exactly_once"),
        "at_least_once / write_deltalake": h.paired(runs, "seconds", "write_deltalake",
                                                    "at_least_once"),
        "CPU s: exactly_once / write_deltalake": h.paired(runs, "cpu", "exactly_once",
                                                          "write_deltalake"),
    }
    lines += ["", h.table(["ratio per repetition pair (rows/s unless CPU)", "median (range)"],
                          [[k, h.spread(v)] for k, v in ratios.items()])]
    # the sink's own work (over handing the rows to Python) against the reference's (over
    # the job alone): what the Delta sink itself costs, without Spark's Python hand-off
    rows_of = [("exactly_once over python_noop (the sink's own work)", "exactly_once",
                "python_noop"),
               ("write_deltalake over noop (the reference's own work)", "write_deltalake",
                "noop"),
               ("python_noop over noop (Spark handing rows to Python)", "python_noop", "noop")]
    lines += ["", h.table(
        ["added per 1M rows, per repetition: median (range)", "wall s", "CPU s"],
        [[label, h.spread([s * per_m for s in h.per_rep(runs, "seconds", v, minus=base)]),
          h.spread([s * per_m for s in h.per_rep(runs, "cpu", v, minus=base)])]
         for label, v, base in rows_of])]
    headlines = [
        h.Headline("delta_sink", f"{store}: {key}, rows/s", h.spread(ratios[key]), ">= 0.9",
                   statistics.median(ratios[key]) >= 0.9)
        for key in ("exactly_once / write_deltalake", "exactly_once / at_least_once")
        if ratios[key]]
    return "\n".join(lines), headlines


def ms_line(what: str, values: Sequence[float]) -> str:
    return (f"{what}: p50 {h.fmt_ms(h.p50(values))} ms, p99 {h.fmt_ms(h.p99(values))} ms "
            f"over {len(values)} epochs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=h.MIN_ROWS)
    p.add_argument("--rows-per-epoch", type=int, default=100_000)
    p.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS)
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--stores", default=",".join(STORES))
    p.add_argument("--compression", default="snappy")
    p.add_argument("--trigger-epochs", type=int, default=120,
                   help="epochs of the 200 ms trigger run per store (0: skip it)")
    p.add_argument("--trigger-rows-per-second", type=int, default=10_000)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    if any(s not in STORES for s in stores):
        p.error(f"--stores: one or more of {', '.join(STORES)}")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-delta-"))).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    note = h.sizes_note(args.rows, args.warmup_rows, args.repeat)
    print(h.machine())
    print(f"{args.rows:,} rows per run in epochs of {args.rows_per_epoch:,}, 2 partitions, "
          f"local[2], Parquet {args.compression}; stores {', '.join(stores)}; "
          f"{args.repeat} repetitions in alternating order after a {args.warmup_rows:,}-row "
          f"warm-up of each variant. {note}", flush=True)
    server = start_server(workdir) if "s3" in stores else None
    spark = spark_session(app_name="exactly-bench-delta", conf={
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.numRecentProgressUpdates": str(max(200, args.trigger_epochs + 50)),
    })
    reports, headlines, extra = [], [], {}
    errors: list[str] = []
    try:
        for name in stores:
            store = Store(name, workdir, server if name == "s3" else None)
            runs, epoch_ms = throughput(spark, store, args, workdir)
            errors += [f"{name}: {e}" for r in runs for e in r.errors]
            text, lines = report(name, runs, args.rows)
            text += ("\n" + ms_line("exactly_once commit_ms (driver, per epoch)",
                                    epoch_ms["commit_ms"])
                     + "\n" + ms_line("exactly_once pre_commit_ms (slowest task)",
                                      epoch_ms["pre_commit_ms"]))
            extra[name] = {"runs": [vars(r) for r in runs], **epoch_ms}
            if args.trigger_epochs:
                cost = trigger_cost(spark, store, args, workdir)
                extra[name]["trigger_200ms"] = cost
                text += ("\n\n200 ms trigger, exactly_once, "
                         f"{args.trigger_rows_per_second:,} rows/s:\n"
                         + ms_line("  commit_ms", cost["commit_ms"]) + "\n"
                         + ms_line("  pre_commit_ms", cost["pre_commit_ms"]) + "\n"
                         + ms_line("  triggerExecution", cost["trigger_execution_ms"]))
                lines.append(h.Headline("delta_sink", f"{name}: commit_ms p99 at a 200 ms "
                                        "trigger", h.fmt_ms(h.p99(cost["commit_ms"]))))
            reports.append(f"== {name} ==\n{text}")
            headlines += lines
            print(f"\n{reports[-1]}\n", flush=True)
    finally:
        spark.stop()
        if server is not None:
            server.close()
    print(f"\n{h.machine()}\n" + "\n\n".join(reports))
    h.write_headlines(workdir, headlines, {**extra, "note": note})
    print(f"\nresults: {workdir / 'headlines.json'}")
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

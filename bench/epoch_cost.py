"""The per-epoch fixed cost of every exactly sink at a short trigger, part by part.

What is measured
----------------
A steady input (``exactly.datagen``, ``--rate`` rows/s, default 2,000, in 2 partitions) runs
at a ``--trigger-ms`` processing-time trigger (default 200 ms) into one sink per run, in one
SparkSession (``local[2]``), a fresh local checkpoint and output per run, until the history
holds ``--epochs`` epochs (default 100) after ``--skip`` start-up epochs; then the query stops.
Variants (``--sinks``):

``noop``          Spark's ``noop`` sink: the floor (Spark's own cost of an epoch)
``files``         ``exactly.files`` (its commit log is under its output: local only)
``postgres``      ``exactly.postgres`` (2PC, prepared transactions)
``wal``           ``exactly.wal`` into PostgreSQL (staged Parquet in the sink's log)
``upsert``        ``exactly.upsert`` into PostgreSQL (key ``id``)
``kafka``         ``exactly.kafka`` (transactional producer)
``delta``         ``exactly.delta``
``<sink>_s3``     the same sink with its commit log, lease and staging (``exactly.logDir``)
                  on S3 (S3Proxy from the test kit, conditional PUTs) -- postgres, wal, kafka

Per run, the epoch records of the checkpoint history (``exactly checkpoints --json``): the
epoch's ``duration_ms`` (Spark's ``triggerExecution``) and its ``parts_ms`` -- ``planning``,
``source_offsets``, ``offsets_log``, ``processing`` (the tasks, and whatever the driver does
before them), ``sink_pre_commit`` (the slowest task's), ``sink_commit`` (the sink's commit
call, from its completion record) and ``commit_log`` (Spark's). Where the committer reports
its own steps (its DEBUG event ``epoch_steps``: begin, input, lookup, lease, intent,
handles, publish, complete, prune, sweep), they are collected in this process and reported
too. Per sink and part: the median over the runs' medians, and the p99 over all epochs of
all repetitions (>= 100 values). Runs alternate their order per repetition after one warm-up
run of each variant; every output is read back: its ids must be ``0 .. n-1`` exactly once,
with n at least the rows of the epochs the history recorded, else exit status 1.

``--driver-only``: the driver side of an epoch alone, without Spark -- what
``TwoPhaseForeachBatch`` does around the tasks of each epoch with the code on the path (a
committer kept across the run if the code has ``Committer.ensure_run``, else a new committer
and ``begin_run`` every epoch, as before), over the same sinks and servers: ``--epochs``
epochs of 2 tasks of ``--rate / 5`` rows each, 3 repetitions; per sink the median and p99 of
the driver's milliseconds per epoch (begin + commit), the tasks not counted. Spark's
``offsets/N`` is not read (no checkpoint). Less exposed to a loaded machine than a query.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/epoch_cost.py [--sinks files,postgres] [--epochs 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly import options as opt
from exactly.checkpoint.history import HistoryStore, history_dir
from exactly.config import CheckpointConfig
from exactly.monitoring import recorder
from exactly.ops.query import start_query
from exactly.spark.session import spark_session

SINKS = ("noop", "files", "postgres", "wal", "upsert", "kafka", "delta",
         "postgres_s3", "wal_s3", "kafka_s3")
FORMATS = {"files": "exactly.files", "postgres": "exactly.postgres", "wal": "exactly.wal",
           "upsert": "exactly.upsert", "kafka": "exactly.kafka", "delta": "exactly.delta"}
PARTS = ("planning", "source_offsets", "offsets_log", "processing", "sink_pre_commit",
         "sink_commit", "commit_log")
DSN_ENV = "EXACTLY_BENCH_DSN"
BUCKET = "epoch-cost"


def base_sink(variant: str) -> str:
    return variant.removesuffix("_s3")



@contextmanager
def servers(sinks: list[str], workdir: Path) -> Iterator[dict[str, Any]]:
    """The servers the chosen sinks need, from the test kit; stopped on exit."""
    found: dict[str, Any] = {}
    with ExitStack() as stack:
        names = {base_sink(s) for s in sinks}
        if names & {"postgres", "wal", "upsert"}:
            from exactly.testing.pgcluster import TempPostgres

            pg = stack.enter_context(TempPostgres(max_prepared_transactions=20))
            os.environ[DSN_ENV] = pg.dsn
            found["pg"] = pg
        if "kafka" in names:
            from exactly.testing.kafka_broker import broker_or_configured

            found["bootstrap"] = stack.enter_context(broker_or_configured(workdir / "broker"))
        if any(s.endswith("_s3") for s in sinks):
            from exactly.testing.s3_server import S3Server

            s3 = stack.enter_context(S3Server(workdir / "s3"))
            os.environ.update(s3.env())
            s3.create_bucket(BUCKET)
            found["s3"] = s3
        yield found


def sink_options(variant: str, name: str, found: dict[str, Any]) -> dict[str, str]:
    sink = base_sink(variant)
    options: dict[str, str] = {}
    if sink in ("postgres", "wal", "upsert"):
        options = {"dsnEnv": DSN_ENV, "table": name}
        if sink == "postgres":
            options["partitions"] = "2"
        if sink == "upsert":
            options["keyColumns"] = "id"
    elif sink == "kafka":
        from exactly.testing.kafka_broker import create_topic

        create_topic(found["bootstrap"], name, 2)
        options = {opt.KAFKA_BOOTSTRAP: found["bootstrap"], opt.TOPIC: name,
                   opt.TRANSACTIONAL_ID_PREFIX: f"bench-{name}"}
    if variant.endswith("_s3"):
        options[opt.LOG_DIR] = f"s3://{BUCKET}/{name}/log"
    return options


def stream(spark: Any, rate: int, variant: str) -> Any:
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", rate)
          .option("numPartitions", 2).load())
    if base_sink(variant) == "kafka":
        df = df.selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    return df


def epoch_records(checkpoint: Path) -> list[dict[str, Any]]:
    return [r for r in HistoryStore(history_dir(checkpoint)).read().records
            if r["kind"] == "epoch" and r.get("parts_ms")]


def run_once(spark: Any, variant: str, name: str, args: argparse.Namespace,
             found: dict[str, Any], workdir: Path, epochs: int) -> dict[str, Any]:
    """One run of ``variant`` until ``epochs`` epochs past the skipped ones are recorded."""
    run_dir = workdir / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    ck, out = run_dir / "ck", run_dir / "out"
    config = CheckpointConfig(storage=str(ck), interval=args.trigger_ms / 1000)
    df = stream(spark, args.rate, variant)
    if variant == "noop":
        query = (df.writeStream.format("noop").option("checkpointLocation", str(ck))
                 .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
        watched = None
    else:
        path = str(out) if base_sink(variant) in ("files", "delta") else None
        watched = start_query(df, sink_format=FORMATS[base_sink(variant)], path=path,
                              checkpoint=config,
                              options=sink_options(variant, name, found))
        query = watched.query
    STEPS.clear()
    want = epochs + args.skip
    deadline = time.monotonic() + 60 + want * 5
    while True:
        done = (len([p for p in query.recentProgress if h_ran(p)]) if watched is None
                else _last_commit(ck) + 1)
        if done >= want or not query.isActive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"{variant}: {query.exception()}")
    errors: list[str] = []
    if watched is None:
        progress = [json.loads(p.json) for p in query.recentProgress]
        records = [{"epoch": int(p["batchId"]), "duration_ms": p["durationMs"]["triggerExecution"],
                    "rows_in": p.get("numInputRows"),
                    "parts_ms": {"planning": p["durationMs"].get("queryPlanning"),
                                 "source_offsets": p["durationMs"].get("latestOffset"),
                                 "offsets_log": p["durationMs"].get("walCommit"),
                                 "processing": p["durationMs"].get("addBatch"),
                                 "commit_log": p["durationMs"].get("commitOffsets")}}
                   for p in progress if "addBatch" in (p.get("durationMs") or {})]
    else:
        recorder.flush(30)
        records = epoch_records(ck)
        problem = check_output(variant, name, out, found,
                               sum(int(r.get("rows_in") or 0) for r in records))
        if problem:
            errors.append(problem)
    records.sort(key=lambda r: r["epoch"])
    kept = [r for r in records if r["epoch"] >= args.skip]
    steps = run_steps(args.skip)
    return {"variant": variant, "records": kept, "steps": steps, "errors": errors}


def h_ran(progress: Any) -> bool:
    return "addBatch" in (json.loads(progress.json).get("durationMs") or {})


def _last_commit(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    numbers = [int(n) for n in os.listdir(commits) if n.isdigit()] if commits.is_dir() else []
    return max(numbers, default=-1)


#: the commit steps of each epoch (the committer's DEBUG event ``epoch_steps``) of this run
STEPS: list[dict[str, Any]] = []


def capture_steps() -> None:
    """Collect the committer's ``epoch_steps`` events (the sinks commit in this process,
    through ``foreachBatch``) without printing them: only WARNING and above go on to the
    handlers."""
    def keep(record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            with contextlib.suppress(ValueError, TypeError):
                event = json.loads(record.getMessage())
                if event.get("event") == "epoch_steps":
                    STEPS.append(event)
            return False
        return True

    committer = logging.getLogger("exactly.committer")
    committer.setLevel(logging.DEBUG)
    committer.addFilter(keep)


def run_steps(skip: int) -> dict[str, list[float]]:
    steps: dict[str, list[float]] = {}
    for event in STEPS:
        if int(event.get("epoch", -1)) >= skip:
            for step, ms in (event.get("steps_ms") or {}).items():
                steps.setdefault(step, []).append(float(ms))
    return steps


def check_output(variant: str, name: str, out: Path, found: dict[str, Any],
                 recorded: int) -> str | None:
    """The run's output ids must be ``0 .. n-1`` once each (none lost, none twice), and n at
    least the ``recorded`` rows of the epochs in the history (the query may have stopped
    after the sink committed an epoch and before Spark recorded it)."""
    sink = base_sink(variant)
    ids: Any
    if sink == "files":
        import pyarrow.dataset as ds

        ids = ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"]
    elif sink in ("postgres", "wal", "upsert"):
        # the epoch the stop interrupted may have left prepared transactions: they hold
        # locks on the table (its rows were never committed; no intent finished them)
        found["pg"].rollback_prepared()
        with found["pg"].connect() as conn:
            ids = [r[0] for r in conn.execute(f'SELECT id FROM "{name}"').fetchall()]
            conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
    elif sink == "kafka":
        from exactly.testing.kafka_broker import consume_all

        ids = [int(v) for _, _, _, v in consume_all(found["bootstrap"], name) if v is not None]
    elif sink == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(str(out)).to_pyarrow_table(columns=["id"])["id"]
    else:
        return None
    count = len(ids)
    if count < recorded:
        return f"{variant} output: {count:,} rows, fewer than the {recorded:,} rows recorded"
    return h.check_ids(ids, count, f"{variant} output")


def summarize(runs: list[dict[str, Any]], variant: str) -> tuple[list[str], dict[str, Any]]:
    """One table row: per part, the median of the runs' medians / the p99 over all epochs."""
    mine = [r for r in runs if r["variant"] == variant]
    cells = [variant, str(sum(len(r["records"]) for r in mine))]
    summary: dict[str, Any] = {}
    for part in ("duration", *PARTS):
        def value(rec: dict[str, Any], part: str = part) -> float | None:
            v = rec["duration_ms"] if part == "duration" else rec["parts_ms"].get(part)
            return None if v is None else float(v)

        per_run = [[v for rec in r["records"] if (v := value(rec)) is not None] for r in mine]
        medians = [float(np.median(vals)) for vals in per_run if vals]
        every = [v for vals in per_run for v in vals]
        med = statistics.median(medians) if medians else None
        tail = h.p99(every)
        summary[part] = {"p50": med, "p99": tail}
        cells.append("-" if med is None else f"{med:.0f} / {h.fmt_ms(tail)}")
    return cells, summary


def steps_table(runs: list[dict[str, Any]], variants: list[str]) -> str | None:
    names: list[str] = []
    for r in runs:
        names += [s for s in r["steps"] if s not in names]
    if not names:
        return None
    rows = []
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        cells = [variant]
        for step in names:
            per_run = [r["steps"].get(step, []) for r in mine]
            medians = [float(np.median(v)) for v in per_run if v]
            every = [x for v in per_run for x in v]
            cells.append("-" if not medians else
                         f"{statistics.median(medians):.1f} / {h.fmt_ms(h.p99(every))}")
        rows.append(cells)
    return h.table(["sink (commit steps, ms p50 / p99)", *names], rows)


def driver_epochs(variant: str, name: str, args: argparse.Namespace, found: dict[str, Any],
                  workdir: Path) -> list[float]:
    """``--driver-only``: milliseconds of the driver side of each epoch (see the module doc)."""
    import uuid

    import pyarrow as pa
    from pyspark.sql.types import StructType

    from exactly.protocol.committer import Committer
    from exactly.protocol.contract import TaskInfo
    from exactly.protocol.task import write_task
    from exactly.spark.formats import sink_for

    sink_name = base_sink(variant)
    shutil.rmtree(workdir / name, ignore_errors=True)
    out = workdir / name / "out"
    options = {**sink_options(variant, name, found), opt.MODE: "exactly_once"}
    if sink_name in ("files", "delta"):
        options[opt.PATH] = str(out)
    if sink_name != "files":  # the files sink keeps its log under its output
        options.setdefault(opt.LOG_DIR, str(workdir / name / "log"))
    if sink_name == "kafka":
        columns = [("key", pa.string()), ("value", pa.string())]
    else:
        columns = [("id", pa.int64())]
    schema = pa.schema(columns)
    built = sink_for(FORMATS[sink_name], options, StructType.fromJson(
        {"type": "struct", "fields": [{"name": n, "type": "string" if t == pa.string()
                                        else "long", "nullable": True, "metadata": {}}
                                       for n, t in columns]}))
    assert built is not None
    sink, settings = built.sink, built.settings
    sink.prepare_target(schema, 2)
    query_id, run_id = str(uuid.uuid4()), str(uuid.uuid4())
    kept = Committer(sink, settings) if hasattr(Committer, "ensure_run") else None
    per_epoch = max(1, args.rate // 5)
    times, next_id = [], 0
    for epoch in range(args.skip + args.epochs):
        started = time.perf_counter()
        committer = kept or Committer(sink, settings)
        if kept is not None:
            committer.ensure_run(query_id, run_id)
        else:
            committer.begin_run(query_id, run_id)
        begun = time.perf_counter() - started
        handles = []
        for partition in range(2):
            ids = list(range(next_id, next_id + per_epoch // 2))
            next_id += len(ids)
            batch = (pa.record_batch({"key": [str(i) for i in ids],
                                      "value": [str(i) for i in ids]}, schema=schema)
                     if sink_name == "kafka" else pa.record_batch({"id": ids}, schema=schema))
            task = TaskInfo(query_id, run_id, epoch, partition, epoch * 2 + partition)
            handles.append(write_task(sink, task, [batch]).handle)
        started = time.perf_counter()
        committer.commit_epoch(epoch, [h for h in handles if h is not None])
        if epoch >= args.skip:
            times.append((begun + time.perf_counter() - started) * 1000)
    return times


def driver_only(variants: list[str], args: argparse.Namespace, work: Path) -> int:
    print(h.machine())
    print(f"{args.label} driver side only (no Spark): {args.epochs} epochs per run after "
          f"{args.skip}, 2 tasks of {max(1, args.rate // 5) // 2} rows each, "
          f"{args.repeat} repetitions in alternating order", flush=True)
    found_times: dict[str, list[list[float]]] = {}
    with servers(variants, work) as found:
        for rep, variant in h.schedule([v for v in variants if v != "noop"], args.repeat):
            times = driver_epochs(variant, f"drv_{variant}_{rep}", args, found, work)
            found_times.setdefault(variant, []).append(times)
            print(f"rep {rep} {variant:12} driver ms p50 {h.fmt_ms(h.p50(times))}  {h.load()}",
                  flush=True)
    rows = []
    for variant, runs in found_times.items():
        medians = [float(np.median(t)) for t in runs]
        every = [x for t in runs for x in t]
        rows.append([variant, str(len(every)), f"{statistics.median(medians):.1f}",
                     h.fmt_ms(h.p99(every))])
    print(f"\n{args.label} driver side per epoch, ms (median of the runs' medians, p99 over "
          "all epochs)")
    print(h.table(["sink", "epochs", "p50", "p99"], rows))
    print(f"\n{h.machine()}")
    (work / "driver.json").write_text(json.dumps(found_times))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--sinks", default=",".join(SINKS))
    p.add_argument("--epochs", type=int, default=100, help="epochs measured per run")
    p.add_argument("--skip", type=int, default=5, help="start-up epochs not measured")
    p.add_argument("--warmup-epochs", type=int, default=20)
    p.add_argument("--rate", type=int, default=2000, help="input rows per second")
    p.add_argument("--trigger-ms", type=int, default=200)
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--label", default="", help="printed with the tables (e.g. before/after)")
    p.add_argument("--driver-only", action="store_true",
                   help="time the driver side of each epoch alone, without Spark")
    args = p.parse_args(argv)
    # a TERM stops the servers too (the context managers run on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    variants = [s for s in args.sinks.split(",") if s]
    if "noop" not in variants:
        variants.insert(0, "noop")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-epoch-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.driver_only:
        return driver_only(variants, args, work)
    note = h.tail_note(args.epochs, "epochs", args.repeat)
    print(h.machine())
    print(f"{args.label} {args.rate:,} rows/s in 2 partitions, {args.trigger_ms} ms trigger, "
          f"{args.epochs} epochs per run after {args.skip} start-up epochs, {args.repeat} "
          f"repetitions in alternating order after a {args.warmup_epochs}-epoch warm-up of "
          f"each variant; local[2]. {note}", flush=True)
    runs: list[dict[str, Any]] = []
    failed = False
    capture_steps()
    with servers(variants, work) as found:
        spark = spark_session(app_name="exactly-bench-epoch-cost",
                              conf={"spark.sql.streaming.numRecentProgressUpdates": "100000",
                                    "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("FATAL")  # a stopped query's cancelled tasks log errors
        try:
            for variant in variants:
                run_once(spark, variant, f"warm_{variant}", args, found, work,
                         args.warmup_epochs)
            for rep, variant in h.schedule(variants, args.repeat):
                result = run_once(spark, variant, f"run_{variant}_{rep}", args, found, work,
                                  args.epochs)
                result["rep"] = rep
                runs.append(result)
                durations = [float(r["duration_ms"]) for r in result["records"]]
                print(f"rep {rep} {variant:12} epochs {len(durations):4}  epoch p50 "
                      f"{h.fmt_ms(h.p50(durations))} ms  {h.load()}"
                      + (f"  ERRORS {result['errors']}" if result["errors"] else ""),
                      flush=True)
                failed |= bool(result["errors"])
                (work / "results.json").write_text(json.dumps(runs, indent=1, default=str))
        finally:
            spark.stop()
    rows, summaries = [], {}
    for variant in variants:
        cells, summaries[variant] = summarize(runs, variant)
        rows.append(cells)
    print(f"\n{args.label} per-epoch parts, ms: median of the runs' medians / p99 over all "
          f"epochs. {note}")
    print(h.table(["sink", "epochs", "epoch", *PARTS], rows))
    steps = steps_table(runs, [v for v in variants if v != "noop"])
    if steps:
        print(f"\n{steps}")
    print(f"\n{h.machine()}")
    headlines = []
    floor = summaries["noop"]["duration"]["p50"]
    for variant in variants:
        if variant == "noop":
            continue
        p50 = summaries[variant]["duration"]["p50"]
        over = None if p50 is None or floor is None else p50 - floor
        headlines.append(h.Headline("epoch_cost", f"{variant} epoch p50 over noop at "
                                    f"{args.trigger_ms} ms (ms)",
                                    "n/a" if over is None else f"{over:.0f}", "", None))
    h.write_headlines(work, headlines, {"summaries": summaries})
    (work / "results.json").write_text(json.dumps(runs, indent=1, default=str))
    print(f"results: {work / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

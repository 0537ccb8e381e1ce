"""One epoch end to end, part by part: where the time between Spark's ``addBatch`` and the
end of the sink's commit goes, for an exactly sink, the Python floor and the target's own sink.

What is measured
----------------
The input and queries of :mod:`visibility` (a Kafka topic fed at ``--rate`` records/s, 2,000,
read by Spark's Kafka source, a ``--interval-ms`` trigger, 200 ms, ``local[2]``), one query
per variant, each run ``--seconds`` (30) after its warm-up, with Spark's event log on. Variants
per target (``--only kafka,postgres,files,delta``):

``exactly_once``  the target's exactly sink through ``start_query`` (``foreachBatch``)
``python_noop``   ``foreachBatch`` running ``mapInArrow`` over the batch that drops the rows
                  and returns one row per task, collected: the hand-off to Python workers
                  that any Python sink pays, with nothing written (the floor)
``reference``     the target's own writer (:mod:`visibility`'s reference variant)
``exactly_once_nohistory``  ``exactly_once`` without exactly's checkpoint history (its
                  listener and recorder thread): what recording costs an epoch
``exactly_once_nostream``   ``exactly.kafka`` publishing after its tasks only (no early
                  transaction streamed while they run)

Per epoch with input, after the first 5: from Spark's event log, the epoch's SQL execution
(``addBatch``, its start and end), its jobs, stages and tasks; from this process, when the
``foreachBatch`` function was entered and left and when the committer's ``commit_epoch``
began and ended, and the committer's own steps (DEBUG event ``epoch_steps``). The parts:

``into_python``   addBatch start -> the foreachBatch function entered (Spark builds the
                  batch's DataFrame and calls Python through Py4J)
``before_job``    -> the epoch's first job submitted (the sink's per-epoch set-up, the
                  ``mapInArrow`` plan, Spark's planning; for the reference: addBatch start
                  -> its job)
``scheduling``    -> the first task launched
``tasks``         -> the last task finished (``task_run``: the slowest task's run time)
``job_end``       -> the last job ended
``handles``       -> ``commit_epoch`` began (the tasks' handles brought to Python)
``commit``        ``commit_epoch`` (its steps listed below the table)
``after_commit``  -> the foreachBatch function left
``back``          -> addBatch end (for the reference: its last job's end -> addBatch end)
``commit_log``    Spark's ``commitOffsets`` after addBatch

Medians (and p90s) over the epochs; the table's columns are the variants. One run per variant after
a warm-up run of each; this traces, it does not compare
(``bench/visibility.py`` does, by the benchmark rules). ``--conf KEY=VALUE`` (repeatable)
adds Spark settings, e.g. ``spark.python.unix.domain.socket.enabled=false`` to trace the
loopback-TCP hand-off.

Run from the repository root::

    .venv/bin/python bench/epoch_trace.py [--only kafka] [--seconds 30] [--conf K=V]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
import latency as lat
import visibility as vis

from exactly.protocol import committer as committer_mod
from exactly.spark import foreach_batch

PARTS = ("into_python", "before_job", "scheduling", "tasks", "job_end", "handles", "commit",
         "after_commit", "back", "addBatch", "commit_log", "task_run", "tasks_per_epoch")
SKIP_EPOCHS = 5

#: (query id, epoch) -> {"enter", "commit_start", "commit_end", "exit"} (epoch ms)
MARKS: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
#: (query id, epoch) -> the committer's steps_ms
STEPS: dict[tuple[str, int], dict[str, float]] = {}
#: the driver's garbage collections: (generation, ms)
COLLECTIONS: list[tuple[int, float]] = []


def watch_collections() -> None:
    """Time every garbage collection of this (the driver's) Python process."""
    import gc

    started: dict[str, float] = {}

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            COLLECTIONS.append((info["generation"], (time.perf_counter() - started["t"]) * 1000))

    gc.callbacks.append(timed)


def _now_ms() -> float:
    return time.time() * 1000


def instrument() -> None:
    """Mark the foreachBatch call and the commit of every epoch in this process."""
    call = foreach_batch.TwoPhaseForeachBatch.__call__
    commit = committer_mod.Committer.commit_epoch

    def traced_call(self: Any, batch_df: Any, epoch: int) -> None:
        enter = _now_ms()
        try:
            return call(self, batch_df, epoch)
        finally:
            left = _now_ms()
            query = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
            MARKS[(query, epoch)].update(enter=enter, exit=left)

    def traced_commit(self: Any, epoch: int, handles: Any, **kwargs: Any) -> None:
        began = _now_ms()
        try:
            return commit(self, epoch, handles, **kwargs)
        finally:
            if handles:
                MARKS[(handles[0].query_id, epoch)].update(commit_start=began,
                                                           commit_end=_now_ms())

    foreach_batch.TwoPhaseForeachBatch.__call__ = traced_call  # type: ignore[method-assign]
    committer_mod.Committer.commit_epoch = traced_commit  # type: ignore[method-assign]

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            with contextlib.suppress(ValueError, TypeError):
                event = json.loads(record.getMessage())
                if event.get("event") == "epoch_steps":
                    STEPS[(event.get("query_id", ""), int(event["epoch"]))] = event["steps_ms"]
            return False
        return True

    log = logging.getLogger("exactly.committer")
    log.setLevel(logging.DEBUG)
    log.addFilter(keep)


# -- the floor: foreachBatch + mapInArrow, nothing written ---------------------------------
def start_python_noop(ctx: vis.Context, df: Any, ck: Path) -> Any:
    import pyarrow as pa
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    schema = StructType([StructField("handle", StringType()),
                         StructField("pre_commit_ms", DoubleType())])
    arrow_schema = pa.schema([("handle", pa.string()), ("pre_commit_ms", pa.float64())])

    def drop(batches: Any) -> Any:
        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"handle": [str(rows)], "pre_commit_ms": [0.0]},
                                         schema=arrow_schema)

    def write(batch_df: Any, epoch: int) -> None:
        enter = _now_ms()
        batch_df.mapInArrow(drop, schema).collect()
        query = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        MARKS[(query, epoch)].update(enter=enter, exit=_now_ms())

    return (df.writeStream.foreachBatch(write).option("checkpointLocation", str(ck))
            .trigger(processingTime=f"{ctx.interval_ms} milliseconds").start())


def run_python_noop(ctx: vis.Context, rate: int, seconds: float) -> str:
    """A run of the floor: warm-up until two epochs with data, then ``seconds`` at ``rate``."""
    from exactly.connectors.kafka.source import read_kafka

    tag = uuid.uuid4().hex[:6]
    source = f"trace-in-noop-{tag}"
    lat.create_input(ctx.bootstrap, source)
    df = read_kafka(ctx.spark, ctx.bootstrap, topics=source).selectExpr(
        "cast(cast(value as string) as long) as id", "cast(timestamp as double) as ts")
    query = start_python_noop(ctx, df, ctx.workdir / f"ck-noop-{tag}")
    producer = lat.RateProducer(ctx.bootstrap, source)
    steady = lat.ProducerProcess(ctx.bootstrap, source, rate, seconds)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and sum(
                1 for p in query.recentProgress if p["numInputRows"]) < 2:
            producer.warm()
            time.sleep(ctx.interval_ms / 1000)
        steady.go()
        steady.join(lambda: None)
        query.processAllAvailable()  # stopped between epochs, not inside one
        return str(query.id)
    finally:
        steady.kill()
        query.stop()


# -- the event log ----------------------------------------------------------------------
def read_events(directory: Path) -> dict[str, Any]:
    """Spark's event log: SQL executions of streaming batches, jobs, tasks, progress."""
    roots: dict[tuple[str, int], dict[str, float]] = {}
    jobs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    job_by_id: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    progress: dict[tuple[str, int], dict[str, Any]] = {}
    executions: dict[int, tuple[str, int]] = {}
    for path in glob.glob(str(directory / "*" / "events_*")):
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                kind = event["Event"]
                if kind.endswith("SQLExecutionStart"):
                    desc = event.get("description") or ""
                    if event["executionId"] == event.get("rootExecutionId") and "batch = " in desc:
                        key = (event.get("queryId", ""), int(desc.rsplit("batch = ", 1)[1]))
                        executions[event["executionId"]] = key
                        roots[key] = {"start": event["time"]}
                elif kind.endswith("SQLExecutionEnd"):
                    key = executions.get(event["executionId"])
                    if key is not None:
                        roots[key]["end"] = event["time"]
                elif kind == "SparkListenerJobStart":
                    props = event.get("Properties") or {}
                    batch = props.get("streaming.sql.batchId")
                    if batch is None:
                        continue
                    job = {"submit": event["Submission Time"], "tasks": []}
                    job_by_id[event["Job ID"]] = job
                    jobs[(props.get("sql.streaming.queryId", ""), int(batch))].append(job)
                    for stage in event["Stage IDs"]:
                        stage_job[stage] = event["Job ID"]
                elif kind == "SparkListenerJobEnd":
                    if event["Job ID"] in job_by_id:
                        job_by_id[event["Job ID"]]["end"] = event["Completion Time"]
                elif kind == "SparkListenerTaskEnd":
                    job_id = stage_job.get(event["Stage ID"])
                    if job_id in job_by_id:
                        info, metrics = event["Task Info"], event.get("Task Metrics") or {}
                        job_by_id[job_id]["tasks"].append({
                            "launch": info["Launch Time"], "finish": info["Finish Time"],
                            "run": metrics.get("Executor Run Time", 0)})
                elif kind.endswith("QueryProgressEvent"):
                    p = event["progress"]
                    if sum(s.get("numInputRows", 0) for s in p["sources"]):
                        progress[(p["id"], int(p["batchId"]))] = p
    return {"roots": roots, "jobs": jobs, "progress": progress}


def epoch_parts(events: dict[str, Any], query: str) -> dict[str, list[float]]:
    """Each part's milliseconds per epoch of ``query`` (epochs with input, after the first
    :data:`SKIP_EPOCHS`)."""
    parts: dict[str, list[float]] = defaultdict(list)
    epochs = sorted(b for q, b in events["progress"] if q == query)[SKIP_EPOCHS:]
    for epoch in epochs:
        key = (query, epoch)
        root, jobs = events["roots"].get(key), events["jobs"].get(key)
        if not root or "end" not in root or not jobs:
            continue
        tasks = [t for j in jobs for t in j["tasks"]]
        first_job, last_end = min(j["submit"] for j in jobs), max(j.get("end", 0) for j in jobs)
        marks = MARKS.get(key, {})
        enter = marks.get("enter")
        parts["addBatch"].append(root["end"] - root["start"])
        parts["commit_log"].append(
            float(events["progress"][key]["durationMs"].get("commitOffsets", 0)))
        if enter is not None:
            parts["into_python"].append(enter - root["start"])
            parts["before_job"].append(first_job - enter)
        else:
            parts["before_job"].append(first_job - root["start"])
        if tasks:
            parts["scheduling"].append(min(t["launch"] for t in tasks) - first_job)
            parts["tasks"].append(max(t["finish"] for t in tasks) - min(t["launch"] for t in tasks))
            parts["task_run"].append(max(t["run"] for t in tasks))
            parts["job_end"].append(last_end - max(t["finish"] for t in tasks))
            parts["tasks_per_epoch"].append(len(tasks))
        after_job = last_end
        if "commit_start" in marks:
            parts["handles"].append(marks["commit_start"] - last_end)
            parts["commit"].append(marks["commit_end"] - marks["commit_start"])
            after_job = marks["commit_end"]
        if "exit" in marks:
            parts["after_commit" if "commit_start" in marks else "handles"].append(
                marks["exit"] - after_job)
            parts["back"].append(root["end"] - marks["exit"])
        else:
            parts["back"].append(root["end"] - last_end)
    return parts


#: a variant name ending so runs its query with CheckpointConfig(history=False)
NO_HISTORY = "_nohistory"


@contextlib.contextmanager
def history(on: bool) -> Any:
    """Run :mod:`visibility`'s exactly queries with or without the checkpoint history."""
    import functools

    from exactly.config import CheckpointConfig

    vis.CheckpointConfig = (CheckpointConfig if on  # type: ignore[misc]
                            else functools.partial(CheckpointConfig, history=False))
    try:
        yield
    finally:
        vis.CheckpointConfig = CheckpointConfig  # type: ignore[misc]


#: a variant name ending so runs exactly.kafka without its early (streamed) publish
NO_STREAM = "_nostream"


@contextlib.contextmanager
def streaming(on: bool) -> Any:
    """Run exactly.kafka with or without the publish overlapping its tasks."""
    from exactly.connectors.kafka.sink import KafkaSink

    start = KafkaSink.start_early_publish
    if not on:
        KafkaSink.start_early_publish = lambda *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        KafkaSink.start_early_publish = start  # type: ignore[method-assign]


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="kafka", help="targets, comma-separated")
    ap.add_argument("--variants", default="exactly_once,python_noop,reference")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--interval-ms", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup-seconds", type=float, default=5.0)
    ap.add_argument("--conf", action="append", default=[], help="KEY=VALUE Spark setting")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)

    from exactly.logs import configure
    from exactly.spark.session import spark_session
    from exactly.testing.kafka_broker import broker_or_configured
    from exactly.testing.pgcluster import TempPostgres

    configure()
    instrument()
    watch_collections()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-trace-"))
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "events").mkdir(parents=True)
    extra = dict(kv.split("=", 1) for kv in args.conf)
    names = [n for n in args.only.split(",") if n]
    conf = {"spark.ui.showConsoleProgress": "false", "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(workdir / "events"), "spark.eventLog.compress": "false",
            **(h.jdbc_conf() if "postgres" in names else {}), **extra}
    print(h.machine())
    print(f"input {args.rate:,} records/s, trigger {args.interval_ms} ms, {args.seconds:.0f} s "
          f"per run; extra settings {extra or 'none'}", flush=True)
    queries: dict[tuple[str, str], str] = {}
    with broker_or_configured(workdir / "broker") as bootstrap, \
            TempPostgres(max_prepared_transactions=10) as pg:
        os.environ[vis.DSN_ENV] = pg.dsn
        spark = spark_session(app_name="exactly-bench-trace", kafka=True, conf=conf)
        ctx = vis.Context(spark, bootstrap, pg, workdir, args.interval_ms, 0.01)
        try:
            for name in names:
                target = vis.TARGETS[name](ctx)
                kinds = [target.reference if v == "reference" else v
                         for v in args.variants.split(",") if v]
                for phase, seconds in (("warm-up", args.warmup_seconds),
                                       ("run", args.seconds)):
                    for kind in kinds:
                        if kind == "python_noop":
                            query = run_python_noop(ctx, args.rate, seconds)
                        else:
                            with history(not kind.endswith(NO_HISTORY)), \
                                    streaming(not kind.endswith(NO_STREAM)):
                                result = vis.run(target, kind.removesuffix(NO_HISTORY)
                                                 .removesuffix(NO_STREAM), args.rate, seconds)
                            if result["error"]:
                                print(f"CHECK FAILED {name} {kind}: {result['error']}")
                                return 1
                            query = json.loads(
                                (Path(result["checkpoint"]) / "metadata").read_text())["id"]
                        print(f"{phase} {name} {kind} done  {h.load()}", flush=True)
                        if phase == "run":
                            queries[(name, kind)] = query
        finally:
            spark.stop()
    events = read_events(workdir / "events")
    for name in names:
        kinds = [k for (n, k) in queries if n == name]
        per = {k: epoch_parts(events, queries[(name, k)]) for k in kinds}
        print(f"\n{name}: median (p90) ms per epoch with input ({SKIP_EPOCHS} first left out)")
        rows = []
        for part in PARTS:
            cells = [f"{statistics.median(per[k][part]):.1f} ({p90(per[k][part]):.0f})"
                     if per[k].get(part) else "-" for k in kinds]
            if any(c != "-" for c in cells):
                rows.append([part, *cells])
        rows.append(["epochs", *[str(len(per[k].get("addBatch", []))) for k in kinds]])
        print(h.table(["part", *kinds], rows))
        for kind in kinds:
            steps = [s for (q, _e), s in STEPS.items() if q == queries[(name, kind)]]
            if steps:
                keys = list(dict.fromkeys(k for s in steps for k in s))
                print(f"{kind} commit steps (committer epoch_steps), median ms: " + ", ".join(
                    f"{k} {statistics.median(s.get(k, 0.0) for s in steps):.2f}"
                    for k in keys))
    for gen in (0, 1, 2):
        times = [ms for g, ms in COLLECTIONS if g == gen]
        if times:
            print(f"driver gc generation {gen}: {len(times)} collections, median "
                  f"{statistics.median(times):.2f} ms, max {max(times):.1f} ms")
    print(f"\n{h.machine()}\nevent log: {workdir / 'events'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

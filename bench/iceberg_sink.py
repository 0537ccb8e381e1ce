"""Benchmark of the ``exactly.iceberg`` sink against pyiceberg's own ``table.append`` of the
same rows: throughput at saturation, visibility latency at a 200 ms trigger, and where an
epoch's time goes.

Variants (one SparkSession, ``local[2]``; each run a fresh warehouse with the embedded SQLite
catalog ``DIR/catalog.db``, catalog name ``exactly``, and one table ``db.events``)
------------------------------------------------------------------------------------
``exactly_once``     ``exactly.iceberg``, mode ``exactly_once``, started with
                     ``exactly.start_query`` as users run it: each task writes its Parquet
                     file, the driver commits one fast-append snapshot per epoch (with the
                     query's progress property) through the catalog
``at_least_once``    ``exactly.iceberg``, mode ``at_least_once``: each task commits its own
                     file as a snapshot of its own, from the task
``pyiceberg_append`` the reference, what a user writes today (no Iceberg Spark runtime exists
                     for PySpark 4.3): ``foreachBatch`` calling ``batch.toArrow()`` and
                     ``table.append(arrow, snapshot_properties={"spark.epochId": ...})`` on a
                     table loaded once per query (pyiceberg's fast append; at least once: a
                     replay appends the epoch again)
``python_noop``      baseline: ``foreachBatch`` + ``mapInArrow`` that only counts the rows (Spark
                     handing the rows to Python as Arrow, nothing written): the floor of any
                     Python sink
``noop``             baseline: Spark's ``noop`` sink, the job alone

Equal settings on every side: every table is created by this script before its run with the
same schema and the same properties (``write.parquet.compression-codec`` = ``--compression``;
all other ``write.*`` and ``commit.*`` properties pyiceberg's defaults, so the same row-group
limit, page settings and commit retries), in the same kind of catalog, written through the
same FileIO (pyiceberg's ``PyArrowFileIO``), with the same trigger. The codec is checked in the
footer of a data file of every table.

Throughput
----------
``--rows`` rows (``exactly.datagen``: id, key, amount, event_time) on 2 partitions in epochs of
``--rows-per-epoch`` (``trigger(availableNow=True)``), per variant and repetition; a warm-up of
``--warmup-rows`` per variant first, then ``--repeat`` repetitions in alternating order
(:func:`harness.schedule`). Rows/s per variant, CPU seconds of the whole process tree, and per
repetition pair (median and range): ``exactly_once / pyiceberg_append`` (the claim: >= 0.9),
``exactly_once / at_least_once`` (goal >= 0.9), and the sink's own work over ``python_noop``.
Every table is read back with pyiceberg and checked by id: the ids ``0 .. rows-1`` each exactly
once in every variant (``at_least_once`` may repeat ids only after a fault; there is none
here); ``exactly_once`` also one snapshot per epoch carrying the query and the epoch and the
progress property at the last epoch; the reference one snapshot per epoch.

Visibility (``--vis-seconds``, 0 skips it)
------------------------------------------
:mod:`visibility`'s run (:func:`visibility.run`, the same as for the other sinks): a Kafka
topic with ``LogAppendTime`` (the broker stamps each record when it appends it) fed at
``--rate`` records/s (2,000) by a producer process, read by Spark's Kafka source, a
processing-time trigger of ``--interval-ms`` (200 ms) on every variant. The reader
(:class:`IcebergReader`) polls the catalog every ``--poll-ms`` (10 ms): the table's metadata
pointer in the catalog, and when it moved, the table (``catalog.load_table``), its new
snapshots and the data files they added; each id is seen when that poll came back (before the
files are read). Latency = first seen - the broker's append time of the input record. Also
per snapshot: seen - the snapshot's own ``timestamp-ms`` (made by the committer just before the
catalog commit: the catalog commit and the reader's delay). p99 only over >= 100 epochs per run
(fewer print ``NOT A MEASUREMENT``); warm-up run of each variant, then ``--repeat`` repetitions
in alternating order; outputs checked by id (each id exactly once, every variant).

Where the time goes (``--profile``, on by default)
--------------------------------------------------
In the driver process only, pyiceberg's and the sink's driver-side steps are timed (a wrapper
around each, a few microseconds a call): ``Table.append`` (the reference, whole), its Parquet
write, ``_SnapshotProducer._commit`` (the new manifest, the parent's manifest list read, the
new manifest list), ``Transaction.commit_transaction`` -> ``SqlCatalog.commit_table`` ->
``load_table`` (the catalog refresh before the swap) and ``_write_metadata`` (the new metadata
JSON), ``IcebergSink.publish_epoch`` and ``commit_handle``, the marker deletes, and
``DataFrame.toArrow`` / ``collect`` (the epoch's Spark job: for the sink and ``python_noop``
with the tasks' work inside). Printed per epoch (median, p99 over >= 100) and in seconds per
1 M rows beside exactly's own completion records (``commit_ms``, its ``steps_ms``,
``pre_commit_ms``) and Spark's ``addBatch``. ``at_least_once`` commits in its tasks (Python
workers), outside this profile: its cost shows in ``addBatch``.

Run from the repository root (not part of the test suite; the defaults take about 14 minutes
on 2 cores)::

    .venv/bin/python bench/iceberg_sink.py [--rows 1000000] [--rows-per-epoch 100000]
        [--repeat 3] [--compression snappy] [--vis-seconds 90] [--rate 2000]
        [--variants exactly_once,at_least_once,pyiceberg_append,python_noop,noop]

A smoke run: ``--rows 200000 --warmup-rows 20000 --repeat 1 --vis-seconds 5
--vis-warmup-seconds 0`` (prints ``NOT A MEASUREMENT``).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
import latency as lat
import visibility as vis
from delta_sink import commit_stats, tree_cpu

from exactly.config import CheckpointConfig
from exactly.ops.query import start_query
from exactly.spark.session import spark_session

VARIANTS = ("exactly_once", "at_least_once", "pyiceberg_append", "python_noop", "noop")
SINKS = ("exactly_once", "at_least_once", "pyiceberg_append")
REFERENCE = "pyiceberg_append"
CATALOG = "exactly"  # the sink's default catalog name (exactly.connectors.iceberg.catalog)
NAMESPACE = "db"
TABLE = f"{NAMESPACE}.events"
CODEC_PROPERTY = "write.parquet.compression-codec"


# -- catalog and tables ---------------------------------------------------------------------
def catalog_of(warehouse: Path) -> Any:
    """The embedded SQLite catalog the sink keeps in ``warehouse`` (the same properties)."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(CATALOG, type="sql", uri=f"sqlite:///{warehouse}/catalog.db",
                        warehouse=str(warehouse))


def table_properties(codec: str) -> dict[str, str]:
    return {CODEC_PROPERTY: codec}


def create_table(warehouse: Path, schema: Any, codec: str) -> None:
    """A fresh catalog in ``warehouse`` with the table, ``schema`` (Arrow) and the codec."""
    shutil.rmtree(warehouse, ignore_errors=True)
    warehouse.mkdir(parents=True)
    catalog = catalog_of(warehouse)
    catalog.create_namespace(NAMESPACE)
    catalog.create_table(TABLE, schema=schema, properties=table_properties(codec))


def arrow_schema(df: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = df.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(df.schema, timezone=tz)


def exactly_options(warehouse: Path) -> dict[str, str]:
    return {"warehouse": str(warehouse), "table": TABLE}


def reference_writer(warehouse: Path) -> Callable[[Any, int], None]:
    """The reference's ``foreachBatch`` function: the table loaded once (the first epoch), each
    epoch ``toArrow`` then ``table.append`` with the epoch in the snapshot's summary; empty
    epochs skipped (the sink commits nothing for them either)."""
    state: dict[str, Any] = {}

    def write(batch: Any, epoch: int) -> None:
        if "table" not in state:
            state["table"] = catalog_of(warehouse).load_table(TABLE)
        data = batch.toArrow()
        if data.num_rows:
            state["table"].append(data, snapshot_properties={"spark.epochId": str(epoch)})

    return write


# -- the profile of the driver's steps ----------------------------------------------------
class Timers:
    """Wall time of wrapped functions in this process, per call path (``outer / inner``),
    left out for threads that call :meth:`ignore_this_thread` (the visibility reader)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.installed = False

    def ignore_this_thread(self) -> None:
        self._local.off = True

    def take(self) -> dict[str, list[float]]:
        """The samples so far (ms per call, by path), and start again."""
        with self._lock:
            out, self.samples = dict(self.samples), defaultdict(list)
        return out

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        raw = owner.__dict__[attr]
        static = isinstance(raw, staticmethod)
        fn = raw.__func__ if static else raw
        timers = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            local = timers._local
            if getattr(local, "off", False):
                return fn(*args, **kwargs)
            stack = local.__dict__.setdefault("stack", [])
            stack.append(label)
            path = " / ".join(stack)
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = (time.perf_counter() - began) * 1000
                stack.pop()
                with timers._lock:
                    timers.samples[path].append(ms)

        setattr(owner, attr, staticmethod(timed) if static else timed)

    def install(self) -> None:
        """Wrap the driver-side steps of both writers (once)."""
        if self.installed:
            return
        from pyiceberg.catalog import MetastoreCatalog
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.table import Table, Transaction
        from pyiceberg.table.update.snapshot import _SnapshotProducer
        from pyspark.sql.classic.dataframe import DataFrame

        from exactly.connectors import lake_files
        from exactly.connectors.iceberg.sink import IcebergSink

        for owner, attr, label in [
                (DataFrame, "toArrow", "DataFrame.toArrow (runs the epoch's Spark job)"),
                (DataFrame, "collect", "DataFrame.collect (runs the epoch's Spark job)"),
                (Table, "append", "Table.append"),
                (Transaction, "append", "Transaction.append"),
                (_SnapshotProducer, "_commit", "snapshot: manifests + manifest list"),
                (_SnapshotProducer, "_manifests", "manifests (new one, parent's read)"),
                (Transaction, "commit_transaction", "Transaction.commit_transaction"),
                (SqlCatalog, "commit_table", "SqlCatalog.commit_table"),
                (SqlCatalog, "load_table", "SqlCatalog.load_table"),
                (MetastoreCatalog, "_write_metadata", "metadata JSON written"),
                (IcebergSink, "publish_epoch", "IcebergSink.publish_epoch"),
                (IcebergSink, "commit_handle", "IcebergSink.commit_handle"),
                (lake_files, "delete_marker", "marker deleted")]:
            self.wrap(owner, attr, label)
        self.installed = True


TIMERS = Timers()


def profile_rows(samples: dict[str, list[float]], epochs: int | None,
                 per_m: float) -> list[list[str]]:
    """Table rows: path, calls per epoch (total calls when ``epochs`` is None), ms per call
    p50 / p99, s per 1 M rows; under each path with timed calls inside, a row for the rest
    of its time (its own work outside them)."""
    rows = []
    for path in sorted(samples):
        values = samples[path]
        depth = path.count(" / ")
        calls = (f"{len(values) / max(epochs, 1):.2f}" if epochs is not None
                 else str(len(values)))
        rows.append(["  " * depth + path.rsplit(" / ", 1)[-1], calls,
                     h.fmt_ms(h.p50(values)), h.fmt_ms(h.p99(values)),
                     f"{sum(values) / 1000 * per_m:.3f}"])
        inner = [k for k in samples if k.startswith(path + " / ")
                 and k.count(" / ") == depth + 1]
        if inner:
            rest = sum(values) - sum(sum(samples[k]) for k in inner)
            rows.append(["  " * (depth + 1) + "(the rest, outside the calls timed inside)",
                         "", f"{rest / len(values):.1f} avg", "",
                         f"{rest / 1000 * per_m:.3f}"])
    return rows


def merge(into: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for k, v in more.items():
        into.setdefault(k, []).extend(v)


# -- throughput ---------------------------------------------------------------------------
def stream(spark: Any, rows: int, per_epoch: int) -> Any:
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch)
            .option("numPartitions", 2).load())


def run_variant(spark: Any, variant: str, rows: int, per_epoch: int, run_dir: Path,
                codec: str, received: list[tuple[int, int]]) -> tuple[float, Any]:
    """Run ``variant`` once over ``rows`` rows into a fresh table; (seconds, the query)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    ck = str(run_dir / "checkpoint")
    warehouse = run_dir / "warehouse"
    df = stream(spark, rows, per_epoch)
    if variant in SINKS:
        create_table(warehouse, arrow_schema(df), codec)
    started = time.perf_counter()
    if variant in ("exactly_once", "at_least_once"):
        query = start_query(
            df, sink_format="exactly.iceberg", available_now=True,
            checkpoint=CheckpointConfig(storage=ck, mode=variant),
            options={**exactly_options(warehouse), "exactly.retainEpochs": "1000"}).query
    elif variant == REFERENCE:
        query = (df.writeStream.foreachBatch(reference_writer(warehouse))
                 .option("checkpointLocation", ck).trigger(availableNow=True).start())
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


def data_file_codecs(table: Any) -> set[str]:
    """The Parquet codecs in the footer of one data file of ``table`` (its first column)."""
    import pyarrow.parquet as pq

    files = [t.file.file_path for t in table.scan().plan_files()][:1]
    codecs = set()
    for uri in files:
        meta = pq.ParquetFile(local_path(uri)).metadata
        codecs.add(meta.row_group(0).column(0).compression.lower())
    return codecs


def local_path(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path) if "://" in uri else uri


def check(variant: str, run_dir: Path, rows: int, epochs: int, codec: str,
          received: list[tuple[int, int]], query: Any) -> tuple[list[str], dict[str, Any]]:
    """What is wrong with ``variant``'s output (empty: the ids 0 .. rows-1, each once), and
    facts of the table (snapshots, data files)."""
    if variant == "noop":
        return [], {}
    if variant == "python_noop":
        got = (sum(n for n, _ in received), sum(t for _, t in received))
        if got != (rows, rows * (rows - 1) // 2):
            return [f"python_noop received {got[0]} rows (id sum {got[1]}); expected ids "
                    f"0..{rows - 1} once"], {}
        return [], {}
    from exactly.connectors.iceberg import snapshots

    table = catalog_of(run_dir / "warehouse").load_table(TABLE)
    errors = []
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_numpy()
    problem = h.check_ids(ids, rows, f"{variant} table")
    if problem:
        errors.append(problem)
    snaps = table.snapshots()
    files = len(list(table.scan().plan_files()))
    codecs = data_file_codecs(table)
    if codecs != {codec.lower()}:
        errors.append(f"{variant}: data files written with {sorted(codecs)}, not {codec}")
    others = {k: v for k, v in table.metadata.properties.items()
              if not k.startswith(snapshots.PROGRESS_PREFIX)}
    if others != table_properties(codec):
        errors.append(f"{variant}: table properties {others}")
    if variant == "exactly_once":
        qid = str(query.id)
        ours = [s for s in snaps if snapshots.epoch_of(s)[0] == qid]
        if len(ours) != epochs or len(snaps) != epochs:
            errors.append(f"{len(ours)} exactly snapshots ({len(snaps)} in all) for "
                          f"{epochs} epochs")
        if snapshots.committed_epoch(table, qid) != epochs - 1:
            errors.append(f"progress property {snapshots.committed_epoch(table, qid)}, "
                          f"expected {epochs - 1}")
    elif variant == REFERENCE and len(snaps) != epochs:
        errors.append(f"{len(snaps)} reference snapshots for {epochs} epochs")
    return errors, {"snapshots": len(snaps), "files": files}


def add_batch_ms(query: Any) -> list[float]:
    return [float(p["durationMs"].get("addBatch", 0)) for p in query.recentProgress
            if int(p["numInputRows"]) > 0]


def throughput(spark: Any, args: argparse.Namespace, variants: Sequence[str],
               workdir: Path) -> tuple[list[h.Run], dict[str, Any]]:
    """Warm-up, then every variant ``--repeat`` times in alternating order; the runs and the
    profile per variant (driver steps, commit records, addBatch)."""
    epochs = -(-args.rows // args.rows_per_epoch)
    prof: dict[str, Any] = {v: {"timers": {}, "commit": [], "pre_commit": [], "steps": {},
                                "add_batch": [], "snapshots": [], "files": []}
                            for v in variants}
    for variant in variants:  # JVM, Python workers, pyiceberg's imports, first catalogs
        run_variant(spark, variant, args.warmup_rows, args.rows_per_epoch,
                    workdir / "warm" / variant, args.compression, [])
    TIMERS.take()
    runs = []
    for rep, variant in h.schedule(variants, args.repeat):
        received: list[tuple[int, int]] = []
        run_dir = workdir / "runs" / f"{variant}_{rep}"
        cpu = tree_cpu()
        seconds, query = run_variant(spark, variant, args.rows, args.rows_per_epoch, run_dir,
                                     args.compression, received)
        cpu = tree_cpu() - cpu
        timers = TIMERS.take()
        errors, facts = check(variant, run_dir, args.rows, epochs, args.compression,
                              received, query)
        p = prof[variant]
        merge(p["timers"], timers)
        p["add_batch"] += add_batch_ms(query)
        p["snapshots"].append(facts.get("snapshots"))
        p["files"].append(facts.get("files"))
        if variant in ("exactly_once", "at_least_once"):
            commit, pre, steps = completion_records(run_dir / "checkpoint")
            p["commit"] += commit
            p["pre_commit"] += pre
            merge(p["steps"], steps)
        runs.append(h.Run(rep, variant, {"seconds": seconds, "cpu": cpu}, errors))
        print(f"rep {rep} {variant:17} {seconds:7.2f} s  {args.rows / seconds / 1000:6.0f} k "
              f"rows/s  cpu {cpu:6.2f} s  "
              + (f"{facts['snapshots']} snapshots, {facts['files']} files  " if facts else "")
              + h.load() + (f"  ERRORS {errors}" if errors else ""), flush=True)
        shutil.rmtree(run_dir / "warehouse", ignore_errors=True)  # keep the disk small
    return runs, prof


def completion_records(ck: Path) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """``commit_ms``, ``pre_commit_ms`` and ``steps_ms`` of the sink log's completion records."""
    import json

    commit, pre = commit_stats(ck)
    steps: dict[str, list[float]] = {}
    for path in sorted((ck / "exactly-sink" / "complete").glob("*.json")):
        for k, v in (json.loads(path.read_text()).get("steps_ms") or {}).items():
            steps.setdefault(k, []).append(float(v))
    return commit, pre, steps


def throughput_report(runs: Sequence[h.Run], variants: Sequence[str], rows: int,
                      ) -> tuple[str, list[h.Headline]]:
    per_m = 1_000_000 / rows
    has = set(variants)
    lines = [h.table(
        ["variant", "k rows/s", "s per 1M rows", "over noop, s per 1M rows",
         "CPU s per 1M rows"],
        [[v, h.spread([rows / s / 1000 for s in h.per_rep(runs, "seconds", v)], ".0f"),
          h.spread([s * per_m for s in h.per_rep(runs, "seconds", v)]),
          h.spread([s * per_m for s in h.per_rep(runs, "seconds", v, minus="noop")])
          if v != "noop" and "noop" in has else "-",
          h.spread([s * per_m for s in h.per_rep(runs, "cpu", v)])]
         for v in variants])]
    # rows/s ratios = the inverse ratio of the times of the same repetition
    ratios = {
        "exactly_once / pyiceberg_append": h.paired(runs, "seconds", REFERENCE,
                                                    "exactly_once"),
        "exactly_once / at_least_once": h.paired(runs, "seconds", "at_least_once",
                                                 "exactly_once"),
        "at_least_once / pyiceberg_append": h.paired(runs, "seconds", REFERENCE,
                                                     "at_least_once"),
        "CPU s: exactly_once / pyiceberg_append": h.paired(runs, "cpu", "exactly_once",
                                                           REFERENCE),
    }
    if "python_noop" in has:  # nothing written: the most any writer in the executors' Python
        # workers can reach against a reference that brings the rows to the driver as Arrow
        ratios["python_noop / pyiceberg_append (the ceiling of a Python writer in tasks)"] = (
            h.paired(runs, "seconds", REFERENCE, "python_noop"))
    lines += ["", h.table(["ratio per repetition pair (rows/s unless CPU)", "median (range)"],
                          [[k, h.spread(v)] for k, v in ratios.items()])]
    if "python_noop" in has and "noop" in has:
        rows_of = [("exactly_once over python_noop (the sink's own work)", "exactly_once",
                    "python_noop"),
                   ("at_least_once over python_noop", "at_least_once", "python_noop"),
                   ("pyiceberg_append over noop (the reference's own work)", REFERENCE,
                    "noop"),
                   ("python_noop over noop (Spark handing rows to Python)", "python_noop",
                    "noop")]
        lines += ["", h.table(
            ["added per 1M rows, per repetition: median (range)", "wall s", "CPU s"],
            [[label, h.spread([s * per_m for s in h.per_rep(runs, "seconds", v, minus=b)]),
              h.spread([s * per_m for s in h.per_rep(runs, "cpu", v, minus=b)])]
             for label, v, b in rows_of if v in has])]
    headlines = [
        h.Headline("iceberg_sink", f"throughput {key}, rows/s", h.spread(ratios[key]),
                   ">= 0.9", statistics.median(ratios[key]) >= 0.9)
        for key in ("exactly_once / pyiceberg_append", "exactly_once / at_least_once")
        if ratios[key]]
    return "\n".join(lines), headlines


def profile_report(prof: dict[str, Any], epochs_per_run: int, repeat: int, rows: int,
                   title: str) -> str:
    """Per variant: exactly's completion records, Spark's addBatch, the timed driver steps."""
    out = [title]
    per_m = 1_000_000 / (rows * repeat)
    for variant, p in prof.items():
        epochs = epochs_per_run * repeat
        body = [["Spark addBatch (the epoch's write, tasks + driver)", "1.00",
                 h.fmt_ms(h.p50(p["add_batch"])), h.fmt_ms(h.p99(p["add_batch"])),
                 f"{sum(p['add_batch']) / 1000 * per_m:.3f}"]]
        if p["commit"]:
            body.append(["exactly commit_ms (driver, whole commit)",
                         f"{len(p['commit']) / epochs:.2f}", h.fmt_ms(h.p50(p["commit"])),
                         h.fmt_ms(h.p99(p["commit"])),
                         f"{sum(p['commit']) / 1000 * per_m:.3f}"])
            for step, values in sorted(p["steps"].items()):
                body.append([f"  step {step}", f"{len(values) / epochs:.2f}",
                             h.fmt_ms(h.p50(values)), h.fmt_ms(h.p99(values)),
                             f"{sum(values) / 1000 * per_m:.3f}"])
            body.append(["exactly pre_commit_ms (slowest task's close)",
                         f"{len(p['pre_commit']) / epochs:.2f}",
                         h.fmt_ms(h.p50(p["pre_commit"])), h.fmt_ms(h.p99(p["pre_commit"])),
                         "-"])
        body += profile_rows(p["timers"], epochs, per_m)
        snaps = [s for s in p["snapshots"] if s is not None]
        files = [f for f in p["files"] if f is not None]
        facts = (f"; per run {statistics.median(snaps):.0f} snapshots, "
                 f"{statistics.median(files):.0f} data files" if snaps else "")
        out += ["", f"{variant} ({epochs} epochs{facts}):",
                h.table(["step (driver process; nested = called inside)", "calls/epoch",
                         "p50 ms", "p99 ms", "s per 1M rows"], body)]
    return "\n".join(out)


# -- visibility ---------------------------------------------------------------------------
class IcebergReader(lat.FirstSeen):
    """A reader polling the catalog: the table's metadata pointer (one SQLite query), and when
    it moved, ``catalog.load_table``, the snapshots new since the last poll and the data files
    each added (its own manifests); the files are read after ``visible_at`` is taken."""

    def __init__(self, warehouse: Path, poll_s: float) -> None:
        super().__init__(poll_s)
        self.warehouse = warehouse
        self.catalog: Any = None
        self.db: sqlite3.Connection | None = None
        self.pointer: str | None = None
        self.seen: set[int] = set()
        #: per snapshot seen: seen - the snapshot's timestamp-ms, in ms
        self.snapshot_lag_ms: list[float] = []

    def _pointer(self) -> str | None:
        if self.db is None:
            self.db = sqlite3.connect(f"file:{self.warehouse}/catalog.db?mode=ro", uri=True,
                                      timeout=5, check_same_thread=False)
        row = self.db.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND "
            "table_namespace = ? AND table_name = ?", (CATALOG, NAMESPACE, "events")).fetchone()
        return None if row is None else str(row[0])

    def poll(self) -> Iterable[tuple[int, float]]:
        TIMERS.ignore_this_thread()
        pointer = self._pointer()
        if pointer is None or pointer == self.pointer:
            return []
        if self.catalog is None:
            self.catalog = catalog_of(self.warehouse)
        table = self.catalog.load_table(TABLE)
        meta = table.metadata
        new, snap = [], meta.current_snapshot()
        while snap is not None and snap.snapshot_id not in self.seen:
            new.append(snap)
            snap = (meta.snapshot_by_id(snap.parent_snapshot_id)
                    if snap.parent_snapshot_id is not None else None)
        paths = []
        for s in new:
            for manifest in s.manifests(table.io):
                if manifest.added_snapshot_id != s.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    paths.append(entry.data_file.file_path)
        self.visible_at = seen = time.time()
        for s in new:
            self.seen.add(s.snapshot_id)
            self.snapshot_lag_ms.append(seen * 1000 - s.timestamp_ms)
        self.pointer = pointer
        rows = []
        for path in paths:
            rows.extend(vis.read_parquet(local_path(path)))
        return rows

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


class IcebergTarget(vis.Target):
    """:mod:`visibility`'s target for Iceberg: the three sinks, :class:`IcebergReader`."""

    name = "iceberg"
    variants = SINKS
    reference = REFERENCE
    exact = SINKS  # no faults here: every id exactly once, at_least_once included
    goal_under_1s = False

    def __init__(self, ctx: vis.Context, codec: str) -> None:
        super().__init__(ctx)
        self.codec = codec
        self.readers: list[IcebergReader] = []

    def output(self, kind: str, tag: str) -> str:
        return str(self.ctx.workdir / f"iceberg-{kind}-{tag}")

    def prepare(self, kind: str, out: str) -> None:
        import pyarrow as pa

        create_table(Path(out), pa.schema([("id", pa.int64()), ("ts", pa.float64())]),
                     self.codec)

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        if kind == REFERENCE:
            return self.spark(df.writeStream.foreachBatch(reference_writer(Path(out))), ck)
        # every completion record kept (the default prunes to the newest 100): the profile
        return self.exactly(kind, "exactly.iceberg", df, ck,
                            {**exactly_options(Path(out)), "exactly.retainEpochs": "100000"})

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        reader = IcebergReader(Path(out), self.ctx.poll_s)
        self.readers.append(reader)
        return reader

    def final_ids(self, kind: str, out: str) -> list[int]:
        table = catalog_of(Path(out)).load_table(TABLE)
        return table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()


def visibility_runs(spark: Any, args: argparse.Namespace, workdir: Path,
                    ) -> tuple[list[h.Run], dict[str, Any], list[str]]:
    """:func:`visibility.run` of each variant: a warm-up run each, then ``--repeat`` runs in
    alternating order; the runs (p50, p99, epochs), per-variant details, failures."""
    from exactly.testing.kafka_broker import broker_or_configured

    runs: list[h.Run] = []
    details: dict[str, Any] = {v: {"snapshot_lag_ms": [], "timers": {}, "epochs": 0,
                                   "commit": [], "pre_commit": [], "steps": {},
                                   "add_batch": [], "snapshots": [], "files": []}
                               for v in SINKS}
    failures: list[str] = []
    vis_dir = workdir / "visibility"
    shutil.rmtree(vis_dir, ignore_errors=True)
    vis_dir.mkdir(parents=True)
    with broker_or_configured(vis_dir / "broker") as bootstrap:
        ctx = vis.Context(spark, bootstrap, None, vis_dir, args.interval_ms,
                          args.poll_ms / 1000)
        target = IcebergTarget(ctx, args.compression)
        if args.vis_warmup_seconds > 0:
            for kind in SINKS:
                r = vis.run(target, kind, args.rate, args.vis_warmup_seconds)
                print(f"warm-up visibility {kind}: p99 {h.fmt_ms(h.p99(r['delays_ms']))} ms, "
                      f"{r['epochs']} epochs  {h.load()}"
                      + (f"  ERRORS {r['error']}" if r["error"] else ""), flush=True)
        TIMERS.take()
        for rep, kind in h.schedule(SINKS, args.repeat):
            try:
                r = vis.run(target, kind, args.rate, args.vis_seconds)
            except Exception as exc:  # one failed run does not end the benchmark
                failures.append(f"visibility rep {rep} {kind}: {exc!r}")
                print(f"visibility rep {rep} {kind:17} FAILED {exc!r}  {h.load()}", flush=True)
                TIMERS.take()
                continue
            d = r["delays_ms"]
            reader = target.readers[-1]
            values = {"p50": h.p50(d) or float("nan"), "p99": h.p99(d) or float("nan"),
                      "epochs": r["epochs"], "snap_p99": h.p99(reader.snapshot_lag_ms)
                      or float("nan"), "resolution_ms": r["resolution_ms"]}
            runs.append(h.Run(rep, kind, values, [r["error"]] if r["error"] else []))
            det = details[kind]
            det["snapshot_lag_ms"] += reader.snapshot_lag_ms
            merge(det["timers"], TIMERS.take())
            det["epochs"] += r["epochs"]
            ck = Path(r["checkpoint"])
            if kind != REFERENCE:
                commit, pre, steps = completion_records(ck)
                det["commit"] += commit
                det["pre_commit"] += pre
                merge(det["steps"], steps)
            det["snapshots"].append(len(reader.seen))
            phases = " ".join(f"{k} {v:.0f}" for k, v in r["phases"].items())
            det["add_batch"].append(r["phases"].get("addBatch", float("nan")))
            print(f"visibility rep {rep} {kind:17} p50 {values['p50']:5.0f} ms  p99 "
                  f"{values['p99']:5.0f} ms  max {max(d, default=float('nan')):5.0f} ms over "
                  f"{len(d):,} records (appended {r['rate']:.0f}/s), {r['epochs']} epochs, "
                  f"{len(reader.seen)} snapshots (snapshot -> readable p50 "
                  f"{h.fmt_ms(h.p50(reader.snapshot_lag_ms))} ms); resolution "
                  f"{r['resolution_ms']:.1f} ms; Spark median ms: {phases}  {h.load()}"
                  + (f"  ERRORS {r['error']}" if r["error"] else ""), flush=True)
    return runs, details, failures


def visibility_report(runs: Sequence[h.Run], details: dict[str, Any], args: argparse.Namespace,
                      ) -> tuple[str, list[h.Headline], str]:
    # a p99 is a measurement only over >= 100 epochs in every run of its variant (and of the
    # reference, for a ratio): judged per variant, named in the note
    def kind_note(kind: str) -> str:
        epochs = h.per_rep(runs, "epochs", kind)
        return h.tail_note(min(epochs) if epochs else 0, "epochs", args.repeat)

    notes = {kind: kind_note(kind) for kind in SINKS if h.per_rep(runs, "p99", kind)}
    note = "; ".join(f"{kind}: {text}" for kind, text in notes.items() if text)
    rows = []
    headlines = []
    for kind in SINKS:
        p99s = h.per_rep(runs, "p99", kind)
        if not p99s:
            continue
        ratio = h.paired(runs, "p99", kind, REFERENCE) if kind != REFERENCE else []
        invalid = notes[kind] or (notes.get(REFERENCE, "") if ratio else "")
        rows.append([kind, h.spread(h.per_rep(runs, "p50", kind), ".0f"),
                     h.spread(p99s, ".0f") + (" NOT A MEASUREMENT" if notes[kind] else ""),
                     (h.spread(ratio) + (" NOT A MEASUREMENT" if invalid else "")) if ratio
                     else "-",
                     h.spread(h.per_rep(runs, "snap_p99", kind), ".0f"),
                     h.spread(h.per_rep(runs, "epochs", kind), ".0f"),
                     h.spread(h.per_rep(runs, "resolution_ms", kind), ".1f")])
        headlines.append(h.Headline("iceberg_sink", f"visibility p99 ms, {kind}",
                                    h.spread(p99s, ".0f") + (f" {notes[kind]}" if notes[kind]
                                                             else "")))
        if ratio:
            headlines.append(h.Headline("iceberg_sink", f"visibility p99 {kind} / {REFERENCE}",
                                        h.spread(ratio) + (f" {invalid}" if invalid else "")))
    text = (f"visibility: input append -> readable by a reader polling the catalog; "
            f"{args.rate:,} records/s, trigger {args.interval_ms} ms, {args.vis_seconds:.0f} s "
            f"per run, median (range) over {args.repeat} repetitions. {note}\n"
            + h.table(["variant", "p50 ms", "p99 ms", "p99 / reference",
                       "snapshot -> readable p99 ms", "epochs", "resolution ms"], rows))
    return text, headlines, note


def visibility_profile(details: dict[str, Any], args: argparse.Namespace) -> str:
    out = [f"where an epoch goes at a {args.interval_ms} ms trigger (every epoch of the "
           "measured visibility runs, their warm-up epochs included; calls = in all):"]
    for kind, det in details.items():
        body = [["Spark addBatch, median of each run", "-",
                 " / ".join(f"{v:.0f}" for v in det["add_batch"]), "-"]]
        if det["commit"]:
            body.append(["exactly commit_ms (driver, whole commit)", str(len(det["commit"])),
                         h.fmt_ms(h.p50(det["commit"])), h.fmt_ms(h.p99(det["commit"]))])
            for step, values in sorted(det["steps"].items()):
                body.append([f"  step {step}", str(len(values)), h.fmt_ms(h.p50(values)),
                             h.fmt_ms(h.p99(values))])
            body.append(["exactly pre_commit_ms (slowest task's close)",
                         str(len(det["pre_commit"])), h.fmt_ms(h.p50(det["pre_commit"])),
                         h.fmt_ms(h.p99(det["pre_commit"]))])
        body.append(["snapshot timestamp -> readable by the reader",
                     str(len(det["snapshot_lag_ms"])), h.fmt_ms(h.p50(det["snapshot_lag_ms"])),
                     h.fmt_ms(h.p99(det["snapshot_lag_ms"]))])
        body += [r[:4] for r in profile_rows(det["timers"], None, 0)]
        out += ["", f"{kind} ({det['epochs']} epochs measured):",
                h.table(["step (driver process; nested = called inside)", "calls",
                         "p50 ms", "p99 ms"], body)]
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=h.MIN_ROWS)
    p.add_argument("--rows-per-epoch", type=int, default=100_000)
    p.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS)
    p.add_argument("--repeat", "--repetitions", dest="repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="throughput variants, comma-separated (python_noop and noop are the "
                        "baselines of the 'own work' rows)")
    p.add_argument("--compression", default="snappy",
                   help=f"the Parquet codec of every table ({CODEC_PROPERTY})")
    p.add_argument("--vis-seconds", type=float, default=90.0,
                   help="measured seconds per visibility run (0: skip visibility)")
    p.add_argument("--vis-warmup-seconds", type=float, default=5.0,
                   help="the one visibility warm-up run per variant (0: none)")
    p.add_argument("--rate", type=int, default=2000, help="visibility input records/s")
    p.add_argument("--interval-ms", type=int, default=200, help="the visibility trigger")
    p.add_argument("--poll-ms", type=float, default=10.0, help="the reader's poll interval")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="do not time the driver-side steps")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        p.error(f"--variants: one or more of {', '.join(VARIANTS)}")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-iceberg-"))
               ).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    note = h.sizes_note(args.rows, args.warmup_rows, args.repeat)
    epochs = -(-args.rows // args.rows_per_epoch)
    print(h.machine())
    import pyiceberg

    print(f"pyiceberg {pyiceberg.__version__}; SQLite catalog per run; throughput: "
          f"{args.rows:,} rows per run in {epochs} epochs of {args.rows_per_epoch:,}, "
          f"2 partitions, local[2], Parquet {args.compression} on every table; "
          f"{args.repeat} repetitions in alternating order after a {args.warmup_rows:,}-row "
          f"warm-up of each variant. {note}", flush=True)
    if args.profile:
        TIMERS.install()
    spark = spark_session(app_name="exactly-bench-iceberg", kafka=args.vis_seconds > 0, conf={
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000"})
    errors: list[str] = []
    headlines: list[h.Headline] = []
    reports: list[str] = []
    extra: dict[str, Any] = {"note": note}
    try:
        runs, prof = throughput(spark, args, variants, workdir)
        errors += [e for r in runs for e in r.errors]
        text, lines = throughput_report(runs, variants, args.rows)
        headlines += lines
        reports.append(f"== throughput ({args.rows:,} rows per run) ==\n{text}")
        if args.profile:
            reports.append(profile_report(prof, epochs, args.repeat, args.rows,
                                          "== where the time goes: throughput runs =="))
        extra["throughput"] = {"runs": [vars(r) for r in runs], "profile": prof}
        print("\n" + "\n\n".join(reports) + "\n", flush=True)
        if args.vis_seconds > 0:
            vruns, details, failures = visibility_runs(spark, args, workdir)
            errors += [e for r in vruns for e in r.errors] + failures
            vtext, vlines, vnote = visibility_report(vruns, details, args)
            headlines += vlines
            reports.append(f"== visibility ==\n{vtext}")
            if args.profile:
                reports.append(visibility_profile(details, args))
            extra["visibility"] = {"runs": [vars(r) for r in vruns], "details": details,
                                   "failures": failures, "note": vnote}
    finally:
        spark.stop()
    print(f"\n{h.machine()}\n\n" + "\n\n".join(reports))
    h.write_headlines(workdir, headlines, extra)
    print(f"\nresults: {workdir / 'headlines.json'}")
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

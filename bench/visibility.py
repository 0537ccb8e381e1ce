"""Visibility latency of every sink at a fixed rate and a short trigger: from the moment an
input record is appended to the moment a reader that sees only committed data first sees it.

The input (one for every target)
--------------------------------
A Kafka topic of 2 partitions with ``message.timestamp.type=LogAppendTime`` (the broker
stamps each record when it appends it), fed at ``--rate`` records/s (2,000) by a producer in
a process of its own, each record carrying its id (:mod:`latency`). One SparkSession
(``local[2]``) reads it with Spark's Kafka source and writes ``id`` and ``ts`` (the broker's
append time, ``cast(timestamp as double)``) with a processing-time trigger of
``--interval-ms`` (200 ms) into each variant below. A run: start the query and its reader,
produce one warm-up record per trigger until two epochs with data have committed and the
reader saw warm-up data, then produce ``--seconds`` (30) at the rate, then wait until the
reader saw every id.

Targets, variants and their readers (``--only kafka,postgres,files,delta``)
------------------------------------------------------------------------
``kafka``     ``exactly_once`` / ``at_least_once``: ``exactly.kafka``; ``spark_kafka``: Spark's
              Kafka sink (reference). Reader: a ``read_committed`` consumer
              (``fetch.wait.max.ms`` = the poll interval).
``postgres``  ``exactly_once`` / ``at_least_once``: ``exactly.postgres`` (2PC; exactly_once
              read through the view ``<table>_committed``, which shows whole epochs only,
              at_least_once through the table); ``wal``: ``exactly.wal``; ``upsert``:
              ``exactly.upsert`` keyed by id; ``spark_jdbc``: Spark's JDBC writer in
              ``foreachBatch`` (reference). Reader: ``SELECT id, ts ... WHERE id >= f``, f the
              lowest id not seen yet.
``files``     ``exactly_once`` / ``at_least_once``: ``exactly.files`` (Parquet); reader: a
              lister of ``epoch-*/`` (names starting with ``_`` or ``.`` skipped, as the sink
              documents); ``spark_parquet``: Spark's Parquet file sink (reference), reader: the
              files named in ``_spark_metadata``, as Spark's own readers do.
``delta``     ``exactly_once`` / ``at_least_once``: ``exactly.delta``; ``write_deltalake``:
              ``foreachBatch`` + ``deltalake.write_deltalake(mode="append")`` (reference).
              Reader: ``deltalake.DeltaTable`` updated to each new version, new files read.

Every reader polls every ``--poll-ms`` (10 ms) in a thread of its own and records, per id,
the time the poll that first returned it came back (for listers: when the listing came
back, before the files are read); the resolution printed is the mean time between two polls.
Latency = first seen - the broker's append time of the input record (one machine, one clock).
After each run the whole output is read again and checked by id: each id exactly once for
``exactly_once``, ``wal`` and ``upsert`` (a key holds one row), at least once for the others.

Reported per variant: p50 and p99 (median and range over ``--repeat`` repetitions, run in
alternating order after one warm-up run of each variant), epochs per run and Spark's median
epoch durations; the ratio of p99 to the target's reference per repetition pair. Goals: p99
<= 1.2 x the reference, and < 1 s for files, Kafka and PostgreSQL. A run with fewer than 100
epochs measured or fewer than 3 repetitions prints ``NOT A MEASUREMENT``.

Run from the repository root::

    .venv/bin/python bench/visibility.py [--only kafka,postgres,files,delta] [--skip wal,upsert]
        [--rate 2000]
        [--interval-ms 200] [--seconds 30] [--warmup-seconds 10] [--repeat 3]
        [--poll-ms 10] [--workdir DIR]
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
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
import latency as lat

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.ops.query import start_query
from exactly.testing.kafka_broker import broker_or_configured, consume_all, quiet_conf

DSN_ENV = "EXACTLY_BENCH_DSN"
#: Spark's progress durations printed per variant (median over the measured epochs)
PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "walCommit", "addBatch",
          "commitOffsets")


def epoch_parts(checkpoint: Path, after: int) -> dict[str, float]:
    """Medians over the completed epochs after ``after`` of what exactly's checkpoint history
    records per epoch (``exactly checkpoints --json``): its duration and its parts (planning,
    source offsets, offsets log, processing, sink pre-commit and commit, Spark's commit log).
    Empty for a query without exactly's history (Spark's own sinks)."""
    from exactly.monitoring import overview

    if not (checkpoint / "exactly-job").exists():
        return {}
    records = [r for r in overview.load(str(checkpoint)).records
               if r.get("kind") == "epoch" and r.get("status") == "completed"
               and isinstance(r.get("epoch"), int) and r["epoch"] > after]
    if not records:
        return {}
    out = {"duration": statistics.median(float(r["duration_ms"]) for r in records)}
    for key in records[0].get("parts_ms") or {}:
        values = [float(r["parts_ms"][key]) for r in records
                  if (r.get("parts_ms") or {}).get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    return out


def ids_ok(ids: list[int], sent: int, exactly: bool, what: str) -> str | None:
    """The ids 0 .. sent-1 in ``ids`` (warm-up ids, negative, left out): each exactly once,
    or with ``exactly=False`` each at least once."""
    arr = np.asarray([i for i in ids if i >= 0], dtype=np.int64)
    return h.check_ids(arr if exactly else np.unique(arr), sent, what)


# -- readers ------------------------------------------------------------------------------
class KafkaReader(lat.FirstSeen):
    """A read_committed consumer of the output topic (JSON values with id and ts)."""

    def __init__(self, bootstrap: str, topic: str, poll_s: float) -> None:
        super().__init__(poll_s)
        from confluent_kafka import Consumer

        self.consumer = Consumer({
            **quiet_conf(bootstrap), "group.id": f"vis-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "fetch.wait.max.ms": max(1, int(poll_s * 1000))})
        self.consumer.subscribe([topic])

    def poll(self) -> Iterable[tuple[int, float]]:
        rows = []
        # librdkafka fetches in the background: take what arrived, without waiting
        for msg in self.consumer.consume(10_000, 0):
            if msg.error() is None:
                record = json.loads(msg.value())
                rows.append((int(record["id"]), float(record["ts"])))
        return rows

    def close(self) -> None:
        self.consumer.close()


class PostgresReader(lat.FirstSeen):
    """``SELECT id, ts FROM relation WHERE id >= floor``, floor = the lowest id not seen yet
    (warm-up ids, negative, until one is seen)."""

    def __init__(self, dsn: str, relation: str, poll_s: float) -> None:
        super().__init__(poll_s)
        self.dsn, self.relation = dsn, relation
        self.floor = -(2 ** 62)
        self.conn: Any = None

    def poll(self) -> Iterable[tuple[int, float]]:
        import psycopg

        if self.conn is None:
            self.conn = psycopg.connect(self.dsn, autocommit=True)
        rows = self.conn.execute(f'SELECT id, ts FROM "{self.relation}" WHERE id >= %s',
                                 (self.floor,)).fetchall()
        new = [(int(i), float(ts)) for i, ts in rows if i not in self.first]
        got = {i for i, _ in new}
        if self.floor < 0 and any(i < 0 for i in got):
            self.floor = 0
        if self.floor >= 0:
            while self.floor in got or self.floor in self.first:
                self.floor += 1
        return new

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def read_parquet(path: str) -> list[tuple[int, float]]:
    t = pq.read_table(path, columns=["id", "ts"])
    return list(zip(t.column("id").to_pylist(), t.column("ts").to_pylist(), strict=True))


class EpochDirReader(lat.FirstSeen):
    """``exactly.files``: the Parquet files under ``epoch-*/`` (names starting with ``_`` or
    ``.`` skipped), each read once when first listed. Epoch directories are re-listed while
    among the 10 newest (at_least_once adds files to an epoch as its tasks end)."""

    def __init__(self, root: Path, poll_s: float) -> None:
        super().__init__(poll_s)
        self.root = root
        self.dirs: list[str] = []
        self.files: set[str] = set()

    def poll(self) -> Iterable[tuple[int, float]]:
        if not self.root.exists():
            return []
        names = sorted(e.name for e in os.scandir(self.root) if e.name.startswith("epoch-"))
        known = set(self.dirs)
        self.dirs.extend(n for n in names if n not in known)
        new = []
        for d in sorted((set(names) - known) | set(self.dirs[-10:])):
            for e in os.scandir(self.root / d):
                if not e.name.startswith(("_", ".")) and e.path not in self.files:
                    new.append(e.path)
        self.visible_at = time.time()
        rows = []
        for path in new:
            self.files.add(path)
            rows.extend(read_parquet(path))
        return rows


class SparkMetadataReader(lat.FirstSeen):
    """Spark's file sink: the files named in ``_spark_metadata`` (batch and compacted logs),
    each read once when first named."""

    def __init__(self, root: Path, poll_s: float) -> None:
        super().__init__(poll_s)
        self.meta = root / "_spark_metadata"
        self.logs: set[str] = set()
        self.files: set[str] = set()

    def poll(self) -> Iterable[tuple[int, float]]:
        if not self.meta.exists():
            return []
        new = []
        for e in os.scandir(self.meta):
            if e.name.startswith(".") or e.name.endswith(".tmp") or e.name in self.logs:
                continue
            lines = Path(e.path).read_text().splitlines()
            self.logs.add(e.name)
            for line in lines[1:]:  # the first line is the log's version ("v1")
                path = unquote(urlparse(json.loads(line)["path"]).path)
                if path not in self.files:
                    self.files.add(path)
                    new.append(path)
        self.visible_at = time.time()
        rows = []
        for path in new:
            rows.extend(read_parquet(path))
        return rows


class DeltaReader(lat.FirstSeen):
    """A ``deltalake.DeltaTable`` updated to the newest version at each poll; the data files
    it did not hold before are read."""

    def __init__(self, root: Path, poll_s: float) -> None:
        super().__init__(poll_s)
        self.root = root
        self.table: Any = None
        self.files: set[str] = set()

    def poll(self) -> Iterable[tuple[int, float]]:
        from deltalake import DeltaTable

        if self.table is None:
            if not (self.root / "_delta_log").exists():
                return []
            self.table = DeltaTable(str(self.root))
        else:
            self.table.update_incremental()
        new = [u for u in self.table.file_uris() if u not in self.files]
        self.visible_at = time.time()
        rows = []
        for uri in new:
            self.files.add(uri)
            rows.extend(read_parquet(unquote(urlparse(uri).path) if "://" in uri else uri))
        return rows


# -- targets ------------------------------------------------------------------------------
class Target:
    """One target: its variants (the reference last), how each starts and is read."""

    name = ""
    variants: tuple[str, ...] = ()
    reference = ""
    exact = ("exactly_once",)  # variants whose output must hold each id exactly once
    goal_under_1s = True

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def output(self, kind: str, tag: str) -> str:
        return f"{self.name}_{kind}_{tag}"

    def prepare(self, kind: str, out: str) -> None:
        """Create what the variant's writer expects to exist."""

    def frame(self, df: Any) -> Any:
        return df

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        raise NotImplementedError

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        raise NotImplementedError

    def final_ids(self, kind: str, out: str) -> list[int]:
        """Every id in the whole committed output, once per row."""
        return [i for i, _ in self.reader(kind, out).poll()]

    def exactly(self, kind: str, fmt: str, df: Any, ck: Path, options: dict[str, str],
                path: str | None = None) -> Any:
        mode = "at_least_once" if kind == "at_least_once" else "exactly_once"
        return start_query(df, sink_format=fmt, path=path, options={
            opt.CHECKPOINT_INTERVAL_MS: str(self.ctx.interval_ms), **options},
            checkpoint=CheckpointConfig(interval=f"{self.ctx.interval_ms}ms", mode=mode,
                                        storage=str(ck))).query

    def spark(self, writer: Any, ck: Path) -> Any:
        return (writer.option("checkpointLocation", str(ck))
                .trigger(processingTime=f"{self.ctx.interval_ms} milliseconds").start())


class KafkaTarget(Target):
    name = "kafka"
    variants = ("exactly_once", "at_least_once", "spark_kafka")
    reference = "spark_kafka"

    def output(self, kind: str, tag: str) -> str:
        return f"vis-out-{kind}-{tag}"

    def prepare(self, kind: str, out: str) -> None:
        from exactly.testing.kafka_broker import create_topic

        create_topic(self.ctx.bootstrap, out, lat.PARTITIONS)

    def frame(self, df: Any) -> Any:
        return df.selectExpr("cast(id as string) as key",
                             "to_json(named_struct('id', id, 'ts', ts)) as value")

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        client = {f"kafka.{k}": v for k, v in h.KAFKA_CLIENT.items()}
        if kind == "spark_kafka":
            return self.spark(df.writeStream.format("kafka")
                              .option("kafka.bootstrap.servers", self.ctx.bootstrap)
                              .option("topic", out).options(**client), ck)
        return self.exactly(kind, "exactly.kafka", df, ck, {
            opt.KAFKA_BOOTSTRAP: self.ctx.bootstrap, opt.TOPIC: out,
            opt.TRANSACTIONAL_ID_PREFIX: f"vis-{out}", **client})

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        return KafkaReader(self.ctx.bootstrap, out, self.ctx.poll_s)

    def final_ids(self, kind: str, out: str) -> list[int]:
        return [int(json.loads(v)["id"]) for _, _, _, v in consume_all(self.ctx.bootstrap, out)
                if v is not None]


class PostgresTarget(Target):
    name = "postgres"
    variants = ("exactly_once", "at_least_once", "wal", "upsert", "spark_jdbc")
    reference = "spark_jdbc"
    exact = ("exactly_once", "wal", "upsert")
    formats = {"exactly_once": "exactly.postgres", "at_least_once": "exactly.postgres",
               "wal": "exactly.wal", "upsert": "exactly.upsert"}

    def prepare(self, kind: str, out: str) -> None:
        if kind == "spark_jdbc":  # Spark would create it on its first batch
            with self.ctx.pg.connect() as conn:
                conn.execute(f'CREATE TABLE "{out}" (id bigint, ts double precision)')

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        if kind == "spark_jdbc":
            pg = self.ctx.pg
            url = f"jdbc:postgresql://127.0.0.1:{pg.port}/{pg.database}"
            props = {"user": pg.user, "password": pg.password, "driver": "org.postgresql.Driver"}

            def write(batch: Any, _epoch: int) -> None:
                batch.write.jdbc(url, out, mode="append", properties=props)

            return self.spark(df.writeStream.foreachBatch(write), ck)
        options = {"dsnEnv": DSN_ENV, "table": out}
        if self.formats[kind] == "exactly.postgres":
            options["partitions"] = str(lat.PARTITIONS)
        if kind == "upsert":
            options["keyColumns"] = "id"
        return self.exactly(kind, self.formats[kind], df, ck, options)

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        relation = f"{out}_committed" if kind == "exactly_once" else out
        return PostgresReader(self.ctx.pg.dsn, relation, self.ctx.poll_s)

    def final_ids(self, kind: str, out: str) -> list[int]:
        with self.ctx.pg.connect() as conn:
            return [int(r[0]) for r in conn.execute(f'SELECT id FROM "{out}"').fetchall()]


class FilesTarget(Target):
    name = "files"
    variants = ("exactly_once", "at_least_once", "spark_parquet")
    reference = "spark_parquet"

    def output(self, kind: str, tag: str) -> str:
        return str(self.ctx.workdir / f"out-files-{kind}-{tag}")

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        if kind == "spark_parquet":
            return self.spark(df.writeStream.format("parquet").option("path", out), ck)
        return self.exactly(kind, "exactly.files", df, ck, {"format": "parquet"}, path=out)

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        if kind == "spark_parquet":
            return SparkMetadataReader(Path(out), self.ctx.poll_s)
        return EpochDirReader(Path(out), self.ctx.poll_s)


class DeltaTarget(Target):
    name = "delta"
    variants = ("exactly_once", "at_least_once", "write_deltalake")
    reference = "write_deltalake"
    goal_under_1s = False

    def output(self, kind: str, tag: str) -> str:
        return str(self.ctx.workdir / f"out-delta-{kind}-{tag}")

    def start(self, kind: str, df: Any, out: str, ck: Path) -> Any:
        if kind == "write_deltalake":
            def write(batch: Any, _epoch: int) -> None:
                from deltalake import write_deltalake

                table = batch.toArrow()
                if table.num_rows:
                    write_deltalake(out, table, mode="append")

            return self.spark(df.writeStream.foreachBatch(write), ck)
        return self.exactly(kind, "exactly.delta", df, ck, {}, path=out)

    def reader(self, kind: str, out: str) -> lat.FirstSeen:
        return DeltaReader(Path(out), self.ctx.poll_s)

    def final_ids(self, kind: str, out: str) -> list[int]:
        from deltalake import DeltaTable

        return DeltaTable(out).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


TARGETS: dict[str, type[Target]] = {t.name: t for t in
                                    (KafkaTarget, PostgresTarget, FilesTarget, DeltaTarget)}


class Context:
    def __init__(self, spark: Any, bootstrap: str, pg: Any, workdir: Path, interval_ms: int,
                 poll_s: float) -> None:
        self.spark, self.bootstrap, self.pg, self.workdir = spark, bootstrap, pg, workdir
        self.interval_ms, self.poll_s = interval_ms, poll_s


# -- one run ------------------------------------------------------------------------------
def run(target: Target, kind: str, rate: int, seconds: float) -> dict[str, Any]:
    """One run of ``kind``: warm-up, ``seconds`` at ``rate``, every id seen, output checked."""
    from exactly.connectors.kafka.source import read_kafka

    ctx = target.ctx
    tag = uuid.uuid4().hex[:6]
    source = f"vis-in-{target.name}-{kind}-{tag}"
    lat.create_input(ctx.bootstrap, source)
    out = target.output(kind, tag)
    target.prepare(kind, out)
    df = read_kafka(ctx.spark, ctx.bootstrap, topics=source).selectExpr(
        "cast(cast(value as string) as long) as id", "cast(timestamp as double) as ts")
    ck = ctx.workdir / f"ck-{target.name}-{kind}-{tag}"
    query = target.start(kind, target.frame(df), out, ck)
    reader = target.reader(kind, out).start()
    producer = lat.RateProducer(ctx.bootstrap, source)  # the warm-up records
    steady = lat.ProducerProcess(ctx.bootstrap, source, rate, seconds)
    progress: dict[int, dict[str, Any]] = {}
    last_collect = [0.0]

    def alive() -> None:
        if query.exception() is not None:
            raise RuntimeError(f"{target.name} {kind}: {query.exception()}")
        if time.time() - last_collect[0] > 5:  # recentProgress holds the last 100 epochs
            for p in query.recentProgress:
                progress[int(p["batchId"])] = p
            last_collect[0] = time.time()

    try:
        deadline = time.time() + 300  # warm-up: two epochs with data committed and read
        while time.time() < deadline and not (
                sum(1 for p in query.recentProgress if p["numInputRows"]) >= 2
                and reader.seen_warm()):
            producer.warm()
            alive()
            time.sleep(ctx.interval_ms / 1000)
        if not reader.seen_warm():
            raise RuntimeError(f"{target.name} {kind}: warm-up data never became visible; "
                               f"reader errors {reader.errors[:3]}")
        first_batch = int(query.lastProgress["batchId"])
        steady.go()
        sent, achieved = steady.join(alive)
        lat.wait_for(lambda: reader.seen_all(sent), 120, alive=alive)
        time.sleep(3 * ctx.interval_ms / 1000)
        for p in query.recentProgress:
            progress[int(p["batchId"])] = p
        last_batch = max(progress) if progress else first_batch
    finally:
        steady.kill()
        reader.stop()
        query.stop()
    problem = ids_ok(target.final_ids(kind, out), sent, kind in target.exact,
                     f"{target.name} {kind}")
    if problem is None and not reader.seen_all(sent):
        problem = f"{target.name} {kind}: the reader saw {len(reader.first)} of {sent} ids"
    measured = [p for b, p in progress.items() if b > first_batch and p["numInputRows"]]
    phases = {k: statistics.median(float(p["durationMs"].get(k, 0)) for p in measured)
              for k in PHASES} if measured else {}
    stamps = [ts for i, ts in reader.stamp.items() if i >= 0]
    span = max(stamps) - min(stamps) if len(stamps) > 1 else 0.0
    # the rate the broker appended the measured records at (the producer's own pace may lag)
    appended = len(stamps) / span if span else float("nan")
    return {"sent": sent, "rate": appended, "produced_rate": achieved,
            "delays_ms": reader.delays_ms(sent),
            "epochs": last_batch - first_batch, "phases": phases,
            "exactly_parts": epoch_parts(ck, first_batch),
            "resolution_ms": reader.resolution_ms(), "failed_polls": reader.failed_polls,
            "error": problem, "checkpoint": str(ck)}


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(TARGETS), help="targets, comma-separated")
    ap.add_argument("--skip", default="", help="variants left out, comma-separated "
                    "(e.g. wal,upsert)")
    ap.add_argument("--rate", type=int, default=2000, help="input records/s")
    ap.add_argument("--interval-ms", type=int, default=200, help="the trigger")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--warmup-seconds", type=float, default=10.0,
                    help="length of the one warm-up run of each variant (0: none)")
    ap.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    ap.add_argument("--poll-ms", type=float, default=10.0, help="the readers' poll interval")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--jdbc-jar", default=None)
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}; choose from {','.join(TARGETS)}")

    from exactly.logs import configure
    from exactly.spark.session import spark_session
    from exactly.testing.pgcluster import TempPostgres

    configure()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-vis-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    epochs_expected = args.seconds * 1000 / args.interval_ms
    note = h.tail_note(epochs_expected, "trigger intervals", args.repeat)
    print(h.machine())
    print(f"input: {args.rate:,} records/s into 2 partitions (LogAppendTime) for "
          f"{args.seconds:.0f} s per run; trigger {args.interval_ms} ms; readers poll every "
          f"{args.poll_ms:.0f} ms; {args.repeat} repetitions in alternating order after a "
          f"{args.warmup_seconds:.0f} s warm-up run of each variant; local[2]. {note}",
          flush=True)
    runs: dict[str, list[h.Run]] = {}
    details: list[dict[str, Any]] = []
    failures: list[str] = []  # runs that ended in an exception (left out of the table)
    conf = h.jdbc_conf(args.jdbc_jar) if "postgres" in names else {}
    with broker_or_configured(workdir / "broker") as bootstrap, \
            TempPostgres(max_prepared_transactions=10) as pg:
        os.environ[DSN_ENV] = pg.dsn
        spark = spark_session(app_name="exactly-bench-visibility", kafka=True,
                              conf={**conf, "spark.ui.showConsoleProgress": "false"})
        ctx = Context(spark, bootstrap, pg, workdir, args.interval_ms, args.poll_ms / 1000)
        try:
            for name in names:
                target = TARGETS[name](ctx)
                skip = set(args.skip.split(","))
                variants = [v for v in target.variants
                            if v not in skip]
                if args.warmup_seconds > 0:
                    for kind in variants:
                        r = run(target, kind, args.rate, args.warmup_seconds)
                        print(f"warm-up {name} {kind}: p99 {h.fmt_ms(h.p99(r['delays_ms']))} "
                              f"ms  {h.load()}" + (f"  ERRORS {r['error']}" if r["error"]
                                                   else ""), flush=True)
                for rep, kind in h.schedule(variants, args.repeat):
                    try:
                        r = run(target, kind, args.rate, args.seconds)
                    except Exception as exc:  # one failed run does not end the benchmark
                        failures.append(f"rep {rep} {name} {kind}: {exc!r}")
                        print(f"rep {rep} {name:8} {kind:15} FAILED {exc!r}  {h.load()}",
                              flush=True)
                        continue
                    d = r["delays_ms"]
                    values = {"p50": h.p50(d) or float("nan"),
                              "p99": h.p99(d) or float("nan"), "epochs": r["epochs"],
                              "rate": r["rate"], "resolution_ms": r["resolution_ms"]}
                    runs.setdefault(name, []).append(
                        h.Run(rep, kind, values, [r["error"]] if r["error"] else []))
                    details.append({"target": name, "variant": kind, "rep": rep,
                                    **{k: v for k, v in r.items() if k != "delays_ms"}})
                    phases = " ".join(f"{k} {v:.0f}" for k, v in r["phases"].items())
                    if r["exactly_parts"]:
                        phases += "; exactly history median ms: " + " ".join(
                            f"{k} {v:.0f}" for k, v in r["exactly_parts"].items())
                    print(f"rep {rep} {name:8} {kind:15} p50 {values['p50']:6.0f} ms  p99 "
                          f"{values['p99']:6.0f} ms  max {max(d, default=float('nan')):6.0f}"
                          f" ms over {len(d):,} records (appended {r['rate']:.0f}/s), "
                          f"{r['epochs']} epochs; resolution {r['resolution_ms']:.1f} ms; "
                          f"Spark median ms: {phases}  {h.load()}"
                          + (f"  ERRORS {r['error']}" if r["error"] else ""), flush=True)
        finally:
            spark.stop()

    headlines = []
    print(f"\nvisibility latency: input append -> visible to a committed-only reader; "
          f"{args.rate:,} records/s, trigger {args.interval_ms} ms, {args.seconds:.0f} s per "
          f"run, median (range) over {args.repeat} repetitions. {note}")
    rows = []
    for name in names:
        target = TARGETS[name](ctx)
        trs = runs.get(name, [])
        for kind in target.variants:
            p99s = h.per_rep(trs, "p99", kind)
            if not p99s:
                continue
            ratio = (h.paired(trs, "p99", kind, target.reference)
                     if kind != target.reference else [])
            rows.append([f"{name} {kind}", h.spread(h.per_rep(trs, "p50", kind), ".0f"),
                         h.spread(p99s, ".0f"), h.spread(ratio) if ratio else "-",
                         h.spread(h.per_rep(trs, "epochs", kind), ".0f"),
                         h.spread(h.per_rep(trs, "resolution_ms", kind), ".1f")])
            if kind in ("exactly_once", target.reference):
                goal = "< 1000" if target.goal_under_1s else ""
                met = statistics.median(p99s) < 1000 if goal else None
                headlines.append(h.Headline("visibility", f"{name} {kind} p99 ms",
                                            h.spread(p99s, ".0f"), goal, met))
            if kind == "exactly_once" and ratio:
                headlines.append(h.Headline("visibility",
                                            f"{name} exactly_once p99 / {target.reference}",
                                            h.spread(ratio), "<= 1.2", h.at_most(ratio, 1.2)))
    print(h.table(["sink", "p50 ms", "p99 ms", "p99 / reference", "epochs", "resolution ms"],
                  rows))
    print(f"\n{h.machine()}")
    all_runs = [r for trs in runs.values() for r in trs]
    h.write_headlines(workdir, headlines, {"runs": [vars(r) for r in all_runs],
                                           "details": details, "failures": failures,
                                           "note": note})
    print(f"results: {workdir / 'headlines.json'}")
    errors = [e for r in all_runs for e in r.errors] + failures
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

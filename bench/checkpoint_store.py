"""What putting a job's checkpoint on S3 costs against the local disk: an epoch's commit
and the job's history.

What is measured
----------------
An S3-compatible server (S3Proxy, :class:`exactly.testing.s3_server.S3Server`, started by
this script on 127.0.0.1 with its data on the local disk) and one SparkSession
(``local[2]``, ``spark_session(s3a=True)``) serve both variants, which differ only in
``CheckpointConfig(storage=...)``:

``local``  ``WORKDIR/runs/<run>/ck``, a directory on the local disk
``s3``     ``s3a://bench/<run>/ck`` on the S3 server

**1. An epoch's commit.** One input of ``--epochs`` Parquet files (``--rows`` rows,
``bench/file_sink.py``'s generator) is read by Spark's file source one file an epoch
(``maxFilesPerTrigger=1``, ``availableNow``) into an exactly sink that writes to a local
directory in both variants (``--sink``):

``delta`` (default)  ``exactly.delta`` into a local table. Its commit log (intents,
                     completions, ``query.json``, the lease) is ``<checkpoint>/exactly-sink``,
                     so with an ``s3a://`` checkpoint the *whole* checkpoint is on S3: Spark's
                     offsets, commits and file-source log (S3A), exactly's commit log and
                     lease (boto3, conditional PUTs) and the job's history. What a job whose
                     checkpoint lives on S3 pays.
``files``            ``exactly.files`` into a local directory. Its commit log is
                     ``<output>/_exactly``, on the local disk in both variants: only Spark's
                     files and the history move to S3.

The job runs with the checkpoint's defaults, history included (recorded off the epoch
path by exactly's writer thread: on S3 one object per record, packed into segments).
Per epoch, from Spark's progress reports: ``triggerExecution`` (the epoch end to end),
``walCommit`` (Spark writes ``offsets/N``), ``commitOffsets`` (``commits/N``), ``addBatch``
(the sink's part, its commit included); and the sink's commit (step 2 of the protocol:
intent, publish, completion, lease checks, pruning of the log), ``commit_ms`` of the
committer's ``epoch_complete`` event. The sink keeps ``--retain-epochs`` epochs in its log
(default 20; the product's is 100): from the 21st epoch on every commit also prunes one
intent and one completion, the steady state of a long-running job. p50 and p99 per variant
over every measured epoch of every repetition (``--epochs`` >= 100 per run), and per
repetition pair (the two variants of one repetition) the ratio s3 / local of the run's p50
and p99 and the difference s3 - local of its p50: median and range. Also per run: the
seconds the history writer still needed after the query ended (its lag), and the S3 calls
per epoch: exactly's boto3 calls by thread (the commit, the history writer, the query's
start, lease heartbeats) and operation, and Hadoop's S3A operation counters.

**2. The history** on its own: ``--history-records`` epoch records (part 1's, read back
from a local run's history and renumbered) are appended one at a time to a fresh history
at each variant's checkpoint (``exactly.checkpoint.history.open_history``), then the whole
history is read back ``--history-reads`` times by a new reader each time, and as often
again by one reader (which keeps the objects it read).

Rules (:mod:`harness`): a warm-up run of each variant (``--warmup-rows`` in 20 epochs),
variants in alternating order, ``--repeat`` repetitions, every output checked by id (each
input id exactly once in the table, Spark's input row count, one sink commit per epoch,
each epoch once in the history, every appended record read back once), the load printed
with every run. No time is asserted; the exit status is 1 when a check fails.

Run from the repository root (about 9 minutes on 2 cores at a load of 5-10 with the
defaults)::

    .venv/bin/python bench/checkpoint_store.py [--rows 1000000] [--epochs 100] [--repeat 3]
        [--sink delta|files] [--history-records 200] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
from file_sink import read_stream, write_input

from exactly.checkpoint.history import open_history
from exactly.checkpoint.store import S3LogStore
from exactly.config import CheckpointConfig
from exactly.monitoring import recorder, records
from exactly.ops.query import start_query
from exactly.spark.session import spark_session
from exactly.testing.s3_server import S3Server, s3proxy_jars_dir

VARIANTS = ("local", "s3")
BUCKET = "bench"
WARMUP_EPOCHS = 20
HISTORY_WAIT_S = 300.0
SINKS = {"delta": "exactly.delta", "files": "exactly.files"}
#: per-epoch measures: key -> (label, Spark's durationMs key or None for the sink's commit)
MEASURES = {
    "epoch": ("epoch (triggerExecution)", "triggerExecution"),
    "offsets": ("Spark offsets log (walCommit)", "walCommit"),
    "commits": ("Spark commit log (commitOffsets)", "commitOffsets"),
    "add_batch": ("sink's epoch (addBatch)", "addBatch"),
    "sink_commit": ("sink's commit (commit_ms)", None),
}
#: the S3A settings printed (the client Spark's checkpoint goes through); secrets never
S3A_SHOWN = ("endpoint", "endpoint.region", "path.style.access", "connection.ssl.enabled",
             "connection.maximum", "threads.max", "attempts.maximum", "retry.limit",
             "connection.timeout", "fast.upload.buffer", "multipart.size",
             "change.detection.mode", "directory.marker.retention", "aws.credentials.provider")


# -- the sink's commit time, from the committer's events ------------------------------------
class CommitTimes(logging.Handler):
    """Keeps ``commit_ms`` of every ``epoch_complete`` event of ``exactly.committer`` (the
    commit runs in this process: foreachBatch), and passes WARNING and above on to stderr.
    The sink's log keeps only ``--retain-epochs`` completions, so it is read here."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.by_epoch: dict[int, float] = {}
        self.console = logging.StreamHandler(sys.stderr)
        self.console.setLevel(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.console.handle(record)
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return
        if event.get("event") == "epoch_complete" and "commit_ms" in event:
            self.by_epoch[int(event["epoch"])] = float(event["commit_ms"])

    def install(self) -> None:
        committer = logging.getLogger("exactly.committer")
        committer.setLevel(logging.INFO)
        committer.propagate = False  # its INFO events would reach exactly's console handler
        committer.addHandler(self)


# -- the S3 calls of a run --------------------------------------------------------------------
class S3Calls:
    """Counts what the job asks of S3: exactly's boto3 calls by thread and operation (a hook
    on boto3's default session, from which the checkpoint store's clients are made) and
    Hadoop's S3A operation counters (Spark's checkpoint; file-system operations such as a
    create or a rename, each one or more HTTP requests)."""

    S3A_OPS = ("readOps", "writeOps", "largeReadOps")

    def __init__(self, spark: Any) -> None:
        import boto3

        boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        boto3.DEFAULT_SESSION.events.register("before-call.s3", self._call)
        self._lock = threading.Lock()
        self._boto: Counter[str] = Counter()
        self._jvm = spark.sparkContext._jvm

    @staticmethod
    def _who() -> str:
        name = threading.current_thread().name
        if name == "exactly-history":
            return "history"
        if name.startswith("exactly-lease-"):
            return "lease heartbeat"
        if name == "MainThread":
            return "start and end"
        return "commit"  # foreachBatch runs in a callback thread of Py4J

    def _call(self, model: Any = None, **_: Any) -> None:
        key = f"{self._who()}: {model.name}"
        with self._lock:
            self._boto[key] += 1

    def snapshot(self) -> Counter[str]:
        with self._lock:
            counts = Counter({f"boto3 {k}": v for k, v in self._boto.items()})
        stats = self._jvm.org.apache.hadoop.fs.FileSystem.getGlobalStorageStatistics().get("s3a")
        if stats is not None:
            for op in self.S3A_OPS:
                counts[f"S3A {op}"] = int(stats.getLong(op) or 0)
        return counts


# -- part 1: one run ------------------------------------------------------------------------
@dataclass
class EpochRun:
    """One run of one variant: its per-epoch times (ms), the history writer's lag after the
    query ended (s), the S3 calls it made and what its checks found."""

    rep: int
    variant: str
    seconds: float
    epochs: int
    times: dict[str, list[float]]
    history_lag: float
    load: float
    calls: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def run(self) -> h.Run:
        values = {"seconds": self.seconds}
        for key, series in self.times.items():
            values[f"{key}_p50"] = h.p50(series) or 0.0
            values[f"{key}_p99"] = h.p99(series) or float("nan")
        return h.Run(self.rep, self.variant, values, self.errors)


def checkpoint_for(variant: str, run_dir: Path, tag: str) -> str:
    return str(run_dir / "ck") if variant == "local" else f"s3a://{BUCKET}/{tag}/ck"


def read_ids(sink: str, out: Path) -> Any:
    if sink == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(out)).to_pyarrow_table(columns=["id"])["id"].to_numpy()
    return ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"].to_numpy()


def epoch_ids(history: Sequence[dict[str, Any]]) -> list[int]:
    return [r["epoch"] for r in history if r.get("kind") == "epoch"]


def run_once(spark: Any, sink: str, variant: str, input_dir: Path, rows: int, epochs: int,
             run_dir: Path, tag: str, rep: int, retain: int, commits: CommitTimes,
             calls: S3Calls) -> EpochRun:
    """Run the job once over the whole input; measure, then check its output and its
    history by id."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    out = run_dir / "out"
    checkpoint = checkpoint_for(variant, run_dir, tag)
    commits.by_epoch.clear()
    errors: list[str] = []
    before = calls.snapshot()
    started = time.perf_counter()
    query = start_query(read_stream(spark, input_dir, 1), sink_format=SINKS[sink],
                        path=str(out), checkpoint=CheckpointConfig(storage=checkpoint),
                        options={"exactly.retainEpochs": str(retain)}, available_now=True).query
    try:
        query.awaitTermination()
    except Exception as exc:  # reported as a failed check; the other runs go on
        errors.append(f"query failed: {exc}")
    seconds = time.perf_counter() - started
    ended = time.perf_counter()
    if not (recorder.wait_ended(str(query.runId), HISTORY_WAIT_S)
            and recorder.flush(HISTORY_WAIT_S)):
        errors.append(f"the history writer did not finish within {HISTORY_WAIT_S:.0f} s")
    history_lag = time.perf_counter() - ended
    made = calls.snapshot()
    made.subtract(before)
    progress = [json.loads(p.json) for p in query.recentProgress]
    ran = [p for p in progress if records.ran(p)]
    times: dict[str, list[float]] = {}
    for key, (_, spark_key) in MEASURES.items():
        if spark_key is not None:
            times[key] = [float(p["durationMs"][spark_key]) for p in ran
                          if spark_key in p["durationMs"]]
    ids = sorted(int(p["batchId"]) for p in ran)
    times["sink_commit"] = [commits.by_epoch[e] for e in ids if e in commits.by_epoch]
    # -- checks -------------------------------------------------------------------------
    if len(ran) != epochs:
        errors.append(f"Spark ran {len(ran)} epochs, expected {epochs} (one per input file)")
    reported = sum(int(p["numInputRows"]) for p in ran)
    if reported != rows:
        errors.append(f"Spark reported {reported:,} input rows, expected {rows:,}")
    if len(times["sink_commit"]) != len(ran):
        errors.append(f"{len(times['sink_commit'])} sink commits recorded for {len(ran)} epochs")
    for what, check in (("output", lambda: h.check_ids(read_ids(sink, out), rows,
                                                        f"{variant} output")),
                        ("history", lambda: h.check_ids(
                            epoch_ids(open_history(checkpoint).read().records), epochs,
                            f"{variant} history's epochs"))):
        try:
            problem = check()
        except Exception as exc:  # an unreadable output is a failed check
            problem = f"{variant} {what} unreadable: {exc}"
        if problem:
            errors.append(problem)
    return EpochRun(rep, variant, seconds, len(ran), times, history_lag, os.getloadavg()[0],
                    {k: v for k, v in sorted(made.items()) if v}, errors)


def describe_run(result: EpochRun) -> str:
    parts = "  ".join(f"{key} {h.fmt_ms(h.p50(v))}/{h.fmt_ms(h.p99(v))}"
                      for key, v in result.times.items())
    return (f"rep {result.rep} {result.variant:5} {result.seconds:6.1f} s  "
            f"{result.epochs} epochs  p50/p99 ms: {parts}  history lag "
            f"{result.history_lag:.1f} s  load {result.load:.2f}"
            + (f"  ERRORS {result.errors}" if result.errors else ""))


# -- part 2: the history ---------------------------------------------------------------------
@dataclass
class HistoryRun:
    """One history run of one variant: per-append and per-read times (ms)."""

    rep: int
    variant: str
    append_ms: list[float]
    read_new_ms: list[float]
    read_same_ms: list[float]
    load: float
    errors: list[str] = field(default_factory=list)


def history_records(source: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` epoch records: ``source``'s in turn, renumbered 0 .. count-1."""
    return [{**source[n % len(source)], "epoch": n} for n in range(count)]


def history_once(variant: str, location: str, made: Sequence[dict[str, Any]], reads: int,
                 rep: int) -> HistoryRun:
    """Append ``made`` one record at a time to the history at ``location``, then read it
    back ``reads`` times with a new reader each time and ``reads`` times with one reader."""
    store = open_history(location)
    append_ms = []
    for record in made:
        started = time.perf_counter()
        store.append(record)
        append_ms.append((time.perf_counter() - started) * 1000)
    errors: list[str] = []

    def read(reader: Any, into: list[float]) -> None:
        started = time.perf_counter()
        found = reader.read().records
        into.append((time.perf_counter() - started) * 1000)
        problem = h.check_ids(epoch_ids(found), len(made), f"{variant} history read back")
        if problem:
            errors.append(problem)

    read_new: list[float] = []
    read_same: list[float] = []
    for _ in range(reads):
        read(open_history(location), read_new)
    reader = open_history(location)
    read(reader, [])  # its first read fills its cache
    for _ in range(reads):
        read(reader, read_same)
    return HistoryRun(rep, variant, append_ms, read_new, read_same, os.getloadavg()[0], errors)


# -- settings --------------------------------------------------------------------------------
def s3_settings(server: S3Server, spark: Any) -> list[str]:
    """The server's endpoint and the two clients' settings (no secrets)."""
    jars = sorted(p.name for p in s3proxy_jars_dir().glob("s3proxy-*.jar"))
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    s3a = {key: hadoop.get(f"fs.s3a.{key}") or "unset" for key in S3A_SHOWN}
    boto = S3LogStore(f"s3://{BUCKET}/x").client.meta.config
    return [
        f"S3 server: S3Proxy ({', '.join(jars)}), backend filesystem-nio2 on the local disk "
        f"({server.data_dir}), endpoint {server.endpoint}, region {server.region}, "
        "signature v4, plain http (AWS_ALLOW_HTTP=true), path-style addressing",
        "Spark's checkpoint through S3A (Hadoop fs.s3a.*): "
        + ", ".join(f"{k}={v}" for k, v in s3a.items()),
        "exactly's commit log, lease and history through boto3: "
        f"addressing_style={boto.s3.get('addressing_style')}, retries={boto.retries}, "
        f"max_pool_connections={boto.max_pool_connections}, "
        f"connect_timeout={boto.connect_timeout}, read_timeout={boto.read_timeout}",
        "same SparkSession, sink and settings in both variants; only "
        "CheckpointConfig(storage=...) differs",
    ]


# -- report ---------------------------------------------------------------------------------
def finite(values: Sequence[float]) -> list[float]:
    """``values`` without NaN (a run's p99 over fewer than 100 epochs)."""
    return [v for v in values if not math.isnan(v)]


def pooled(results: Sequence[EpochRun], variant: str, key: str) -> list[float]:
    return [v for r in results if r.variant == variant for v in r.times[key]]


def epoch_table(results: Sequence[EpochRun]) -> str:
    runs = [r.run() for r in results]
    rows = []
    for key, (label, _) in MEASURES.items():
        local, s3 = pooled(results, "local", key), pooled(results, "s3", key)
        rows.append([label, h.fmt_ms(h.p50(local)), h.fmt_ms(h.p99(local)),
                     h.fmt_ms(h.p50(s3)), h.fmt_ms(h.p99(s3)),
                     h.spread(h.paired(runs, f"{key}_p50", "s3", "local")),
                     h.spread(finite(h.paired(runs, f"{key}_p99", "s3", "local"))),
                     h.spread(h.per_rep(runs, f"{key}_p50", "s3", minus="local"), ".1f")])
    rows.append(["run (wall-clock s)", "", "", "", "",
                 h.spread(h.paired(runs, "seconds", "s3", "local")), "",
                 h.spread(h.per_rep(runs, "seconds", "s3", minus="local"), ".1f") + " s"])
    lag = {v: [r.history_lag for r in results if r.variant == v] for v in VARIANTS}
    rows.append(["history writer's lag at the end (s)", h.spread(lag["local"], ".1f"), "",
                 h.spread(lag["s3"], ".1f"), "", "", "", ""])
    return h.table(["per epoch, ms", "local p50", "local p99", "s3 p50", "s3 p99",
                    "s3/local p50", "s3/local p99", "s3-local p50 ms"], rows)


def calls_table(results: Sequence[EpochRun]) -> str:
    names = sorted({k for r in results for k in r.calls})
    rows = []
    for name in names:
        cells = []
        for variant in VARIANTS:
            per_epoch = [r.calls.get(name, 0) / r.epochs for r in results
                         if r.variant == variant and r.epochs]
            cells.append(h.spread(per_epoch, ".2f"))
        rows.append([name, *cells])
    return h.table(["S3 calls per epoch (start and end included)", *VARIANTS], rows)


def history_table(results: Sequence[HistoryRun], appends: int) -> str:
    def stats(run: HistoryRun) -> dict[str, float]:
        return {"append_p50": h.p50(run.append_ms) or 0.0,
                "append_mean": sum(run.append_ms) / max(1, len(run.append_ms)),
                "read_new": h.p50(run.read_new_ms) or 0.0,
                "read_same": h.p50(run.read_same_ms) or 0.0}

    runs = [h.Run(r.rep, r.variant, stats(r), r.errors) for r in results]
    appends_of = {v: [x for r in results if r.variant == v for x in r.append_ms]
                  for v in VARIANTS}
    rows = [["append one record: p50", *(h.fmt_ms(h.p50(appends_of[v])) for v in VARIANTS),
             h.spread(h.paired(runs, "append_p50", "s3", "local"))],
            ["append one record: p99", *(h.fmt_ms(h.p99(appends_of[v])) for v in VARIANTS),
             ""],
            ["append one record: mean (packing included)",
             *(h.fmt_ms(sum(a) / len(a) if a else None) for a in appends_of.values()),
             h.spread(h.paired(runs, "append_mean", "s3", "local"))]]
    for key, label in (("read_new", f"read all {appends} back, a new reader"),
                       ("read_same", f"read all {appends} again, the same reader")):
        rows.append([label, *(h.spread(h.per_rep(runs, key, v), ".1f") for v in VARIANTS),
                     h.spread(h.paired(runs, key, "s3", "local"))])
    return h.table(["history, ms", *VARIANTS, "s3/local per repetition"], rows)


def headlines(results: Sequence[EpochRun], history: Sequence[HistoryRun],
              sink: str) -> list[h.Headline]:
    runs = [r.run() for r in results]
    appends = {v: [x for r in history if r.variant == v for x in r.append_ms]
               for v in VARIANTS}
    return [
        h.Headline("checkpoint_store", f"epoch p50 s3 / local ({sink} sink)",
                   h.spread(h.paired(runs, "epoch_p50", "s3", "local"))),
        h.Headline("checkpoint_store", f"epoch p50 s3 - local, ms ({sink} sink)",
                   h.spread(h.per_rep(runs, "epoch_p50", "s3", minus="local"), ".0f")),
        h.Headline("checkpoint_store", "sink commit p50 s3 - local, ms",
                   h.spread(h.per_rep(runs, "sink_commit_p50", "s3", minus="local"), ".1f")),
        h.Headline("checkpoint_store", "history append p50 ms, local / s3",
                   f"{h.fmt_ms(h.p50(appends['local']))} / {h.fmt_ms(h.p50(appends['s3']))}"),
    ]


# -- main -----------------------------------------------------------------------------------
def start_server(work: Path) -> S3Server:
    """S3Proxy with this benchmark's bucket (:func:`harness.start_s3`)."""
    return h.start_s3(work, BUCKET)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=100,
                        help="epochs per run: one input file each (default 100)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup-rows", type=int, default=100_000,
                        help=f"rows of each variant's warm-up run, in {WARMUP_EPOCHS} epochs")
    parser.add_argument("--sink", choices=sorted(SINKS), default="delta")
    parser.add_argument("--retain-epochs", type=int, default=20,
                        help="epochs the sink's log keeps (exactly.retainEpochs, default 20)")
    parser.add_argument("--history-records", type=int, default=200,
                        help="records appended to each history (default 200)")
    parser.add_argument("--history-reads", type=int, default=5,
                        help="read-backs of each whole history, per kind of reader (5)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-ckstore-"))
    work.mkdir(parents=True, exist_ok=True)
    print(h.machine(), flush=True)
    print(f"load average before: {os.getloadavg()}", flush=True)
    note = h.sizes_note(args.rows, args.warmup_rows, args.repeat)
    if args.epochs < h.MIN_P99_VALUES or args.history_records < h.MIN_P99_VALUES:
        note = (note or "NOT A MEASUREMENT") + (
            f" ({args.epochs} epochs a run, {args.history_records} history records: "
            f"fewer than {h.MIN_P99_VALUES})")
    input_dir, warm_dir = work / "input", work / "warm-input"
    write_input(input_dir, args.rows, args.epochs)
    write_input(warm_dir, args.warmup_rows, WARMUP_EPOCHS)

    server = start_server(work)
    commits = CommitTimes()
    commits.install()
    results: list[EpochRun] = []
    history: list[HistoryRun] = []
    try:
        spark = spark_session(app_name="bench-checkpoint-store", s3a=True,
                              conf={"spark.sql.streaming.numRecentProgressUpdates": "100000",
                                    "spark.ui.showConsoleProgress": "false"})
        calls = S3Calls(spark)
        for line in s3_settings(server, spark):
            print(line, flush=True)
        print(f"job: {args.rows:,} rows in {args.epochs} epochs per run, sink "
              f"{SINKS[args.sink]} to a local directory, exactly.retainEpochs="
              f"{args.retain_epochs}, history on (the default), local[2]", flush=True)
        for variant in VARIANTS:  # warm-up: JVM, Python workers, S3A and boto3 clients
            warm = run_once(spark, args.sink, variant, warm_dir, args.warmup_rows,
                            WARMUP_EPOCHS, work / "runs" / f"warm-{variant}",
                            f"warm-{variant}", -1, args.retain_epochs, commits, calls)
            print("warm-up " + describe_run(warm), flush=True)
            if warm.errors:
                print(f"warm-up of {variant} failed: {warm.errors}", file=sys.stderr)
                return 1
        last_local = ""
        for rep, variant in h.schedule(VARIANTS, args.repeat):
            tag = f"rep{rep}-{variant}"
            result = run_once(spark, args.sink, variant, input_dir, args.rows, args.epochs,
                              work / "runs" / tag, tag, rep, args.retain_epochs, commits,
                              calls)
            results.append(result)
            print(describe_run(result), flush=True)
            shutil.rmtree(work / "runs" / tag / "out", ignore_errors=True)
            if variant == "local":
                last_local = checkpoint_for(variant, work / "runs" / tag, tag)
        spark.stop()

        shutil.rmtree(work / "history", ignore_errors=True)  # fresh local histories
        source = [r for r in open_history(last_local).read().records if r["kind"] == "epoch"]
        made = history_records(source, args.history_records)
        line_bytes = h.p50([len(json.dumps(r, separators=(",", ":"))) + 1 for r in made])
        for variant in VARIANTS:  # warm-up: the first file, connection, listing
            history_once(variant, checkpoint_for(variant, work / "history" / f"warm-{variant}",
                                                 f"history-warm-{variant}"), made[:70], 1, -1)
        for rep, variant in h.schedule(VARIANTS, args.repeat):
            tag = f"history-rep{rep}-{variant}"
            one = history_once(variant, checkpoint_for(variant, work / "history" / tag, tag),
                               made, args.history_reads, rep)
            history.append(one)
            print(f"history rep {rep} {variant:5} append p50/p99 "
                  f"{h.fmt_ms(h.p50(one.append_ms))}/{h.fmt_ms(h.p99(one.append_ms))} ms, "
                  f"read back (new reader) {h.fmt_ms(h.p50(one.read_new_ms))} ms, (same "
                  f"reader) {h.fmt_ms(h.p50(one.read_same_ms))} ms  load {one.load:.2f}"
                  + (f"  ERRORS {one.errors}" if one.errors else ""), flush=True)
    finally:
        server.close()

    print()
    print(f"1. An epoch's commit: {SINKS[args.sink]} sink, {args.rows:,} rows in "
          f"{args.epochs} epochs per run, {args.repeat} repetitions in alternating order; "
          "p50/p99 over every epoch of a variant, ratios and differences per repetition "
          "pair: median (range). " + note)
    print(epoch_table(results))
    print()
    print(calls_table(results))
    print()
    print(f"2. The history: {args.history_records} appends of one epoch record "
          f"({line_bytes:.0f} bytes) per repetition, then {args.history_reads} read-backs "
          "of the whole history by new readers and as many by one reader; appends: p50, "
          "p99 and mean over every append of a variant, read-backs: the repetitions' p50, "
          "median (range); ratios per repetition pair, median (range). Stores: "
          f"local {type(open_history(str(work))).__name__}, "
          f"s3 {type(open_history(f's3a://{BUCKET}/x')).__name__}")
    print(history_table(history, args.history_records))
    print(f"\nload average after: {os.getloadavg()}")
    print(h.machine())
    h.write_headlines(work, headlines(results, history, args.sink))
    (work / "results.json").write_text(json.dumps(
        {"epochs": [asdict(r) for r in results], "history": [asdict(r) for r in history]},
        indent=1))
    failed = [r for r in [*results, *history] if r.errors]
    for run in failed:
        print(f"FAILED CHECK: rep {run.rep} {run.variant}: {'; '.join(run.errors)}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

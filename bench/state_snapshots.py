"""State snapshots per epoch: commit time and checkpoint bytes written, by state size and
backend (the seeds' asynchronous and incremental checkpoints, on Spark).

What is measured
----------------
A keyed count (``exactly.datagen`` ids -> ``key = id % K`` -> ``groupBy(key).count()`` ->
``noop`` sink, 2 state partitions, ``local[2]``) first loads K keys (one epoch of K rows:
every key once), then runs ``--epochs`` epochs of ``--updates`` rows each, every row a key
already in the state (``--updates`` distinct keys change an epoch). For K in ``--sizes``
(100k, 1M, 10M keys) and each backend:

``hashmap``           Spark's HDFS-backed in-memory store: each epoch writes a delta file of
                      the changed keys; a maintenance thread folds deltas into snapshots
``rocksdb``           RocksDB, checkpoint per epoch = flush + the new SST files uploaded
                      beside a zip of the metadata (incremental in SST files)
``rocksdb_changelog`` RocksDB with changelog checkpointing: each epoch writes a changelog of
                      its changes; snapshots are uploaded by the maintenance thread, in the
                      background - the nearest Spark has to Flink's asynchronous snapshots

Per epoch: the state operator's ``commitTimeMs`` (Spark's progress; the synchronous part of
the checkpoint, inside the epoch), the epoch's ``triggerExecution``, and the bytes of state
files written during the epoch (files under ``CHECKPOINT/state`` whose mtime falls between
the previous epoch's commit-log entry and this one's: background snapshots and uploads,
which the maintenance thread runs every 5 s here (Spark's default: 60 s), count for the epoch
in which they land). Reported per (K, backend): the load epoch, then p50 and max over
the update epochs (and p99 when there are >= 100 of them), with ``--repeat`` repetitions in
alternating backend order; ratios per repetition pair against ``hashmap``. Each run is a
process of its own (``spark.driver.memory`` set for the state), started after nothing else;
the key count of the state is checked at the end (``numRowsTotal`` = K).

Run from the repository root::

    .venv/bin/python bench/state_snapshots.py [--sizes 100000,1000000,10000000]
        [--updates 10000] [--epochs 30] [--repeat 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

HERE = Path(__file__).resolve()
BACKENDS = ("hashmap", "rocksdb", "rocksdb_changelog")


def job(backend: str, keys: int, updates: int, epochs: int, work: str, result: str) -> None:
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query
    from exactly.spark.session import spark_session

    ck = Path(work) / "ck"
    config = CheckpointConfig(storage=str(ck),
                              state_backend="hashmap" if backend == "hashmap" else "rocksdb",
                              incremental=backend == "rocksdb_changelog")
    spark = spark_session(app_name=f"state-{backend}-{keys}", shuffle_partitions=2,
                          conf={"spark.driver.memory": "12g",
                                # snapshots (hashmap) and snapshot uploads (changelog) run in
                                # the maintenance thread: every 5 s, so a run sees several
                                "spark.sql.streaming.stateStore.maintenanceInterval": "5s",
                                "spark.ui.showConsoleProgress": "false",
                                "spark.sql.streaming.numRecentProgressUpdates": "1000"})
    total = keys + updates * epochs

    def stream(rows: int, max_rows: int):
        return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
                .option("totalRows", rows).option("maxRowsPerTrigger", max_rows)
                .option("numPartitions", 2).load()
                .selectExpr(f"id % {keys} as key").groupBy("key").count())

    # the load: one epoch of K rows; then the updates, one epoch of ``updates`` rows each
    # (the second query resumes from the checkpoint's offsets, at row K)
    phases = {}
    for phase, rows, max_rows in (("load", keys, keys), ("updates", total, updates)):
        query = start_query(stream(rows, max_rows), sink_format="noop", checkpoint=config,
                            output_mode="update", available_now=True).query
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"{backend} {keys}: {query.exception()}")
        phases[phase] = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
    commits = {int(p.name): p.stat().st_mtime for p in (ck / "commits").iterdir()
               if p.name.isdigit()}
    files = [(p.stat().st_mtime, p.stat().st_size) for p in (ck / "state").rglob("*")
             if p.is_file()]

    def written(batch: int) -> int:
        start, end = commits.get(batch - 1, 0.0), commits[batch]
        return sum(size for mtime, size in files if start < mtime <= end)

    def epoch(p: dict) -> dict:
        op = p["stateOperators"][0]
        return {"batch": p["batchId"], "commit_ms": float(op.get("commitTimeMs", 0)),
                "epoch_ms": float(p["durationMs"]["triggerExecution"]),
                "bytes": written(int(p["batchId"])), "rows_total": int(op["numRowsTotal"]),
                "memory": int(op.get("memoryUsedBytes", 0))}

    Path(result).write_text(json.dumps({phase: [epoch(p) for p in progress]
                                        for phase, progress in phases.items()}))
    spark.stop()


def run(backend: str, keys: int, args: argparse.Namespace, work: Path) -> h.Run:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = work / "result.json"
    proc = subprocess.run([sys.executable, str(HERE), "--job", backend, str(keys),
                           str(args.updates), str(args.epochs), str(work), str(result)],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not result.exists():
        return h.Run(0, backend, {}, [f"{backend} {keys}: exit {proc.returncode} "
                                      f"{proc.stderr[-1500:]}"])
    data = json.loads(result.read_text())
    up = data["updates"]
    errors = []
    if data["load"] and data["load"][-1]["rows_total"] != keys:
        errors.append(f"{backend} {keys}: the state holds {data['load'][-1]['rows_total']} "
                      f"keys after the load")
    if up and up[-1]["rows_total"] != keys:
        errors.append(f"{backend} {keys}: the state holds {up[-1]['rows_total']} keys at "
                      "the end")
    if len(up) != args.epochs:
        errors.append(f"{backend} {keys}: {len(up)} update epochs, expected {args.epochs}")
    load = data["load"][0] if data["load"] else {}
    commit = [e["commit_ms"] for e in up]
    written = [e["bytes"] for e in up]
    values = {"load_commit_ms": load.get("commit_ms", float("nan")),
              "load_bytes": load.get("bytes", float("nan")),
              "commit_p50": float(np.median(commit)) if commit else float("nan"),
              "commit_max": max(commit, default=float("nan")),
              "commit_p99": h.p99(commit) or float("nan"),
              "epoch_p50": float(np.median([e["epoch_ms"] for e in up])) if up else float("nan"),
              "bytes_p50": float(np.median(written)) if written else float("nan"),
              "bytes_max": max(written, default=float("nan")),
              "memory": up[-1]["memory"] if up else float("nan")}
    return h.Run(0, backend, values, errors)


def column(runs: list[h.Run], backend: str, key: str, fmt: str, scale: float) -> str:
    return h.spread([x * scale for x in h.per_rep(runs, key, backend)], fmt)


def mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--job":
        backend, keys, updates, epochs, work, result = argv[1:7]
        job(backend, int(keys), int(updates), int(epochs), work, result)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="100000,1000000,10000000")
    p.add_argument("--updates", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-state-"))
    work.mkdir(parents=True, exist_ok=True)
    print(h.machine())
    print(f"keyed count, 2 state partitions; per size: a load epoch of K rows, then "
          f"{args.epochs} epochs of {args.updates:,} updated keys; {args.repeat} repetitions, "
          "backends in alternating order; each run a fresh process. p99 needs >= 100 epochs "
          "(n/a below).", flush=True)
    all_runs: dict[int, list[h.Run]] = {}
    for keys in sizes:
        runs = all_runs[keys] = []
        for rep, backend in h.schedule(BACKENDS, args.repeat):
            started = time.monotonic()
            r = run(backend, keys, args, work / f"{keys}-{backend}-{rep}")
            r.rep = rep
            runs.append(r)
            v = r.values
            print(f"K={keys:,} rep {rep} {backend:18} "
                  + (f"load commit {v['load_commit_ms']:.0f} ms, {mib(v['load_bytes'])} MiB; "
                     f"update commit p50 {v['commit_p50']:.0f} max {v['commit_max']:.0f} ms, "
                     f"written p50 {mib(v['bytes_p50'])} MiB"
                     if v else "")
                  + f"  ({time.monotonic() - started:.0f} s, {h.load()})"
                  + (f"  ERRORS {r.errors}" if r.errors else ""), flush=True)
    rows = []
    headlines = []
    for keys, runs in all_runs.items():
        ok = [r for r in runs if not r.errors]
        for backend in BACKENDS:
            rows.append([f"{keys:,} {backend}",
                         *(column(ok, backend, key, fmt, scale) for key, fmt, scale in (
                             ("load_commit_ms", ".0f", 1.0), ("load_bytes", ".1f", 1 / 2**20),
                             ("commit_p50", ".0f", 1.0), ("commit_max", ".0f", 1.0),
                             ("bytes_p50", ".2f", 1 / 2**20), ("epoch_p50", ".0f", 1.0)))])
        for backend in BACKENDS[1:]:
            ratio = h.paired(ok, "commit_p50", backend, "hashmap")
            headlines.append(h.Headline("state_snapshots",
                                        f"{keys:,} keys: update commit p50 {backend} / hashmap",
                                        h.spread(ratio)))
    print()
    print(h.table(["K keys, backend", "load commit ms", "load MiB", "update commit p50 ms",
                   "update commit max ms", "update MiB p50", "epoch p50 ms"], rows))
    print(f"\n{h.machine()}")
    h.write_headlines(work, headlines,
                      {"runs": {k: [vars(r) for r in v] for k, v in all_runs.items()}})
    errors = [e for runs in all_runs.values() for r in runs for e in r.errors]
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost of a Spark Connect session against a classic one: the same job, side by side.

What is measured
----------------
One job, ``exactly.datagen`` -> ``exactly.files`` through :func:`exactly.ops.query.start_query`
(the commit in ``foreachBatch``), on two kinds of session whose driver is ``local[2]`` on this
machine:

``classic``  :func:`exactly.spark.session.spark_session` in the benchmark's process (Py4J to
             its own driver JVM; the commit runs in this process)
``connect``  a Spark Connect server (:class:`exactly.testing.connect_server.ConnectServer`,
             ``local[2]``) and ``spark_session(remote=...)`` (gRPC to the server; the commit
             runs in the Python process the server starts for ``foreachBatch``)

Equal settings: the server is started with the ``--conf`` :func:`~exactly.spark.session.
session_conf` gives a classic ``local[2]`` driver (2 shuffle partitions, adaptive execution
off, Arrow on, Python worker reuse and exactly's worker daemon, driver on 127.0.0.1, no UI,
exactly's state writer jar) plus the benchmark's own settings, which the classic session gets
too; the sink gets the same options on both (``exactly.retainEpochs`` raised so that every
epoch's completion record stays readable). Neither driver JVM loads exactly's class archive
(``EXACTLY_CLASS_ARCHIVE=off``: the archive is made for the classic driver only; see
``bench/driver_start.py`` for what it saves a classic start).

A Python process cannot hold both kinds of session, so each run is a child process of its
own (a fresh driver JVM, or a fresh server, every run): one untimed warm-up pair (smaller
sizes), then ``--repeat`` pairs in alternating order (:func:`harness.schedule`). In each run,
in this order:

1. **session start** (one-off): seconds until a usable session -- for ``classic``
   ``spark_session()`` (its JVM included); for ``connect`` the server's start (``spark-submit``
   until it listens) plus the client's session, each printed too.
2. **first epoch** (one-off): the session's first query, ``--warmup-rows`` rows in one epoch
   (``availableNow``): seconds from ``start_query`` to its end, and that epoch's
   ``triggerExecution``. It is also the run's warm-up (JIT, Python workers) and is checked by id.
3. **throughput at saturation**: ``--rows`` rows in epochs of ``--rows-per-epoch``
   (``availableNow``), rows/s from ``start_query`` to the end; checked by id.
4. **per-epoch cost**: ``--rate`` rows/s at a ``--trigger-ms`` trigger until ``--epochs``
   epochs past ``--skip`` start-up epochs are committed, then stopped. Per epoch: Spark's
   ``triggerExecution`` and ``addBatch`` (query progress, read by the client) and the steps
   exactly's committer records in each completion record (``steps_ms`` and ``commit_ms`` of
   ``OUT/_exactly/complete/*.json``: what the ``foreachBatch`` commit spent, wherever it ran).
   The output is checked by id (``0 .. n-1`` once each).

Reported: per variant the median and range over the runs (p50 = the median of the runs'
medians; p99 over all epochs of all runs, and only with >= 100 epochs a run), and per
repetition pair the ratio ``connect / classic`` (median and range). The load is printed with
every run. A run with a wrong output exits with status 1.

Run from the repository root (about 10 minutes on 2 cores)::

    PYTHONPATH=src .venv/bin/python bench/connect_cost.py [--repeat 3] [--epochs 100]
        [--rows 1000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

VARIANTS = ("classic", "connect")
#: the benchmark's own settings, the same on both sides
BENCH_CONF = {"spark.sql.streaming.numRecentProgressUpdates": "100000",
              "spark.ui.showConsoleProgress": "false"}
#: every epoch's completion record kept (the default keeps the newest 100)
SINK_OPTIONS = {"exactly.retainEpochs": "100000"}


# -- the child: one run of one variant -----------------------------------------------------

def server_conf() -> dict[str, str]:
    """What a classic ``local[2]`` session of :func:`spark_session` is given, for the server."""
    from exactly.spark.session import session_conf
    from exactly.spark.state_writer_jar import ensure_jar

    conf = {**session_conf("local[2]"), **BENCH_CONF}
    jar = ensure_jar()
    if jar is not None:
        conf["spark.jars"] = str(jar)
    return conf


def progress_of(query: Any) -> list[dict[str, Any]]:
    """The query's progress records as dicts (a classic and a Connect query alike)."""
    out = []
    for p in query.recentProgress:
        text = getattr(p, "json", None)
        out.append(json.loads(text) if isinstance(text, str) else dict(p))
    return out


def last_commit(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    numbers = [int(n) for n in os.listdir(commits) if n.isdigit()] if commits.is_dir() else []
    return max(numbers, default=-1)


def output_ids(out: Path) -> Any:
    import pyarrow.dataset as ds

    return ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"].to_numpy()


def completions(out: Path) -> dict[int, dict[str, Any]]:
    """The completion records of the sink's commit log, by epoch."""
    found = {}
    for path in (out / "_exactly" / "complete").glob("*.json"):
        data = json.loads(path.read_text())
        epoch = data.get("epoch")
        if epoch is None:
            digits = "".join(c for c in path.stem if c.isdigit())
            epoch = int(digits) if digits else -1
        found[int(epoch)] = data
    return found


#: Spark's error when a new Python worker (Connect's foreachBatch runner) does not connect
#: back within its fixed 10 s (PythonWorkerFactory.PROCESS_WAIT_TIMEOUT_MS): a loaded machine
START_TIMEOUT = "connect back"
START_ATTEMPTS = 4


def start_retried(start: Any, base: Path) -> tuple[Any, Path, int]:
    """``start(directory)`` -> a query, retried (in a fresh directory) while it fails with
    :data:`START_TIMEOUT`; returns the query, its directory and the failed starts."""
    for failed in range(START_ATTEMPTS):
        where = base if failed == 0 else base.with_name(f"{base.name}-retry{failed}")
        try:
            return start(where), where, failed
        except Exception as exc:  # a Connect SparkConnectGrpcException / classic Py4J error
            if START_TIMEOUT not in str(exc) or failed == START_ATTEMPTS - 1:
                raise
            print(f"start failed ({START_TIMEOUT}): starting again", file=sys.stderr,
                  flush=True)
    raise AssertionError("unreachable")


def bounded_job(spark: Any, run_dir: Path, name: str, rows: int,
                per_epoch: int | None) -> dict[str, Any]:
    """``rows`` rows (``per_epoch`` a trigger at most) ``availableNow`` into exactly.files."""
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query

    reader = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", rows).option("numPartitions", 2))
    if per_epoch:
        reader = reader.option("maxRowsPerTrigger", per_epoch)
    started = time.perf_counter()
    watched, where, failed_starts = start_retried(
        lambda d: start_query(reader.load(), sink_format="exactly.files", path=str(d / "out"),
                              checkpoint=CheckpointConfig(storage=str(d / "ck")),
                              available_now=True, options=dict(SINK_OPTIONS)),
        run_dir / name)
    out = where / "out"
    watched.await_termination()
    seconds = time.perf_counter() - started
    progress = [p for p in progress_of(watched.query)
                if "addBatch" in (p.get("durationMs") or {})]
    errors = []
    problem = h.check_ids(output_ids(out), rows, f"{name} output")
    if problem:
        errors.append(problem)
    first = progress[0]["durationMs"] if progress else {}
    return {"seconds": seconds, "epochs": len(progress), "errors": errors,
            "failed_starts": failed_starts,
            "first_trigger_ms": first.get("triggerExecution"),
            "first_add_batch_ms": first.get("addBatch")}


def steady_job(spark: Any, run_dir: Path, args: argparse.Namespace,
               epochs: int) -> dict[str, Any]:
    """``args.rate`` rows/s at ``args.trigger_ms`` until ``epochs`` epochs past the skipped
    ones are committed; per epoch Spark's durations and the committer's steps."""
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query

    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", args.rate)
          .option("numPartitions", 2).load())
    watched, where, failed_starts = start_retried(
        lambda d: start_query(df, sink_format="exactly.files", path=str(d / "out"),
                              checkpoint=CheckpointConfig(storage=str(d / "ck"),
                                                          interval=args.trigger_ms / 1000),
                              options=dict(SINK_OPTIONS)),
        run_dir / "steady")
    ck, out = where / "ck", where / "out"
    want = epochs + args.skip
    deadline = time.monotonic() + 120 + want * 5
    while last_commit(ck) + 1 < want and watched.query.isActive \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    watched.stop()
    errors = []
    if watched.query.exception() is not None:
        errors.append(f"steady query failed: {watched.query.exception()}")
    progress = {int(p["batchId"]): p["durationMs"] for p in progress_of(watched.query)
                if "addBatch" in (p.get("durationMs") or {})}
    done = completions(out)
    kept = [e for e in sorted(progress) if e >= args.skip]
    series: dict[str, list[float]] = {"trigger": [], "add_batch": [], "commit": []}
    for epoch in kept:
        series["trigger"].append(float(progress[epoch]["triggerExecution"]))
        series["add_batch"].append(float(progress[epoch]["addBatch"]))
        record = done.get(epoch)
        if record is None:
            continue
        if record.get("commit_ms") is not None:
            series["commit"].append(float(record["commit_ms"]))
        for step, ms in (record.get("steps_ms") or {}).items():
            series.setdefault(f"step_{step}", []).append(float(ms))
    ids = output_ids(out)
    recorded = sum(int(r.get("rows") or 0) for r in done.values())
    if len(ids) != recorded:
        errors.append(f"steady output: {len(ids):,} rows, completion records say {recorded:,}")
    problem = h.check_ids(ids, len(ids), "steady output")
    if problem:
        errors.append(problem)
    return {"epochs": len(kept), "rows": len(ids), "series": series, "errors": errors,
            "failed_starts": failed_starts}


def child(args: argparse.Namespace) -> int:
    """One run of ``args.child`` in this process; its result as JSON to ``args.result``."""
    from exactly.spark.session import spark_session

    run_dir = Path(args.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    result: dict[str, Any] = {"variant": args.child}
    server = None
    try:
        started = time.perf_counter()
        if args.child == "connect":
            from exactly.testing.connect_server import ConnectServer

            server = ConnectServer(run_dir / "server", conf=server_conf())
            server.start()
            result["server_start_s"] = time.perf_counter() - started
            opened = time.perf_counter()
            spark = spark_session(remote=server.url, app_name="exactly-bench-connect-cost",
                                  conf=dict(BENCH_CONF))
            result["client_session_s"] = time.perf_counter() - opened
        else:
            spark = spark_session(master="local[2]", app_name="exactly-bench-connect-cost",
                                  conf=dict(BENCH_CONF))
        result["session_s"] = time.perf_counter() - started
        first = bounded_job(spark, run_dir, "first", args.warmup_rows, None)
        result["first"] = first
        bulk = bounded_job(spark, run_dir, "bulk", args.rows, args.rows_per_epoch)
        result["bulk"] = bulk
        steady = steady_job(spark, run_dir, args, args.epochs)
        result["steady"] = steady
        result["errors"] = first["errors"] + bulk["errors"] + steady["errors"]
        spark.stop()
    finally:
        if server is not None:
            server.stop()
    Path(args.result).write_text(json.dumps(result))
    if not args.keep:
        for entry in run_dir.iterdir():
            if entry.name != "server":
                shutil.rmtree(entry, ignore_errors=True)
    return 0


# -- the parent: the schedule, the table ----------------------------------------------------

def run_child(variant: str, args: argparse.Namespace, work: Path, name: str,
              sizes: dict[str, int]) -> dict[str, Any] | None:
    """One run in a child process; retried once when it fails (e.g. Spark's fixed 10 s for
    a new Python worker to connect back, which a loaded machine can miss); None when the
    retry fails too."""
    env = {**os.environ, "EXACTLY_CLASS_ARCHIVE": "off", "PYSPARK_PYTHON": sys.executable}
    for key in ("SPARK_REMOTE", "EXACTLY_DRIVER_JAVA_OPTIONS", "EXACTLY_SPARK_MASTER"):
        env.pop(key, None)
    result_path = work / f"{name}.json"
    result_path.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--child", variant, "--run-dir", str(work / name),
            "--result", str(result_path), "--rate", str(args.rate),
            "--trigger-ms", str(args.trigger_ms), "--skip", str(args.skip),
            *[a for k, v in sizes.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    if args.keep:
        argv.append("--keep")
    for attempt in (1, 2):
        log_path = work / f"{name}.log" if attempt == 1 else work / f"{name}.retry.log"
        with open(log_path, "w") as log:
            code = subprocess.call(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   timeout=1800)
        if code == 0 and result_path.exists():
            result = json.loads(result_path.read_text())
            result["attempts"] = attempt
            return result
        text = log_path.read_text(errors="replace")
        cause = next((line.strip() for line in reversed(text.splitlines())
                      if "Exception" in line or "Error" in line), f"exit status {code}")
        print(f"{name}: attempt {attempt} failed ({cause[:200]}); log {log_path}", flush=True)
    return None


def run_values(result: dict[str, Any], rows: int) -> dict[str, float]:
    """The scalars of one run, for :func:`harness.paired`."""
    values = {"session_s": result["session_s"],
              "first_s": result["first"]["seconds"],
              "first_trigger_ms": float(result["first"]["first_trigger_ms"] or "nan"),
              "rows_per_s": rows / result["bulk"]["seconds"],
              "k_rows_per_s": rows / result["bulk"]["seconds"] / 1000}
    for key, series in result["steady"]["series"].items():
        if series:
            values[f"{key}_p50"] = float(np.median(series))
            tail = h.p99(series)
            if tail is not None:
                values[f"{key}_p99"] = tail
    return values


def row(runs: list[h.Run], label: str, key: str, fmt: str = ".1f",
        all_series: dict[str, list[float]] | None = None) -> list[str]:
    """One table line: per variant the median (range) over runs, then connect/classic."""
    cells = [label]
    for variant in VARIANTS:
        values = [r.values[key] for r in runs if r.variant == variant and key in r.values]
        if all_series is not None:  # a p99 over every epoch of every run
            tail = h.p99(all_series.get(variant, []))
            cells.append(f"{h.fmt_ms(tail)} (runs {h.spread(values, fmt)})" if values
                         else "n/a")
        else:
            cells.append(h.spread(values, fmt))
    usable = [r for r in runs if key in r.values]
    cells.append(h.spread(h.paired(usable, key, "connect", "classic")))
    return cells


def report(raw: list[dict[str, Any]], args: argparse.Namespace, work: Path,
           note: str) -> None:
    """The table of the runs in ``raw`` (the results.json of a run) and the headlines."""
    runs: list[h.Run] = []
    series: dict[str, dict[str, list[float]]] = {}
    for result in raw:
        runs.append(h.Run(result["rep"], result["variant"], run_values(result, args.rows),
                          result["errors"]))
        for key, vals in result["steady"]["series"].items():
            series.setdefault(key, {}).setdefault(result["variant"], []).extend(vals)
    reps = len({r.rep for r in runs})
    rows = [row(runs, "session start (s)", "session_s", ".2f"),
            row(runs, f"first epoch, {args.warmup_rows:,} rows: start_query to end (s)",
                "first_s", ".2f"),
            row(runs, "first epoch: triggerExecution (ms)", "first_trigger_ms", ".0f"),
            row(runs, f"throughput, {args.rows:,} rows (k rows/s)", "k_rows_per_s", ".0f")]
    connect_runs = [r for r in raw if r["variant"] == "connect"]
    server_s = [r["server_start_s"] for r in connect_runs]
    client_s = [r["client_session_s"] for r in connect_runs]
    rows.insert(1, ["  of it: Connect server start / client session (s)", "-",
                    f"{h.spread(server_s)} / {h.spread(client_s)}", "-"])
    # the committer's steps in the protocol's order (its records list them sorted by name)
    order = ("begin", "input", "lookup", "lease", "intent", "handles", "publish")
    steps = sorted((k for k in series if k.startswith("step_")), key=lambda k: (
        order.index(k[5:]) if k[5:] in order else len(order), k))
    names = ["trigger", "add_batch", "commit", *steps]
    labels = {"trigger": "epoch: triggerExecution", "add_batch": "epoch: addBatch",
              "commit": "epoch: sink commit (commit_ms)"}
    for key in names:
        label = labels.get(key, f"  commit step {key.removeprefix('step_')}")
        rows.append(row(runs, f"{label} p50 (ms)", f"{key}_p50"))
        rows.append(row(runs, f"{label} p99 (ms)", f"{key}_p99", all_series=series[key]))
    print(f"\nSpark Connect against a classic session, same job, same settings, local[2]. "
          f"Per variant: median (range) over {reps} runs; p50 = median of the runs' "
          f"medians, p99 over all epochs of all runs (runs: each run's p99). Ratio per "
          f"repetition pair. {note}")
    print(h.table(["measure", "classic", "connect", "connect / classic per pair"], rows))
    print(f"\n{h.machine()}")
    headlines = []
    for key, measure in (("trigger_p50", "epoch p50 (triggerExecution)"),
                         ("add_batch_p50", "addBatch p50"),
                         ("commit_p50", "sink commit p50"),
                         ("rows_per_s", f"throughput, {args.rows:,} rows"),
                         ("session_s", "session start"), ("first_s", "first epoch")):
        headlines.append(h.Headline("connect_cost", f"Connect / classic: {measure}",
                                    h.spread(h.paired(runs, key, "connect", "classic")),
                                    "", None))
    h.write_headlines(work, headlines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--epochs", type=int, default=100, help="epochs measured per run")
    p.add_argument("--skip", type=int, default=5, help="start-up epochs not measured")
    p.add_argument("--rate", type=int, default=2000, help="input rows/s of the epoch runs")
    p.add_argument("--trigger-ms", type=int, default=200)
    p.add_argument("--rows", type=int, default=h.MIN_ROWS, help="rows of the throughput run")
    p.add_argument("--rows-per-epoch", type=int, default=100_000)
    p.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS,
                   help="rows of each run's first epoch (its warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up pair")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep every run's output")
    p.add_argument("--report", type=Path, default=None,
                   help="print the table of a results.json again (give the run's sizes)")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.report:
        raw = json.loads(args.report.read_text())
        reps = len({r["rep"] for r in raw})
        epochs = min((r["steady"]["epochs"] for r in raw), default=0)
        note = " ".join(n for n in (h.sizes_note(args.rows, args.warmup_rows, reps),
                                    h.tail_note(epochs, "epochs", reps)) if n)
        report(raw, args, args.report.parent, note)
        return 1 if any(r["errors"] for r in raw) else 0
    # a TERM ends the children too (subprocess.call's wait is interrupted by SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-connect-"))
    work.mkdir(parents=True, exist_ok=True)
    note = " ".join(n for n in (h.sizes_note(args.rows, args.warmup_rows, args.repeat),
                                h.tail_note(args.epochs, "epochs", args.repeat)) if n)
    print(h.machine())
    print(f"exactly.datagen -> exactly.files via start_query, local[2] driver; each run a new "
          f"process (new JVM / new Connect server). Per run: session start, first epoch "
          f"({args.warmup_rows:,} rows), throughput ({args.rows:,} rows in epochs of "
          f"{args.rows_per_epoch:,}), {args.epochs} epochs after {args.skip} at "
          f"{args.rate:,} rows/s and a {args.trigger_ms} ms trigger. {args.repeat} pairs in "
          f"alternating order after {'no' if args.no_warmup else 'one'} warm-up pair. {note}",
          flush=True)
    sizes = {"epochs": args.epochs, "rows": args.rows, "rows_per_epoch": args.rows_per_epoch,
             "warmup_rows": args.warmup_rows}
    if not args.no_warmup:
        small = {**sizes, "epochs": min(args.epochs, 20),
                 "rows": min(args.rows, 2 * args.rows_per_epoch)}
        for variant in VARIANTS:
            result = run_child(variant, args, work, f"warm_{variant}", small)
            if result is not None:
                print(f"warm-up {variant:8} session {result['session_s']:.1f} s  {h.load()}",
                      flush=True)
    raw: list[dict[str, Any]] = []
    failed = False
    for rep, variant in h.schedule(VARIANTS, args.repeat):
        result = run_child(variant, args, work, f"run_{variant}_{rep}", sizes)
        if result is None:
            print(f"rep {rep} {variant:8} FAILED twice: left out (its pair has no ratio)  "
                  f"{h.load()}", flush=True)
            failed = True
            continue
        result["rep"] = rep
        raw.append(result)
        values = run_values(result, args.rows)
        extra = (f" (server {result['server_start_s']:.1f} + client "
                 f"{result['client_session_s']:.1f})" if variant == "connect" else "")
        print(f"rep {rep} {variant:8} session {values['session_s']:.1f} s{extra}  first epoch "
              f"{values['first_s']:.1f} s  {values['rows_per_s'] / 1000:.0f} k rows/s  "
              f"epoch p50 {h.fmt_ms(values.get('trigger_p50'))} ms over "
              f"{result['steady']['epochs']} epochs  {h.load()}"
              + (f"  (attempt {result['attempts']})" if result["attempts"] > 1 else "")
              + (f"  failed query starts {starts}" if (starts := sum(
                  result[j]["failed_starts"] for j in ("first", "bulk", "steady"))) else "")
              + (f"  ERRORS {result['errors']}" if result["errors"] else ""), flush=True)
        failed |= bool(result["errors"])
        (work / "results.json").write_text(json.dumps(raw, indent=1))
    report(raw, args, work, note)
    print(f"results: {work / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The reference pipeline: 5 M events -> filter -> exactly-once files, on 2 cores, against
Spark's own Parquet sink and (optionally) PyFlink.

The job
-------
``--events`` events ``(id bigint, key string of --keys distinct values, value bigint)``,
written once as Parquet files of 250k rows (and, for PyFlink, as CSV files with the same
rows). The job keeps the events with ``value % 10 != 0`` (90 %) and writes them
exactly-once, with a checkpoint (an epoch) every second: a processing-time trigger of 1 s
and at most ``--files-per-epoch`` input files an epoch (500k events, about what one second
of this job processes here), so the job runs ~10 checkpoints.

``exactly_files``     Spark, SQL filter, ``exactly.files`` sink (exactly_once, Parquet)
``spark_parquet``     Spark, SQL filter, Spark's Parquet file sink (``_spark_metadata``)
``spark_parquet_udf`` Spark, the filter as a Python UDF, Spark's Parquet file sink
``pyflink_sql``       PyFlink SQL (no Python in the data path): filesystem CSV source ->
                      WHERE -> filesystem sink (exactly-once: files commit on checkpoints),
                      checkpoints every 1 s; only with ``--pyflink VENV``
``pyflink_udf``       the same with the filter as a PyFlink Table API Python UDF

**Job time** is measured the same way on every side: from the start of the job's process
(``python job.py``, so the JVM, Spark's or Flink's mini cluster, and every start-up are
included) to the moment its output is complete and committed, as the process reports it
at exit; each variant runs in a process of its own. Every output is read back and checked
by id: exactly the ids whose value passes the filter, each once.

Ratios per repetition pair (median and range): ``exactly_files / spark_parquet`` (goal
>= 0.9, in speed: time of Spark's sink / time of ours) and ``exactly_files / pyflink_udf``
(goal >= 2.5). The first epoch's time of ``exactly_files`` and ``spark_parquet`` is printed
beside (Spark's progress of epoch 0: ``triggerExecution``).

PyFlink lives in its own virtualenv (``python -m venv V && V/bin/pip install apache-flink``);
it is never a dependency of exactly or of its tests.

Run from the repository root::

    .venv/bin/python bench/reference.py [--events 5000000] [--repeat 3]
        [--pyflink /path/to/venv] [--workdir DIR]
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
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

HERE = Path(__file__).resolve()
FILE_ROWS = 250_000
SPARK_VARIANTS = ("exactly_files", "spark_parquet", "spark_parquet_udf")
FLINK_VARIANTS = ("pyflink_sql", "pyflink_udf")


# -- input ---------------------------------------------------------------------------------
def events(start: int, end: int, keys: int) -> pa.Table:
    ids = np.arange(start, end, dtype=np.int64)
    values = (ids * 2654435761) % 1_000_003
    names = np.array([f"k{i:05d}" for i in range(keys)], dtype=object)
    return pa.table({"id": ids, "key": pa.array(names[ids % keys], pa.string()),
                     "value": values})


def write_input(work: Path, total: int, keys: int, csv: bool) -> tuple[Path, Path]:
    parquet_dir, csv_dir = work / "input-parquet", work / "input-csv"
    marker = work / "input.json"
    params = {"events": total, "keys": keys, "file_rows": FILE_ROWS, "csv": csv}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return parquet_dir, csv_dir
    for d in (parquet_dir, csv_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for n, start in enumerate(range(0, total, FILE_ROWS)):
        table = events(start, min(start + FILE_ROWS, total), keys)
        pq.write_table(table, parquet_dir / f"part-{n:05d}.parquet")
        if csv:
            pacsv.write_csv(table, csv_dir / f"part-{n:05d}.csv",
                            pacsv.WriteOptions(include_header=False, quoting_style="none"))
    marker.write_text(json.dumps(params))
    return parquet_dir, csv_dir


def expected_ids(total: int) -> np.ndarray:
    ids = np.arange(total, dtype=np.int64)
    return ids[((ids * 2654435761) % 1_000_003) % 10 != 0]


# -- the Spark job (run as: reference.py --spark-job VARIANT INPUT OUT CK RESULT) ----------
def spark_job(variant: str, input_dir: str, out: str, ck: str, result: str,
              total: int, files_per_epoch: int) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query
    from exactly.spark.session import spark_session

    schema = StructType([StructField("id", LongType()), StructField("key", StringType()),
                         StructField("value", LongType())])
    spark = spark_session(app_name=f"reference-{variant}",
                          conf={"spark.ui.showConsoleProgress": "false"})
    df = (spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_epoch)
          .parquet(input_dir))
    if variant == "spark_parquet_udf":
        keep = F.udf(lambda v: v % 10 != 0, BooleanType())
        df = df.filter(keep("value"))
    else:
        df = df.filter("value % 10 != 0")
    if variant == "exactly_files":
        query = start_query(df, sink_format="exactly.files", path=out,
                            checkpoint=CheckpointConfig(storage=ck, interval="1s"),
                            options={"format": "parquet"}).query
    else:
        query = (df.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", ck).trigger(processingTime="1 second").start())
    seen = 0
    while seen < total:  # every input event read and its epoch committed
        time.sleep(0.02)
        if query.exception() is not None:
            raise SystemExit(f"{variant}: {query.exception()}")
        seen = sum(int(p["numInputRows"]) for p in query.recentProgress)
    done = time.time()
    progress = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
    first_ms = float(progress[0]["durationMs"]["triggerExecution"]) if progress else 0.0
    query.stop()
    Path(result).write_text(json.dumps({"done": done, "epochs": len(progress),
                                        "first_epoch_ms": first_ms}))
    spark.stop()


# -- the PyFlink job (run by the PyFlink venv's python: reference.py --flink-job ...) ------
def flink_job(variant: str, input_dir: str, out: str, result: str) -> None:
    from pyflink.table import DataTypes, EnvironmentSettings, TableEnvironment
    from pyflink.table.expressions import col
    from pyflink.table.udf import udf

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "2")
    conf.set("execution.checkpointing.interval", "1s")
    conf.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    env.execute_sql(f"""
        CREATE TABLE events (id BIGINT, `key` STRING, `value` BIGINT) WITH (
          'connector' = 'filesystem', 'path' = '{input_dir}', 'format' = 'csv')""")
    env.execute_sql(f"""
        CREATE TABLE kept (id BIGINT, `key` STRING, `value` BIGINT) WITH (
          'connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv')""")
    if variant == "pyflink_sql":
        job = env.execute_sql("INSERT INTO kept SELECT * FROM events WHERE `value` % 10 <> 0")
    else:
        keep = udf(lambda v: v % 10 != 0, result_type=DataTypes.BOOLEAN())
        job = env.from_path("events").where(keep(col("value"))).execute_insert("kept")
    job.wait()  # a bounded job: its last checkpoint commits the last files
    Path(result).write_text(json.dumps({"done": time.time()}))


# -- driver ----------------------------------------------------------------------------------
def run_variant(variant: str, args: argparse.Namespace, parquet_dir: Path, csv_dir: Path,
                run_dir: Path) -> h.Run:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    out, result = run_dir / "out", run_dir / "result.json"
    if variant in FLINK_VARIANTS:
        command = [str(Path(args.pyflink) / "bin" / "python"), str(HERE), "--flink-job",
                   variant, str(csv_dir), str(out), str(result)]
    else:
        command = [sys.executable, str(HERE), "--spark-job", variant, str(parquet_dir),
                   str(out), str(run_dir / "ck"), str(result), str(args.events),
                   str(args.files_per_epoch)]
    started = time.time()
    proc = subprocess.run(command, capture_output=True, text=True)
    errors = []
    values: dict[str, float] = {}
    if proc.returncode != 0 or not result.exists():
        errors.append(f"{variant} exited {proc.returncode}: {proc.stderr[-2000:]}")
    else:
        report = json.loads(result.read_text())
        values = {"seconds": report["done"] - started,
                  "first_epoch_ms": report.get("first_epoch_ms", float("nan")),
                  "epochs": report.get("epochs", float("nan"))}
        problem = h.check_ids(read_ids(variant, out), expected_ids(args.events), variant)
        if problem:
            errors.append(problem)
    return h.Run(0, variant, values, errors)


def read_ids(variant: str, out: Path) -> np.ndarray:
    if variant in FLINK_VARIANTS:  # committed part files only (in-progress ones start with .)
        files = [str(p) for p in out.rglob("part-*") if not p.name.startswith(".")]
        if not files:
            return np.array([], dtype=np.int64)
        schema = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.int64())])
        data = ds.dataset(files, format=ds.CsvFileFormat(
            read_options=pacsv.ReadOptions(column_names=schema.names)), schema=schema)
        return data.to_table(columns=["id"])["id"].to_numpy()
    return ds.dataset(str(out), format="parquet").to_table(columns=["id"])["id"].to_numpy()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--spark-job":
        variant, input_dir, out, ck, result, total, per_epoch = argv[1:8]
        spark_job(variant, input_dir, out, ck, result, int(total), int(per_epoch))
        return 0
    if argv and argv[0] == "--flink-job":
        flink_job(*argv[1:5])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=5_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--files-per-epoch", type=int, default=2)
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--pyflink", default=None, help="a virtualenv with apache-flink installed")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-reference-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.pyflink and not (Path(args.pyflink) / "bin" / "python").exists():
        p.error(f"--pyflink {args.pyflink}: no bin/python there (a virtualenv with "
                "apache-flink installed)")
    variants = [*SPARK_VARIANTS, *(FLINK_VARIANTS if args.pyflink else ())]
    parquet_dir, csv_dir = write_input(work, args.events, args.keys, csv=bool(args.pyflink))
    print(h.machine())
    print(f"{args.events:,} events, {args.keys:,} keys, filter value % 10 != 0, 1 s "
          f"checkpoints, {args.files_per_epoch * FILE_ROWS:,} events an epoch at most; "
          f"job time from process start to committed output; {args.repeat} repetitions in "
          f"alternating order after one warm-up run of each variant (page cache, JIT of "
          f"nothing: every run is a new process). "
          + h.sizes_note(args.events, FILE_ROWS, args.repeat), flush=True)
    for variant in variants:
        warm = run_variant(variant, args, parquet_dir, csv_dir, work / "warm" / variant)
        if warm.errors:
            print(f"warm-up {variant}: {warm.errors}", file=sys.stderr)
    runs: list[h.Run] = []
    for rep, variant in h.schedule(variants, args.repeat):
        run = run_variant(variant, args, parquet_dir, csv_dir, work / f"run-{rep}" / variant)
        run.rep = rep
        runs.append(run)
        secs = run.values.get("seconds", float("nan"))
        print(f"rep {rep} {variant:18} {secs:7.2f} s  {args.events / secs / 1000:7.0f} k "
              f"events/s  {h.load()}" + (f"  ERRORS {run.errors}" if run.errors else ""),
              flush=True)
    ok = [r for r in runs if not r.errors]
    rows = []
    for variant in variants:
        secs = h.per_rep(ok, "seconds", variant)
        first = h.per_rep(ok, "first_epoch_ms", variant) if variant in SPARK_VARIANTS else []
        rows.append([variant, h.spread(secs), h.spread([args.events / s / 1000 for s in secs],
                                                        ".0f"),
                     h.spread([f / 1000 for f in first]) if first else "-"])
    print()
    print(h.table(["variant", "job s", "k events/s", "first epoch s"], rows))
    ratios = {"exactly_files / spark_parquet (speed)":
              h.paired(ok, "seconds", "spark_parquet", "exactly_files"),
              "exactly_files / spark_parquet_udf (speed)":
              h.paired(ok, "seconds", "spark_parquet_udf", "exactly_files"),
              "first epoch exactly_files / spark_parquet (time)":
              h.paired(ok, "first_epoch_ms", "exactly_files", "spark_parquet")}
    if args.pyflink:
        ratios["exactly_files / pyflink_udf (speed)"] = h.paired(ok, "seconds", "pyflink_udf",
                                                                 "exactly_files")
        ratios["exactly_files / pyflink_sql (speed)"] = h.paired(ok, "seconds", "pyflink_sql",
                                                                 "exactly_files")
    print()
    print(h.table(["ratio per repetition pair", "median (range)"],
                  [[k, h.spread(v)] for k, v in ratios.items()]))
    print(f"\n{h.machine()}")
    goals = {"exactly_files / spark_parquet (speed)": (">= 0.9", lambda m: m >= 0.9),
             "first epoch exactly_files / spark_parquet (time)": ("<= 1.2", lambda m: m <= 1.2),
             "exactly_files / pyflink_udf (speed)": (">= 2.5", lambda m: m >= 2.5)}
    headlines = []
    for key, (goal, met) in goals.items():
        if key in ratios:
            values = ratios[key]
            headlines.append(h.Headline("reference", key, h.spread(values), goal,
                                        met(float(np.median(values))) if values else None))
    h.write_headlines(work, headlines, {"runs": [vars(r) for r in runs]})
    errors = [e for r in runs for e in r.errors]
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

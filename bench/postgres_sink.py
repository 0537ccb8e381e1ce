"""Benchmark of exactly's PostgreSQL sinks against Spark's JDBC writer and raw COPY.

What is measured
----------------
The same ``--rows`` rows (``exactly.datagen``: id, key, amount, event_time), in epochs of
``--rows-per-epoch`` rows (``trigger(availableNow=True)``), are written once by each of:

``2pc``            ``exactly.postgres`` sink, exactly_once (COPY + PREPARE TRANSACTION per
                   task, COMMIT PREPARED in the driver)
``wal``            ``exactly.wal`` sink into PostgreSQL, exactly_once (Parquet staged beside
                   the checkpoint, loaded with COPY + marker in one transaction per epoch)
``upsert``         ``exactly.upsert`` sink keyed by ``id`` (INSERT ... ON CONFLICT, epoch-guarded)
``at_least_once``  ``exactly.postgres`` sink, at_least_once (each task commits its own
                   prepared transaction)
``spark_jdbc``     Spark's JDBC writer inside ``foreachBatch`` (``df.write.jdbc``, append;
                   driver jar from Debian's libpostgresql-jdbc-java or ``--jdbc-jar``)
``noop``           Spark's ``noop`` sink: reading and running the epochs with no sink work
``raw_copy``       no Spark: one psycopg client COPYing the same rows (pre-generated in
                   memory, CSV) in one transaction -- the physical limit of the server

Each Spark run uses a fresh table and checkpoint, in one SparkSession (``local[2]``) and one
temporary PostgreSQL server (``exactly.testing.pgcluster.TempPostgres``; ``fsync=on``). Reported:
wall seconds from ``start()`` to termination, rows/s, the ratio to ``raw_copy``, and the
seconds over the ``noop`` run (the sink's own cost, Spark's per-epoch cost taken out). Every
table is checked afterwards (row count and distinct ids = input rows), else exit status 1.
A warm-up run on a tiny input comes first so JVM and Python worker start-up do not count.

Run from the repository root (not part of the test suite)::

    .venv/bin/python bench/postgres_sink.py [--rows 400000] [--rows-per-epoch 100000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv

from exactly.config import CheckpointConfig
from exactly.connectors.datagen import generate
from exactly.spark.runner import start_query
from exactly.spark.session import spark_session
from exactly.testing.pgcluster import TempPostgres

SINKS = ("2pc", "wal", "upsert", "at_least_once", "spark_jdbc", "noop")
JDBC_JARS = ("/usr/share/java/postgresql.jar",)
DSN_ENV = "EXACTLY_BENCH_DSN"


def stream(spark, rows: int, per_epoch: int):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch)
            .option("numPartitions", 2).load())


def jdbc_url(pg: TempPostgres) -> str:
    return f"jdbc:postgresql://127.0.0.1:{pg.port}/{pg.database}"


def run_spark(spark, pg: TempPostgres, sink: str, rows: int, per_epoch: int, workdir: Path,
              table: str) -> float:
    ck = workdir / f"ck-{table}"
    shutil.rmtree(ck, ignore_errors=True)
    df = stream(spark, rows, per_epoch)
    started = time.perf_counter()
    if sink in ("2pc", "wal", "upsert", "at_least_once"):
        fmt = {"2pc": "exactly.postgres", "wal": "exactly.wal", "upsert": "exactly.upsert",
               "at_least_once": "exactly.postgres"}[sink]
        options = {"dsnEnv": DSN_ENV, "table": table, "partitions": "2"}
        if sink == "upsert":
            options["keyColumns"] = "id"
        mode = "at_least_once" if sink == "at_least_once" else "exactly_once"
        query = start_query(df, sink_format=fmt, options=options, available_now=True,
                            checkpoint=CheckpointConfig(storage=str(ck), mode=mode)).query
    elif sink == "spark_jdbc":
        url, props = jdbc_url(pg), {"user": pg.user, "password": pg.password,
                                    "driver": "org.postgresql.Driver"}

        def write(batch, _epoch: int) -> None:
            batch.write.jdbc(url, table, mode="append", properties=props)

        query = (df.writeStream.foreachBatch(write).option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
    else:
        query = (df.writeStream.format("noop").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - started


def raw_copy(pg: TempPostgres, rows: int, table: str) -> float:
    data = generate(0, rows, keys=100, seed=0)
    chunks = []
    for batch in data.to_batches(max_chunksize=100_000):
        buf = io.BytesIO()
        pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
        chunks.append(buf.getvalue())
    with pg.connect(autocommit=False) as conn:
        conn.execute(f'CREATE TABLE "{table}" (id bigint, key text, amount double precision, '
                     'event_time timestamptz)')
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f'COPY "{table}" FROM STDIN (FORMAT csv)') as copy:
            for chunk in chunks:
                copy.write(chunk)
        conn.commit()
        return time.perf_counter() - started


def check(pg: TempPostgres, table: str, rows: int) -> str | None:
    with pg.connect() as conn:
        n, distinct = conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"'
                                   ).fetchone()
    if n != rows or distinct != rows:
        return f"{table}: {n} rows, {distinct} distinct ids, expected {rows}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--rows-per-epoch", type=int, default=100_000)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--jdbc-jar", default=None)
    p.add_argument("--sinks", default=",".join(SINKS))
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-pg-"))
    jar = args.jdbc_jar or next((j for j in JDBC_JARS if os.path.exists(j)), None)
    sinks = [s for s in args.sinks.split(",") if s]
    if "spark_jdbc" in sinks and jar is None:
        print("spark_jdbc skipped: no PostgreSQL JDBC jar (scripts/setup.sh installs "
              "libpostgresql-jdbc-java, or pass --jdbc-jar)", file=sys.stderr)
        sinks.remove("spark_jdbc")
    results: dict[str, float] = {}
    errors = []
    with TempPostgres(max_prepared_transactions=10) as pg:
        os.environ[DSN_ENV] = pg.dsn
        results["raw_copy"] = raw_copy(pg, args.rows, "raw_copy")
        conf = {"spark.jars": jar} if jar else {}
        spark = spark_session(app_name="exactly-bench-postgres", conf=conf)
        try:
            for sink in sinks:  # warm-up: JVM, Python workers, first connections
                run_spark(spark, pg, sink, 2_000, 1_000, workdir, f"warm_{sink}")
            for sink in sinks:
                table = f"bench_{sink}"
                results[sink] = run_spark(spark, pg, sink, args.rows, args.rows_per_epoch,
                                          workdir, table)
                if sink != "noop":
                    problem = check(pg, table, args.rows)
                    if problem:
                        errors.append(problem)
        finally:
            spark.stop()
    base = args.rows / results["raw_copy"]
    print(f"\n{args.rows} rows, epochs of {args.rows_per_epoch}, local[2], PostgreSQL "
          "temp server\n")
    noop = results.get("noop")
    print(f"{'writer':<16}{'seconds':>10}{'rows/s':>12}{'vs raw COPY':>14}"
          f"{'s over noop':>14}")
    for name in ("raw_copy", *sinks):
        secs = results[name]
        rate = args.rows / secs
        over = f"{secs - noop:>14.2f}" if noop is not None and name != "raw_copy" else \
            f"{'-':>14}"
        print(f"{name:<16}{secs:>10.2f}{rate:>12.0f}{rate / base:>14.2f}{over}")
    (workdir / "results.json").write_text(json.dumps(
        {"rows": args.rows, "rows_per_epoch": args.rows_per_epoch, "seconds": results,
         "errors": errors}, indent=1))
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""What exactly's PostgreSQL sinks add to a Spark job, beside PostgreSQL's own COPY time.

What is measured
----------------
The same ``--rows`` rows (``exactly.datagen``: id, key, amount, event_time as a timezone-aware
timestamp), in epochs of ``--rows-per-epoch`` rows on 2 partitions
(``trigger(availableNow=True)``), are written once per repetition by each variant, into a
fresh table, in one SparkSession (``local[2]``) against one temporary PostgreSQL server
(``fsync=on``):

``2pc``            ``exactly.postgres``, exactly_once: one COPY per task into a transaction
                   that is PREPAREd; COMMIT PREPARED in the driver
``wal``            ``exactly.wal``: Parquet staged beside the checkpoint, loaded by the driver
                   with COPY and a marker in one transaction per epoch
``upsert``         ``exactly.upsert`` keyed by ``id`` (epoch-guarded INSERT ... ON CONFLICT)
``at_least_once``  ``exactly.postgres``, at_least_once
``spark_jdbc``     Spark's JDBC writer in ``foreachBatch`` (PostgreSQL's JDBC driver:
                   ``--jdbc-jar``, Debian's ``/usr/share/java/postgresql.jar``, or Maven Central)
``python_noop``    ``foreachBatch`` + ``mapInArrow`` that only counts and sums the ids: the
                   rows moved to Python workers as Arrow, as every Python sink receives them
                   (exactly's sinks run the same way), and nothing written
``noop``           Spark's ``noop`` sink: reading and running the epochs, no sink work

and, in the same repetition, ``client_copy``: one psycopg client COPYing the same rows from
Arrow into a fresh table in one transaction, its CSV encoding timed (exactly's encoder,
:func:`exactly.connectors.sql.CopyStream`): the target's own time for those rows.

Reported per sink: the **added time** (seconds over the ``noop`` run of the same
repetition, per million rows) and its ratio to ``client_copy``'s time in that repetition
(median and range over the repetitions; goal for ``2pc``: <= 1.0), and the sink's own work:
its time over ``python_noop``, to ``client_copy``. Every table is checked by id (``count``,
``count(DISTINCT id)``, ``min``, ``max`` = the ids ``0 .. rows-1``, each once);
``python_noop`` by the count and sum of the ids it received.
The rules (warm-up, alternating order, repetitions) are :mod:`harness`'s.

Run from the repository root (not part of the test suite)::

    .venv/bin/python bench/postgres_sink.py [--rows 1000000] [--rows-per-epoch 250000]
        [--repeat 3] [--sinks 2pc,wal,upsert,at_least_once,spark_jdbc,python_noop,noop]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly.config import CheckpointConfig
from exactly.connectors.datagen import generate
from exactly.connectors.sql import CopyStream, TableName
from exactly.ops.query import start_query
from exactly.spark.session import spark_session
from exactly.testing.pgcluster import TempPostgres

SINKS = ("2pc", "wal", "upsert", "at_least_once", "spark_jdbc", "python_noop", "noop")
FORMATS = {"2pc": "exactly.postgres", "wal": "exactly.wal", "upsert": "exactly.upsert",
           "at_least_once": "exactly.postgres"}
DSN_ENV = "EXACTLY_BENCH_DSN"
DDL = "(id bigint, key text, amount double precision, event_time timestamptz)"


def stream(spark, rows: int, per_epoch: int):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch)
            .option("numPartitions", 2).load())


def run_spark(spark, pg: TempPostgres, sink: str, rows: int, per_epoch: int, workdir: Path,
              table: str, received: list[tuple[int, int]] | None = None) -> float:
    ck = workdir / f"ck-{table}"
    shutil.rmtree(ck, ignore_errors=True)
    df = stream(spark, rows, per_epoch)
    started = time.perf_counter()
    if sink in FORMATS:
        options = {"dsnEnv": DSN_ENV, "table": table}
        if FORMATS[sink] == "exactly.postgres":
            options["partitions"] = "2"
        if sink == "upsert":
            options["keyColumns"] = "id"
        mode = "at_least_once" if sink == "at_least_once" else "exactly_once"
        query = start_query(df, sink_format=FORMATS[sink], options=options, available_now=True,
                            checkpoint=CheckpointConfig(storage=str(ck), mode=mode)).query
    elif sink == "spark_jdbc":
        url = f"jdbc:postgresql://127.0.0.1:{pg.port}/{pg.database}"
        props = {"user": pg.user, "password": pg.password, "driver": "org.postgresql.Driver"}

        def write(batch, _epoch: int) -> None:
            batch.write.jdbc(url, table, mode="append", properties=props)

        query = (df.writeStream.foreachBatch(write).option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
    elif sink == "python_noop":
        query = h.python_noop(df, str(ck), received if received is not None else [])
    else:
        query = (df.writeStream.format("noop").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{sink}: {query.exception()}")
    return time.perf_counter() - started


def client_copy(pg: TempPostgres, rows: int, table: str) -> float:
    """One client, one transaction, the same rows as Arrow (generated before the clock
    starts), encoded to CSV and COPYed: encoding and COPY timed, the commit included."""
    data = generate(0, rows, keys=100, seed=0)
    with pg.connect(autocommit=False) as conn:
        conn.execute(f'CREATE TABLE "{table}" {DDL}')
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cur:
            stream = CopyStream(cur, TableName.parse(table), data.schema.names)
            for batch in data.to_batches(max_chunksize=10_000):  # Spark's Arrow batch size
                stream.write(batch)
            stream.finish()
        conn.commit()
        return time.perf_counter() - started


def check(pg: TempPostgres, table: str, rows: int) -> str | None:
    """The table holds the ids 0 .. rows-1, each once (count, distinct, min and max)."""
    with pg.connect() as conn:
        n, distinct, low, high = conn.execute(
            f'SELECT count(*), count(DISTINCT id), min(id), max(id) FROM "{table}"').fetchone()
    if (n, distinct, low, high) == (rows, rows, 0, rows - 1):
        return None
    return (f"{table}: {n} rows, {distinct} distinct ids in [{low}, {high}]; "
            f"expected ids 0..{rows - 1} once")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=h.MIN_ROWS)
    p.add_argument("--rows-per-epoch", type=int, default=250_000)
    p.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS)
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--jdbc-jar", default=None)
    p.add_argument("--sinks", default=",".join(SINKS))
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-pg-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sinks = [s for s in args.sinks.split(",") if s]
    if "noop" not in sinks:
        sinks.append("noop")
    variants = [*sinks, "client_copy"]
    note = h.sizes_note(args.rows, args.warmup_rows, args.repeat)
    print(h.machine())
    print(f"{args.rows:,} rows per run in epochs of {args.rows_per_epoch:,}, 2 partitions, "
          f"local[2]; {args.repeat} repetitions in alternating order after a "
          f"{args.warmup_rows:,}-row warm-up of each variant. {note}", flush=True)
    runs: list[h.Run] = []
    with TempPostgres(max_prepared_transactions=10) as pg:
        os.environ[DSN_ENV] = pg.dsn
        conf = h.jdbc_conf(args.jdbc_jar) if "spark_jdbc" in sinks else {}
        spark = spark_session(app_name="exactly-bench-postgres", conf=conf)
        try:
            for sink in sinks:  # warm-up: JVM, Python workers, first connections
                run_spark(spark, pg, sink, args.warmup_rows, args.rows_per_epoch, workdir,
                          f"warm_{sink}")
            client_copy(pg, args.warmup_rows, "warm_client_copy")
            for rep, variant in h.schedule(variants, args.repeat):
                table = f"bench_{variant}_{rep}"
                if variant == "client_copy":
                    seconds = client_copy(pg, args.rows, table)
                else:
                    received: list[tuple[int, int]] = []
                    seconds = run_spark(spark, pg, variant, args.rows, args.rows_per_epoch,
                                        workdir, table, received)
                errors = []
                if variant == "python_noop":
                    got = (sum(n for n, _ in received), sum(t for _, t in received))
                    if got != (args.rows, args.rows * (args.rows - 1) // 2):
                        errors.append(f"python_noop received {got[0]} rows (id sum {got[1]}); "
                                      f"expected ids 0..{args.rows - 1} once")
                elif variant != "noop":
                    problem = check(pg, table, args.rows)
                    if problem:
                        errors.append(problem)
                with pg.connect() as conn:
                    conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
                runs.append(h.Run(rep, variant, {"seconds": seconds}, errors))
                print(f"rep {rep} {variant:14} {seconds:7.2f} s  {h.load()}"
                      + (f"  ERRORS {errors}" if errors else ""), flush=True)
        finally:
            spark.stop()

    per_m = 1_000_000 / args.rows
    rows = []
    copy_s = h.per_rep(runs, "seconds", "client_copy")
    rows.append(["client_copy (target's own time)", h.spread([s * per_m for s in copy_s]),
                 "1.00", "-"])
    headlines = []
    for sink in sinks:
        if sink == "noop":
            continue
        added, ratio = h.over(runs, sink, "noop", "client_copy")
        total = h.per_rep(runs, "seconds", sink)
        rows.append([sink, h.spread([a * per_m for a in added]), h.spread(ratio),
                     h.spread([args.rows / t / 1000 for t in total], ".0f")])
        goal = "<= 1.0" if sink == "2pc" else ""
        headlines.append(h.Headline("postgres_sink", f"{sink} added time / client COPY",
                                    h.spread(ratio), goal,
                                    h.at_most(ratio, 1.0) if goal else None))
    if "python_noop" in sinks and "2pc" in sinks:
        own_row, own_headline = h.own_work(runs, "2pc", "client_copy", "client COPY",
                                           "postgres_sink", per_m)
        rows.append(own_row)
        headlines.append(own_headline)
    rows.append(h.noop_row(runs, args.rows, per_m))
    print()
    print(h.table(["variant", "added s per 1M rows", "added / client COPY", "k rows/s"], rows))
    print(f"\n{h.machine()}")
    errors = [e for r in runs for e in r.errors]
    h.write_headlines(workdir, headlines, {"runs": [vars(r) for r in runs], "note": note})
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: savepoint time and size versus state size, and restore time with a rescale,
beside Spark's cold start of the same job.

What is measured
----------------
The job: ``exactly.datagen`` -> ``groupBy("key").agg(count, sum)`` (uid ``counts``) -> the
``noop`` sink, ``local[2]``, RocksDB state (``--backend``), 2 state partitions. For each state
size K (``--sizes``, keys), one preparation run puts K keys into the state (K rows, each key
once). Then, ``--repeat`` times, in alternating order where two variants are compared:

``savepoint``   taking a savepoint of the stopped query (copy + manifest + read-back)
``restore``     restoring it into a new checkpoint, same partitions (a file copy)
``rescale``     restoring it with 4 partitions (every row rewritten through Spark's provider)
``cold``        a fresh query on a new checkpoint (no state) running its first epoch over
                ``--increment`` new rows: Spark's cold start of the same job
``warm``        the restored query's first epoch over the same ``--increment`` new rows:
                restore (same partitions) + start + the epoch, the path a user pays

Ratios are taken per repetition pair: ``warm / cold`` (restore + first epoch vs a cold first
epoch, the cost of keeping state) and ``rescale / restore``. The state is checked after
every restore: the restored query's key count equals K. Load (1-minute average) is printed.

Run from the repository root::

    .venv/bin/python bench/savepoints.py [--sizes 10000,1000000] [--repeat 3]
    .venv/bin/python bench/savepoints.py --large     # adds 10,000,000 keys
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def session(backend: str):
    from exactly.spark.session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    provider = {"rocksdb": "org.apache.spark.sql.execution.streaming.state."
                           "RocksDBStateStoreProvider",
                "hashmap": "org.apache.spark.sql.execution.streaming.state."
                           "HDFSBackedStateStoreProvider"}[backend]
    return spark_session("local[2]", app_name="bench-savepoints", shuffle_partitions=2,
                         conf={"spark.driver.memory": "6g",
                               "spark.sql.streaming.stateStore.providerClass": provider})


def job_df(spark, keys: int, rows: int):
    from pyspark.sql import functions as F

    import exactly

    events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", rows).option("keys", keys).option("numPartitions", 2)
              .load())
    return exactly.uid("counts", events.groupBy("key").agg(F.count("*").alias("n"),
                                                            F.sum("amount").alias("total")))


def run(df, checkpoint: Path) -> float:
    """Run to the end of the input (availableNow); seconds from start() to the end."""
    started = time.perf_counter()
    query = (df.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - started


def state_keys(spark, checkpoint: Path) -> int:
    return spark.read.format("statestore").load(str(checkpoint)).count()


def restore_timed(spark, sp: Path, dest: Path, keys: int, parallelism: int | None) -> float:
    from exactly.savepoints.manifest import read_manifest
    from exactly.savepoints.operators import job_operators
    from exactly.savepoints.restore import plan_restore, restore_into

    started = time.perf_counter()
    manifest = read_manifest(sp)
    plan = plan_restore(manifest, sp, job_operators(job_df(spark, keys, keys)),
                        partitions=parallelism, backend=manifest.state_backend)
    restore_into(spark, plan, dest)
    return time.perf_counter() - started


def describe(values: list[float]) -> str:
    return (f"median {statistics.median(values):8.2f}  range {min(values):.2f}-"
            f"{max(values):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--large", action="store_true", help="also 10,000,000 keys")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--increment", type=int, default=10000)
    parser.add_argument("--backend", choices=["rocksdb", "hashmap"], default="rocksdb")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.large:
        sizes.append(10_000_000)
    from exactly.savepoints.take import take_savepoint

    spark = session(args.backend)
    base = Path(args.workdir or tempfile.mkdtemp(prefix="exactly-bench-sp-"))
    print(f"backend {args.backend}, local[2], 2 state partitions, load average "
          f"{os.getloadavg()[0]:.1f}, workdir {base}")
    # warm-up: a small prepare/savepoint/restore/run cycle, not measured
    warm = base / "warmup"
    run(job_df(spark, 1000, 1000), warm / "ck")
    wsp = take_savepoint(spark, str(warm / "ck"), warm / "sps")
    restore_timed(spark, wsp, warm / "ck2", 1000, None)
    run(job_df(spark, 1000, 2000), warm / "ck2")
    for keys in sizes:
        root = base / f"k{keys}"
        prepared = root / "prepared"
        seconds = run(job_df(spark, keys, keys), prepared)
        assert state_keys(spark, prepared) == keys
        print(f"\n== {keys:,} keys (prepared in {seconds:.1f} s)")
        taken, sizes_b, restores, rescales, colds, warms = [], [], [], [], [], []
        for rep in range(args.repeat):
            started = time.perf_counter()
            sp = take_savepoint(spark, str(prepared), root / f"sps{rep}")
            taken.append(time.perf_counter() - started)
            sizes_b.append(sum(p.stat().st_size for p in sp.rglob("*") if p.is_file()))
            order = ["cold", "warm"] if rep % 2 == 0 else ["warm", "cold"]
            for variant in order:
                if variant == "cold":
                    colds.append(run(job_df(spark, keys, args.increment),
                                     root / f"cold{rep}"))
                else:
                    dest = root / f"warm{rep}"
                    restore_s = restore_timed(spark, sp, dest, keys, None)
                    restores.append(restore_s)
                    warms.append(restore_s + run(job_df(spark, keys, keys + args.increment),
                                                 dest))
                    assert state_keys(spark, dest) == keys, "restored state lost keys"
            dest = root / f"rescaled{rep}"
            rescales.append(restore_timed(spark, sp, dest, keys, 4))
            assert state_keys(spark, dest) == keys, "rescaled state lost keys"
            shutil.rmtree(sp)
        print(f"savepoint time (s)        {describe(taken)}")
        print(f"savepoint size (MB)       {describe([b / 1e6 for b in sizes_b])}")
        print(f"restore, 2 partitions (s) {describe(restores)}")
        print(f"restore, 2 -> 4 (s)       {describe(rescales)}")
        print(f"cold start + epoch (s)    {describe(colds)}")
        print(f"restore + start + epoch   {describe(warms)}")
        ratios = [w / c for w, c in zip(warms, colds, strict=True)]
        print(f"ratio warm / cold         {describe(ratios)}")
        print(f"ratio rescale / restore   "
              f"{describe([r / s for r, s in zip(rescales, restores, strict=True)])}")
        print(f"load average now {os.getloadavg()[0]:.1f}")
    spark.stop()


if __name__ == "__main__":
    main()

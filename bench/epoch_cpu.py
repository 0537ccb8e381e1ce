"""Benchmark: the CPU an epoch costs with exactly's Python worker daemon and with Spark's own.

What is measured
----------------
Each run is a new driver process: ``exactly.spark_session()`` (``local[2]``), then
``start_query`` streams ``--rows`` rows of ``exactly.datagen`` into ``exactly.files`` in
epochs of ``--rows-per-epoch`` rows (``availableNow``), as ``exactly run`` does. Two
variants, differing only in the Python worker daemon Spark forks its task workers from:

``exactly``  ``exactly.spark.worker_daemon`` (the default): PySpark loaded from its installed
             package, PyArrow, pandas and exactly's sinks imported once before the fork and
             frozen out of the garbage collector's reach (PySpark's workers run a full
             ``gc.collect()`` after every task)
``spark``    Spark's own ``pyspark.daemon`` (``EXACTLY_WORKER_DAEMON=off``)

Per run: the machine's CPU seconds while the process ran (``/proc/stat``: user, nice and
system of every core; keep the machine otherwise idle -- the load is printed), its wall
seconds and its epochs (Spark's commit log). One warm-up run of each, then ``--repeat``
pairs in alternating order; ratios ``exactly / spark`` per pair (median and range). Every
run's output is audited: ids ``0 .. rows-1``, each once, else exit status 1.

Run from the repository root::

    .venv/bin/python bench/epoch_cpu.py [--repeat 3] [--rows 1000000] [--rows-per-epoch 10000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h

from exactly.audit import file_ids
from exactly.spark import worker_daemon

DRIVER = """
import json, sys
from exactly import CheckpointConfig, start_query
from exactly.spark.session import spark_session
spark = spark_session()
rows, per_epoch, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
          .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch).load())
query = start_query(events, sink_format="exactly.files", path=where + "/out",
                    checkpoint=CheckpointConfig(storage=where + "/ck"), available_now=True)
query.await_termination()
print(json.dumps({"ok": True}))
"""
VARIANTS = ("exactly", "spark")


def _cpu_seconds() -> float:
    """User, nice and system time of every core since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


def one_run(variant: str, rows: int, per_epoch: int, workdir: Path) -> dict[str, float]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           worker_daemon.ENV: "on" if variant == "exactly" else "off"}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        cpu, started = _cpu_seconds(), time.monotonic()
        result = subprocess.run([sys.executable, "-c", DRIVER, str(rows), str(per_epoch), tmp],
                                env=env, capture_output=True, text=True, timeout=1800)
        wall, cpu = time.monotonic() - started, _cpu_seconds() - cpu
        if result.returncode != 0:
            raise SystemExit(f"{variant} run failed:\n{result.stderr[-3000:]}")
        wrong = h.check_ids(file_ids(Path(tmp) / "out")[0], rows, f"{variant} run")
        if wrong:
            raise SystemExit(wrong)
        epochs = sum(1 for p in (Path(tmp) / "ck" / "commits").iterdir() if p.name.isdigit())
    return {"cpu": cpu, "wall": wall, "epochs": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-epoch", type=int, default=10_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    print(h.machine())
    print(f"rows per run: {args.rows:,} in epochs of {args.rows_per_epoch:,}")
    for variant in VARIANTS:  # warm-up: page cache, bytecode caches
        one_run(variant, args.rows, args.rows_per_epoch, args.workdir)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for rep, variant in h.schedule(VARIANTS, args.repeat):
        r = one_run(variant, args.rows, args.rows_per_epoch, args.workdir)
        results[variant].append(r)
        print(f"  pair {rep + 1} {variant:>7}: {r['cpu']:.1f} CPU-s, {r['wall']:.1f} s wall, "
              f"{r['epochs']:.0f} epochs, {r['cpu'] / r['epochs']:.2f} CPU-s an epoch "
              f"(start included), {h.load()}")
    for key, what in (("cpu", "CPU seconds"), ("wall", "wall seconds")):
        ratios = [a[key] / b[key] for a, b in zip(*(results[v] for v in VARIANTS), strict=True)]
        print(f"{what}: exactly's daemon {h.spread([r[key] for r in results['exactly']], '.1f')}, "
              f"Spark's {h.spread([r[key] for r in results['spark']], '.1f')}; ratio "
              f"exactly/spark {h.spread(ratios)}")
    print(f"after: {h.load()}; every run audited: ids 0..{args.rows - 1} once")


if __name__ == "__main__":
    main()

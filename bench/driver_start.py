"""Benchmark: a driver's start with and without exactly's class archive.

What is measured
----------------
Each run is a new driver process (as after a crash or a restart of ``exactly run``): Python
starts, ``exactly.spark_session()`` starts Spark's JVM, and one streaming query reads
``--rows`` rows of ``exactly.datagen`` into the ``exactly.files`` sink in a single epoch
(``availableNow``). Printed per run: seconds to a ready session and to the committed epoch,
from the process start. ``archive`` runs load the driver's classes from the class archive
(:mod:`exactly.spark.class_archive`, built first if missing); ``no-archive`` runs have
``EXACTLY_CLASS_ARCHIVE=off``. One warm-up run of each, then ``--repeat`` pairs in
alternating order; ratios ``archive / no-archive`` are per pair (median and range). Every
run's output is audited: ids 0..rows-1, each once.

Run from the repository root::

    .venv/bin/python bench/driver_start.py [--repeat 5] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from exactly.audit import audit_ids, file_ids
from exactly.spark import class_archive

DRIVER = """
import json, sys, time
started = float(sys.argv[1])
from exactly.spark.session import spark_session
spark = spark_session()
ready = time.time() - started
events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
          .option("totalRows", sys.argv[2]).load())
query = (events.writeStream.format("exactly.files").option("path", sys.argv[3] + "/out")
         .option("checkpointLocation", sys.argv[3] + "/ck").trigger(availableNow=True)
         .start())
query.awaitTermination()
print(json.dumps({"ready": ready, "epoch": time.time() - started}))
"""


def one_run(variant: str, rows: int, workdir: Path) -> dict[str, float]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env[class_archive.ENV] = "on" if variant == "archive" else "off"
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        result = subprocess.run([sys.executable, "-c", DRIVER, repr(time.time()), str(rows),
                                 tmp], env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise SystemExit(f"{variant} run failed:\n{result.stderr[-3000:]}")
        report = audit_ids(file_ids(Path(tmp) / "out")[0], np.arange(rows, dtype=np.int64))
        if not report.ok:
            raise SystemExit(f"{variant} run: the output is not ids 0..{rows - 1} once: "
                             f"{report.rows()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    archive = class_archive.build()
    print(f"archive: {archive} ({archive.stat().st_size / 1e6:.0f} MB)" if archive
          else "no java: nothing to compare")
    if archive is None:
        return
    print(f"rows per run: {args.rows:,}; load before: {os.getloadavg()[0]:.2f}")
    for variant in ("archive", "no-archive"):
        one_run(variant, args.rows, args.workdir)  # warm-up: page cache, pip caches
    results: dict[str, list[dict[str, float]]] = {"archive": [], "no-archive": []}
    for i in range(args.repeat):
        order = ("archive", "no-archive") if i % 2 == 0 else ("no-archive", "archive")
        for variant in order:
            results[variant].append(one_run(variant, args.rows, args.workdir))
            r = results[variant][-1]
            print(f"  pair {i + 1} {variant:>10}: session {r['ready']:.2f} s, "
                  f"epoch committed {r['epoch']:.2f} s")
    for key, what in (("ready", "session ready"), ("epoch", "epoch committed")):
        pairs = zip(results["archive"], results["no-archive"], strict=True)
        ratios = [a[key] / b[key] for a, b in pairs]
        with_, without = ([r[key] for r in results[v]] for v in ("archive", "no-archive"))
        print(f"{what}: archive median {statistics.median(with_):.2f} s, no archive "
              f"{statistics.median(without):.2f} s; ratio archive/no-archive median "
              f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}), "
              f"saved median {statistics.median(without) - statistics.median(with_):.2f} s")
    print(f"load after: {os.getloadavg()[0]:.2f}; every run audited: ids 0..{args.rows - 1} once")


if __name__ == "__main__":
    main()

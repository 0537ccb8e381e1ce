"""Benchmark: a driver's start with and without exactly's class archive, or with and without
the installed packages' bytecode.

What is measured
----------------
Each run is a new driver process (as after a crash or a restart of ``exactly run``): Python
starts, ``exactly.spark_session()`` starts Spark's JVM, and one streaming query reads
``--rows`` rows of ``exactly.datagen`` into the ``exactly.files`` sink in a single epoch
(``availableNow``). Printed per run: seconds to a ready session and to the committed epoch,
from the process start, and the CPU seconds of the run's processes that were waited for
(the driver, its JVM, Spark's Python workers and daemons: every process under the run, reaped
by a child subreaper). ``--compare archive``
(default): ``archive`` runs load the driver's classes from the class archive
(:mod:`exactly.spark.class_archive`, built first if missing), ``no-archive`` runs have
``EXACTLY_CLASS_ARCHIVE=off``. ``--compare bytecode``: ``bytecode`` runs import the compiled
bytecode that ``scripts/setup.sh`` writes for every installed package, ``no-bytecode`` runs
look for it in an empty directory (``PYTHONPYCACHEPREFIX``) and may write none
(``PYTHONDONTWRITEBYTECODE=1``): every process, Spark's own Python processes included,
compiles what it imports from source, as in a virtualenv installed without bytecode on a
machine where ``PYTHONDONTWRITEBYTECODE`` is set. One warm-up run of each, then
``--repeat`` pairs in alternating order; ratios (first variant / second) are per pair
(median and range). Every run's output is audited: ids 0..rows-1, each once.

Run from the repository root::

    .venv/bin/python bench/driver_start.py [--compare archive|bytecode] [--repeat 5]
        [--rows 1000000]
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


#: the two variants of each comparison, the one exactly sets up first
VARIANTS = {"archive": ("archive", "no-archive"), "bytecode": ("bytecode", "no-bytecode")}


def variant_env(variant: str, tmp: str) -> dict[str, str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env[class_archive.ENV] = "off" if variant == "no-archive" else "on"
    if variant == "no-bytecode":  # an empty bytecode cache nobody may write to
        cache = Path(tmp) / "no-pycache"
        cache.mkdir()
        env.update(PYTHONPYCACHEPREFIX=str(cache), PYTHONDONTWRITEBYTECODE="1")
    return env


#: runs the driver as its child after making itself the child subreaper of everything under
#: it, reaps every process of the run (the JVM, Spark's Python workers and daemons), then
#: prints the CPU seconds they all used (RUSAGE_CHILDREN: only processes waited for count)
TREE_CPU = """
import json, os, resource, subprocess, sys, time
from exactly.procs import become_subreaper
assert become_subreaper(), "a child subreaper (Linux) is needed to count the run's CPU"
code = subprocess.call(sys.argv[1:])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"tree_cpu": usage.ru_utime + usage.ru_stime}))
sys.exit(code)
"""


def one_run(variant: str, rows: int, workdir: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        result = subprocess.run([sys.executable, "-c", TREE_CPU, sys.executable, "-c", DRIVER,
                                 repr(time.time()), str(rows), tmp],
                                env=variant_env(variant, tmp), capture_output=True, text=True,
                                timeout=600)
        if result.returncode != 0:
            raise SystemExit(f"{variant} run failed:\n{result.stderr[-3000:]}")
        report = audit_ids(file_ids(Path(tmp) / "out")[0], np.arange(rows, dtype=np.int64))
        if not report.ok:
            raise SystemExit(f"{variant} run: the output is not ids 0..{rows - 1} once: "
                             f"{report.rows()}")
    *_, timings, cpu = result.stdout.strip().splitlines()
    return {**json.loads(timings), "cpu": json.loads(cpu)["tree_cpu"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", choices=sorted(VARIANTS), default="archive")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    archive = class_archive.build()
    print(f"archive: {archive} ({archive.stat().st_size / 1e6:.0f} MB)" if archive
          else "no java: nothing to compare")
    if archive is None:
        return
    first, second = VARIANTS[args.compare]
    print(f"rows per run: {args.rows:,}; load before: {os.getloadavg()[0]:.2f}")
    for variant in (first, second):
        one_run(variant, args.rows, args.workdir)  # warm-up: page cache, pip caches
    results: dict[str, list[dict[str, float]]] = {first: [], second: []}
    for i in range(args.repeat):
        order = (first, second) if i % 2 == 0 else (second, first)
        for variant in order:
            results[variant].append(one_run(variant, args.rows, args.workdir))
            r = results[variant][-1]
            print(f"  pair {i + 1} {variant:>11}: session {r['ready']:.2f} s, "
                  f"epoch committed {r['epoch']:.2f} s, {r['cpu']:.1f} CPU-s")
    for key, what, unit in (("ready", "session ready", "s"), ("epoch", "epoch committed", "s"),
                            ("cpu", "CPU of every process of the run", "CPU-s")):
        pairs = zip(results[first], results[second], strict=True)
        ratios = [a[key] / b[key] for a, b in pairs]
        with_, without = ([r[key] for r in results[v]] for v in (first, second))
        print(f"{what}: {first} median {statistics.median(with_):.2f} {unit}, {second} "
              f"{statistics.median(without):.2f} {unit}; ratio {first}/{second} median "
              f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}), "
              f"saved median {statistics.median(without) - statistics.median(with_):.2f} "
              f"{unit}")
    print(f"load after: {os.getloadavg()[0]:.2f}; every run audited: ids 0..{args.rows - 1} once")


if __name__ == "__main__":
    main()

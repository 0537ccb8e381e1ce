"""Run the benchmarks one after the other and print their headline numbers in one table.

Each benchmark runs in a process of its own (a fresh JVM; nothing one leaves behind counts
against the next) with its default sizes, which follow :mod:`harness`'s rules, and writes
``WORKDIR/<bench>/headlines.json``; its full report goes to ``WORKDIR/<bench>.log``. The
table lists, per headline, the measured value (median and range over the repetition pairs),
the goal, and whether the median meets it. The exit status is 1 when a benchmark failed or
found a wrong output (its checks by id), else 0: a missed goal is reported, not an error.

Run from the repository root (about two hours on 2 cores with the defaults)::

    .venv/bin/python bench/run_all.py [--only file_sink,postgres_sink] [--workdir DIR]
        [--pyflink VENV] [-- extra arguments for every benchmark]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

#: in the order they run; each takes --workdir
BENCHES = ("file_sink", "postgres_sink", "kafka_sink", "delta_sink", "iceberg_sink",
           "visibility", "epoch_cost", "reference", "state_snapshots", "history_overhead",
           "checkpoint_store", "audit", "connect_cost", "epoch_cpu")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(BENCHES),
                   help=f"comma-separated subset of {', '.join(BENCHES)}")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--pyflink", default=None,
                   help="a virtualenv with apache-flink, for reference.py's PyFlink variants")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="arguments after -- go to every benchmark")
    args = p.parse_args(argv)
    chosen = [b for b in args.only.split(",") if b]
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    extra = [a for a in args.extra if a != "--"]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-all-"))
    workdir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    print(h.machine(), flush=True)
    rows, failed = [], []
    for bench in chosen:
        out = workdir / bench
        log = workdir / f"{bench}.log"
        started = time.monotonic()
        with open(log, "w") as sink:
            own = ["--pyflink", args.pyflink] if bench == "reference" and args.pyflink else []
            code = subprocess.call([sys.executable, str(here / f"{bench}.py"),
                                    "--workdir", str(out), *own, *extra],
                                   stdout=sink, stderr=subprocess.STDOUT)
        minutes = (time.monotonic() - started) / 60
        print(f"{bench}: exit {code} after {minutes:.1f} min ({h.load()}); report {log}",
              flush=True)
        if code != 0:
            failed.append(bench)
        found = out / "headlines.json"
        if not found.exists():
            rows.append([bench, "(no headlines: see its log)", "", "", ""])
            continue
        for line in json.loads(found.read_text())["headlines"]:
            met = {True: "yes", False: "NO", None: ""}[line["met"]]
            rows.append([line["bench"], line["measure"], line["value"], line["goal"], met])
    print()
    print(h.table(["benchmark", "measure", "median (range)", "goal", "met"], rows))
    print(f"\n{h.machine()}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (see their logs)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: ``exactly verify``'s throughput and peak memory, files and PostgreSQL, 1 M and
10 M rows, against the in-memory id audit it replaces.

What is measured
----------------
A target of ``--rows`` rows (id, key, amount) in the file sink's layout (100,000 rows per
``epoch-N`` directory, Parquet) and the same rows in a PostgreSQL table (with
``exactly_epoch``), audited against an input of Parquet files holding ids ``0 .. rows-1``.
Three mismatches are planted, so every audit has something to find: id 42 is missing, id 17
is in the target twice, id 99's amount differs. Variants, each run in a fresh Python
process (its peak resident memory is the process's ``VmHWM``; seconds include the Python
start and imports, the same for every variant):

``in_memory``      the id audit ``exactly.audit`` offers (every id of both sides in NumPy
                   arrays: ``file_ids`` / ``pg_table_ids``, then ``audit_ids``)
``verify_ids``     ``exactly.auditor.run_audit``, ids only (what ``in_memory`` does)
``verify_values``  the same, comparing ``key`` and ``amount`` too (``--compare-columns``)
``verify_values_256mb``  ``verify_values`` with ``--memory-limit 256MB``: DuckDB spills to
                   disk sooner; the peak shows what the memory limit bounds

Every run's report is checked by id: exactly [42] missing, [17] duplicated and, where values
are compared, [99] differing; a run that finds anything else fails the benchmark. Per target
and size: a warm-up of each variant on 100,000 rows, then ``--repeat`` repetitions in
alternating order; ratios per repetition pair (median and range). ``verify_ids`` and
``verify_values`` run with the default memory limit (1GB).

Run from the repository root (about 15 minutes on 2 cores with the defaults)::

    .venv/bin/python bench/audit.py [--rows 1000000,10000000] [--repeat 3]
        [--targets files,postgres] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

VARIANTS = ("in_memory", "verify_ids", "verify_values", "verify_values_256mb")
#: DuckDB's memory limit per variant (the engine spills to its temporary directory beyond it)
MEMORY_LIMIT = {"verify_ids": "1GB", "verify_values": "1GB", "verify_values_256mb": "256MB"}
PER_EPOCH = 100_000
MISSING, DUPLICATED, DIFFERING = 42, 17, 99
DSN_ENV = "EXACTLY_BENCH_AUDIT_DSN"


# -- data ---------------------------------------------------------------------------------
def batches(rows: int):
    """The target's rows per epoch: (epoch, table), the three mismatches planted."""
    for epoch, start in enumerate(range(0, rows, PER_EPOCH)):
        ids = np.arange(start, min(start + PER_EPOCH, rows), dtype=np.int64)
        ids = ids[ids != MISSING]
        if start + PER_EPOCH >= rows:  # the last epoch repeats id 17
            ids = np.append(ids, DUPLICATED)
        amount = (ids % 1000).astype(np.float64) / 4
        amount[ids == DIFFERING] += 1.0
        keys = pa.array(np.char.add("k", (ids % 100).astype(str)))
        yield epoch, pa.table({"id": ids, "key": keys, "amount": amount})


def write_files(root: Path, rows: int) -> tuple[Path, Path]:
    """Input (ids 0..rows-1 with their true values) and the target in the sink's layout."""
    source, target = root / "input", root / "output"
    source.mkdir(parents=True)
    for n, start in enumerate(range(0, rows, 1_000_000)):
        ids = np.arange(start, min(start + 1_000_000, rows), dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "key": np.char.add("k", (ids % 100).astype(str)),
                                 "amount": (ids % 1000).astype(np.float64) / 4}),
                       source / f"part-{n:05d}.parquet")
    for epoch, table in batches(rows):
        directory = target / f"epoch-{epoch:012d}"
        directory.mkdir(parents=True)
        pq.write_table(table, directory / "part-00000.parquet")
    return source, target


def load_postgres(dsn: str, table: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" (id bigint, key text, amount double precision, '
                     "exactly_epoch bigint)")
        with conn.cursor() as cur, cur.copy(
                f'COPY "{table}" FROM STDIN (FORMAT csv)') as copy:
            for epoch, t in batches(rows):
                t = t.append_column("exactly_epoch", pa.array(np.full(len(t), epoch)))
                buf = io.BytesIO()
                pacsv.write_csv(t, buf, pacsv.WriteOptions(include_header=False))
                copy.write(buf.getvalue())
        conn.execute(f'ANALYZE "{table}"')


# -- one run, in a process of its own ------------------------------------------------------
def run_one(variant: str, source: Path, target: str) -> dict:
    """Audit ``target`` (a directory or ``postgres:TABLE``); what was found, by id."""
    if variant == "in_memory":
        from exactly.audit import audit_ids, file_ids, pg_table_ids

        expected, _ = file_ids(source)
        if target.startswith("postgres:"):
            import psycopg

            with psycopg.connect(os.environ[DSN_ENV]) as conn:
                found = pg_table_ids(conn, target.split(":", 1)[1])
        else:
            found, _ = file_ids(Path(target))
        r = audit_ids(found, expected)
        return {"missing": r.missing[:10].tolist(), "duplicated": r.duplicated[:10].tolist(),
                "unexpected": r.unexpected[:10].tolist(), "differing": None}
    from exactly.auditor import AuditSpec, FilesLocation, PostgresLocation, run_audit
    from exactly.connectors.sql import TableName

    output = (PostgresLocation(os.environ[DSN_ENV], TableName.parse(target.split(":", 1)[1]))
              if target.startswith("postgres:") else FilesLocation(Path(target)))
    compare = ("key", "amount") if variant.startswith("verify_values") else ()
    report = run_audit(AuditSpec(output=output, input=FilesLocation(source), compare=compare,
                                 memory_limit=MEMORY_LIMIT[variant]))

    def ids(finding) -> list[int]:
        return [row["id"] for row in finding.sample]

    return {"missing": ids(report.missing), "duplicated": ids(report.duplicated),
            "unexpected": ids(report.unexpected),
            "differing": ids(report.differing) if compare else None}


def peak_mib() -> float:
    """This process's peak resident memory since its exec (VmHWM; ``ru_maxrss`` would
    include the parent's size at the fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measured(variant: str, source: Path, target: str, env: dict[str, str]) -> tuple[dict, str]:
    """Run one audit in a fresh process: seconds, peak RSS (MiB), and what is wrong with
    its findings (None when exactly the planted mismatches)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--one", variant, "--source",
                           str(source), "--target", target],
                          stdout=subprocess.PIPE, env=env, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return {"seconds": seconds, "peak_mib": float("nan")}, f"exit {proc.returncode}"
    result = json.loads(proc.stdout)
    found = result["found"]
    want = {"missing": [MISSING], "duplicated": [DUPLICATED], "unexpected": [],
            "differing": [DIFFERING] if variant.startswith("verify_values") else None}
    problem = None if found == want else f"found {found}, expected {want}"
    return {"seconds": seconds, "peak_mib": result["peak_mib"]}, problem


# -- the benchmark --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1000000,10000000", help="comma-separated target sizes")
    p.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    p.add_argument("--warmup-rows", type=int, default=h.MIN_WARMUP_ROWS)
    p.add_argument("--targets", default="files,postgres")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        found = run_one(args.one, args.source, args.target)
        print(json.dumps({"found": found, "peak_mib": peak_mib()}))
        return 0

    sizes = [int(s) for s in args.rows.split(",")]
    targets = args.targets.split(",")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-audit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(h.machine())
    note = h.sizes_note(min(sizes), args.warmup_rows, args.repeat)
    if note:
        print(note)
    env = dict(os.environ)
    server = None
    if "postgres" in targets:
        from exactly.testing.pgcluster import TempPostgres

        server = TempPostgres()
        server.start()
        env[DSN_ENV] = server.dsn
    failures: list[str] = []
    headlines: list[h.Headline] = []
    lines = []
    try:
        for rows in [args.warmup_rows, *sizes]:
            warmup = rows == args.warmup_rows
            data = workdir / f"rows-{rows}"
            shutil.rmtree(data, ignore_errors=True)
            t0 = time.perf_counter()
            source, files_target = write_files(data, rows)
            locations = {"files": str(files_target)}
            if server is not None:
                load_postgres(server.dsn, f"audit_{rows}", rows)
                locations["postgres"] = f"postgres:audit_{rows}"
            print(f"\n{rows:,} rows: data written in {time.perf_counter() - t0:.0f} s; "
                  f"{h.load()}")
            for target in targets:
                runs = []
                plan = [(0, v) for v in VARIANTS] if warmup else h.schedule(VARIANTS,
                                                                              args.repeat)
                for rep, variant in plan:
                    values, problem = measured(variant, source, locations[target], env)
                    runs.append(h.Run(rep, variant, values, [problem] if problem else []))
                    print(f"  {'warm-up' if warmup else f'rep {rep}'} {target:8} "
                          f"{variant:20} {values['seconds']:7.2f} s  "
                          f"{values['peak_mib']:7.0f} MiB peak  {h.load()}"
                          + (f"  WRONG: {problem}" if problem else ""))
                    if problem:
                        failures.append(f"{target} {rows} {variant}: {problem}")
                if warmup:
                    continue
                lines.append(summary_rows(runs, target, rows))
                headlines += [
                    h.Headline("audit", f"{target} {rows:,} rows: verify_ids peak MiB",
                               h.spread(h.per_rep(runs, "peak_mib", "verify_ids"), ".0f")),
                    h.Headline("audit", f"{target} {rows:,} rows: verify_values rows/s",
                               h.spread([rows / s for s in h.per_rep(
                                   runs, "seconds", "verify_values")], ".3g"))]
    finally:
        if server is not None:
            server.destroy()
    headers = ["target, rows", "variant", "s", "M rows/s", "peak MiB",
               "s / in_memory", "peak / in_memory"]
    print("\n" + (note + "\n" if note else "")
          + h.table(headers, [r for block in lines for r in block]))
    print(h.machine())
    h.write_headlines(workdir, headlines, {"failures": failures})
    if failures:
        print("FAILED checks by id:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def summary_rows(runs: list[h.Run], target: str, rows: int) -> list[list[str]]:
    out = []
    for variant in VARIANTS:
        seconds = h.per_rep(runs, "seconds", variant)
        ratio_s = ("-" if variant == "in_memory"
                   else h.spread(h.paired(runs, "seconds", variant, "in_memory")))
        ratio_m = ("-" if variant == "in_memory"
                   else h.spread(h.paired(runs, "peak_mib", variant, "in_memory")))
        out.append([f"{target}, {rows:,}", variant, h.spread(seconds),
                    h.spread([rows / s / 1e6 for s in seconds]),
                    h.spread(h.per_rep(runs, "peak_mib", variant), ".0f"), ratio_s, ratio_m])
    return out


if __name__ == "__main__":
    sys.exit(main())

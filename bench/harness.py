"""The rules every benchmark under ``bench/`` follows, stated and enforced once.

A ratio a skeptic accepts:

* **sizes** - at least :data:`MIN_ROWS` rows by default and a warm-up of at least
  :data:`MIN_WARMUP_ROWS` rows per variant before anything is timed (JVM JIT, Python
  workers, connections). Smaller runs are allowed for trying a script out, but every table
  they print says ``NOT A MEASUREMENT`` (:func:`sizes_note`).
* **order** - the variants run in alternating order: as listed in even repetitions,
  reversed in odd ones (:func:`schedule`), so no variant always pays for the one before it.
* **repetitions** - at least :data:`MIN_REPEAT`; every ratio is computed per repetition
  pair (the two variants of the same repetition) and reported as median and range
  (:func:`paired`, :func:`spread`), never as a ratio of medians.
* **tails** - a p99 only over at least :data:`MIN_P99_VALUES` values (:func:`p99`); fewer
  print as ``n/a``, never as the maximum in disguise.
* **outputs** - checked by id (:func:`check_ids`): the ids written are exactly the ids
  expected, none missing, none twice; counts alone are not enough.
* **load** - the machine (cores, memory, load average) is printed at the start, with every
  run and at the end (:func:`machine`, :func:`load`).

Each script writes ``WORKDIR/headlines.json`` (:func:`write_headlines`): the few numbers
``bench/run_all.py`` puts into its one table.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: where Debian's libpostgresql-jdbc-java puts PostgreSQL's JDBC driver
JDBC_JARS = ("/usr/share/java/postgresql.jar",)
#: otherwise Spark resolves it from Maven Central (into its Ivy cache, once)
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.14"


def jdbc_conf(jar: str | None = None) -> dict[str, str]:
    """The Spark settings that put PostgreSQL's JDBC driver on the class path: ``jar``, or
    Debian's jar when installed, or the driver from Maven Central (``spark.jars.packages``),
    so that the JDBC reference variants always run."""
    jar = jar or next((j for j in JDBC_JARS if os.path.exists(j)), None)
    return {"spark.jars": jar} if jar else {"spark.jars.packages": JDBC_PACKAGE}


MIN_ROWS = 1_000_000
MIN_WARMUP_ROWS = 100_000
MIN_REPEAT = 3
#: the client settings every Kafka producer of a comparison gets (librdkafka and Java names
#: agree): bench/kafka_sink.py and bench/visibility.py
KAFKA_CLIENT = {"linger.ms": "5", "batch.size": "1000000", "acks": "all",
                "enable.idempotence": "true", "compression.type": "none"}
MIN_P99_VALUES = 100


def load() -> str:
    """The 1-minute load average, for a run's line."""
    return f"load {os.getloadavg()[0]:.2f}"


def machine() -> str:
    """Cores, memory, load averages and versions: the first line of every report."""
    import pyarrow
    import pyspark

    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError):
        pass
    one, five, fifteen = os.getloadavg()
    return (f"{os.cpu_count()} cores{mem}, load {one:.2f}/{five:.2f}/{fifteen:.2f}; "
            f"Python {platform.python_version()}, PySpark {pyspark.__version__}, "
            f"pyarrow {pyarrow.__version__}")


def sizes_note(rows: int, warmup_rows: int, repeat: int) -> str:
    """Empty when the run meets the rules; else a loud line saying which rule it breaks."""
    broken = []
    if rows < MIN_ROWS:
        broken.append(f"{rows:,} rows < {MIN_ROWS:,}")
    if warmup_rows < MIN_WARMUP_ROWS:
        broken.append(f"warm-up {warmup_rows:,} rows < {MIN_WARMUP_ROWS:,}")
    if repeat < MIN_REPEAT:
        broken.append(f"{repeat} repetitions < {MIN_REPEAT}")
    return f"NOT A MEASUREMENT ({'; '.join(broken)})" if broken else ""


def tail_note(values: float, what: str, repeat: int) -> str:
    """:func:`sizes_note` for a benchmark of tails: ``values`` (e.g. epochs) per run for its
    p99, and its repetitions."""
    broken = []
    if values < MIN_P99_VALUES:
        broken.append(f"{values:,.0f} {what} per run < {MIN_P99_VALUES}")
    if repeat < MIN_REPEAT:
        broken.append(f"{repeat} repetitions < {MIN_REPEAT}")
    return f"NOT A MEASUREMENT ({'; '.join(broken)})" if broken else ""


def schedule(variants: Sequence[str], repeat: int) -> list[tuple[int, str]]:
    """(repetition, variant) in run order: forward in even repetitions, reversed in odd."""
    order = []
    for rep in range(repeat):
        for variant in (variants if rep % 2 == 0 else list(reversed(variants))):
            order.append((rep, variant))
    return order


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile, or None for fewer than :data:`MIN_P99_VALUES` values."""
    if len(values) < MIN_P99_VALUES:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), 99))


def p50(values: Sequence[float]) -> float | None:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else None


@dataclass
class Run:
    """One timed run of one variant in one repetition; ``values`` are its measurements."""

    rep: int
    variant: str
    values: dict[str, float]
    errors: list[str]


def by_rep(runs: Iterable[Run]) -> dict[int, dict[str, Run]]:
    """The runs per repetition, by variant."""
    grouped: dict[int, dict[str, Run]] = {}
    for run in runs:
        grouped.setdefault(run.rep, {})[run.variant] = run
    return dict(sorted(grouped.items()))


def paired(runs: Iterable[Run], key: str, numerator: str, denominator: str,
           *, minus: str | None = None) -> list[float]:
    """Per repetition: ``numerator[key] / denominator[key]``; with ``minus``, the
    numerator's and denominator's ``key`` less ``minus``'s first (times over a baseline,
    e.g. a noop sink's)."""
    ratios = []
    for pair in by_rep(runs).values():
        if numerator not in pair or denominator not in pair:
            continue
        num = pair[numerator].values[key]
        den = pair[denominator].values[key]
        if minus is not None:
            base = pair[minus].values[key]
            num, den = num - base, den - base
        ratios.append(num / den)
    return ratios


def per_rep(runs: Iterable[Run], key: str, variant: str,
            *, minus: str | None = None) -> list[float]:
    """``variant``'s ``key`` per repetition, less ``minus``'s in the same repetition."""
    out = []
    for pair in by_rep(runs).values():
        if variant in pair and (minus is None or minus in pair):
            value = pair[variant].values[key]
            out.append(value - pair[minus].values[key] if minus is not None else value)
    return out


def over(runs: Iterable[Run], variant: str, baseline: str,
         target: str) -> tuple[list[float], list[float]]:
    """``variant``'s seconds over ``baseline``'s per repetition (its *added time*), and each
    of those divided by ``target``'s seconds in the same repetition."""
    runs = list(runs)
    added = per_rep(runs, "seconds", variant, minus=baseline)
    target_s = per_rep(runs, "seconds", target)
    return added, [a / t for a, t in zip(added, target_s, strict=True)]


def own_work(runs: Iterable[Run], variant: str, target: str, target_label: str,
             bench: str, per_m: float) -> tuple[list[str], Headline]:
    """The table row and headline of ``variant``'s own work: its time over ``python_noop``
    (Spark handing the rows to Python), per million rows and divided by ``target``'s."""
    own, ratio = over(runs, variant, "python_noop", target)
    row = [f"{variant} over python_noop (its own work)", spread([a * per_m for a in own]),
           spread(ratio), "-"]
    return row, Headline(bench, f"{variant} own work (over python_noop) / {target_label}",
                         spread(ratio), "", None)


def noop_row(runs: Iterable[Run], count: int, per_m: float) -> list[str]:
    """The table row of Spark's ``noop`` sink: its whole time per million rows, and the
    thousands of rows (of ``count``) it moved per second."""
    noop = per_rep(runs, "seconds", "noop")
    return ["noop (Spark alone: its total s)", spread([s * per_m for s in noop]), "-",
            spread([count / s / 1000 for s in noop], ".0f")]


def at_most(ratios: Sequence[float], limit: float) -> bool | None:
    """Whether the median of ``ratios`` is within ``limit`` (None without ratios)."""
    return statistics.median(ratios) <= limit if ratios else None


def spread(values: Sequence[float], fmt: str = ".2f") -> str:
    """``median (min - max)``; ``n/a`` when empty."""
    if not values:
        return "n/a"
    return (f"{statistics.median(values):{fmt}} "
            f"({min(values):{fmt}} - {max(values):{fmt}})")


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def check_ids(ids: Any, expected: int | Any, what: str) -> str | None:
    """None when ``ids`` (an Arrow or NumPy array of integers) holds each expected id exactly
    once and nothing else; else what is wrong (missing, duplicated and unexpected counts,
    first examples). ``expected`` is a count ``n`` (the ids ``0 .. n-1``) or the ids."""
    arr = np.sort(np.asarray(ids, dtype=np.int64))
    want = (np.arange(expected, dtype=np.int64) if isinstance(expected, int)
            else np.sort(np.asarray(expected, dtype=np.int64)))
    if arr.size == want.size and np.array_equal(arr, want):
        return None
    values, counts = np.unique(arr, return_counts=True)
    twice = values[counts > 1]
    missing = np.setdiff1d(want, values, assume_unique=False)
    extra = np.setdiff1d(values, want, assume_unique=False)
    return (f"{what}: {arr.size:,} rows for {want.size:,} expected ids: {missing.size:,} "
            f"missing {missing[:5].tolist()}, {twice.size:,} duplicated {twice[:5].tolist()}, "
            f"{extra.size:,} unexpected {extra[:5].tolist()}")


def python_noop(df: Any, checkpoint: str, received: list[tuple[int, int]]) -> Any:
    """Start ``df`` into ``foreachBatch`` + ``mapInArrow`` that only counts the rows (and
    sums an ``id`` column when there is one): Spark handing the rows to Python workers as
    Arrow, as exactly's sinks receive them, and nothing written. The floor of every Python
    sink. Each task appends ``(rows, id sum)`` to ``received``. Returns the query
    (``availableNow``)."""
    def count(batches: Any) -> Any:  # nested: cloudpickle ships it by value to the workers
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = total = 0
        for batch in batches:
            rows += batch.num_rows
            if "id" in batch.schema.names:
                total += pc.sum(batch.column("id")).as_py() or 0
        yield pa.RecordBatch.from_pydict({"n": [rows], "total": [total]})

    def discard(batch: Any, _epoch: int) -> None:
        received.extend((r["n"], r["total"])
                        for r in batch.mapInArrow(count, "n long, total long").collect())

    return (df.writeStream.foreachBatch(discard).option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, first column left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                               for i, c in enumerate(row)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass
class Headline:
    """One line of ``run_all.py``'s table."""

    bench: str
    measure: str
    value: str
    goal: str = ""
    met: bool | None = None


def write_headlines(workdir: Path, headlines: Sequence[Headline],
                    extra: Mapping[str, Any] | None = None) -> None:
    (workdir / "headlines.json").write_text(json.dumps(
        {"headlines": [asdict(h) for h in headlines], "machine": machine(), **(extra or {})},
        indent=1))


def start_s3(workdir: Path, bucket: str) -> Any:
    """S3Proxy on 127.0.0.1 (the test kit's), its settings in this process's AWS_* environment
    (what S3A, boto3 and deltalake read, and what Spark's Python workers inherit), ``bucket``
    created and empty: a reused WORKDIR keeps nothing of an earlier run."""
    import shutil

    from exactly.testing.s3_server import S3Server

    shutil.rmtree(workdir / "s3proxy", ignore_errors=True)
    server = S3Server(workdir / "s3proxy").start()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(key, None)
    os.environ.update(server.env())
    server.create_bucket(bucket)
    return server

"""Sources named with ``exactly.uid`` across restores: a new source unioned in and one joined
with a static table start from their configured start, the old ones resume by uid wherever
they moved, and a removed source is refused (by uid) unless its position is dropped. Real
Spark, exactly.datagen sources (deterministic positions) into the file sink; every version's
output is audited against the same rows generated in one batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import exactly
from exactly import CheckpointConfig, Job
from exactly.audit import data_files
from exactly.connectors.datagen import generate
from exactly.errors import SavepointError
from exactly.ops.job_savepoints import RestoreRequest, restore_job, take_job_savepoint
from exactly.ops.query import start_query
from exactly.savepoints.manifest import read_manifest
from exactly.savepoints.operators import job_operators

KEYS = 3
#: uid -> datagen seed (each source its own rows)
SEEDS = {"a": 1, "b": 2, "c": 3}
#: the static table source "c" is joined with: key -> weight its amounts are multiplied by
WEIGHTS = {"k0000": 1.0, "k0001": 10.0, "k0002": 100.0}


def source(spark, uid: str, rows: int):
    """The datagen source ``uid`` with ``rows`` rows, named ``uid``; tagged with its uid."""
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", "0")
          .option("totalRows", str(rows)).option("keys", str(KEYS))
          .option("seed", str(SEEDS[uid])).option("maxRowsPerTrigger", "400").load())
    return exactly.uid(uid, df)


def tagged(df, uid: str):
    return df.select("id", "key", "amount", F.lit(uid).alias("src"))


def joined(spark, rows: int):
    """Source "c" joined with the static weights table (a stream-static join)."""
    weights = spark.createDataFrame(list(WEIGHTS.items()), "key string, weight double")
    rows_c = source(spark, "c", rows).join(weights, "key")
    return rows_c.select("id", "key", (F.col("amount") * F.col("weight")).alias("amount"),
                         F.lit("c").alias("src"))


def make_job(df, checkpoint: Path, out: Path) -> Job:
    return Job(df, sink_format="exactly.files", path=str(out), options={"format": "parquet"},
               checkpoint=CheckpointConfig(interval="1s")).with_checkpoint_dir(str(checkpoint))


def run(job: Job) -> None:
    """Process every row the job's sources have (availableNow) and stop."""
    query = start_query(job.df, sink_format=job.sink_format, checkpoint=job.checkpoint,
                        path=job.path, options=dict(job.options), output_mode=job.output_mode,
                        available_now=True)
    query.query.awaitTermination()
    error = query.query.exception()
    assert error is None, f"the query failed: {error}"


def savepoint(job: Job, target: Path) -> Path:
    path = take_job_savepoint(job, target, trigger="stop", operators=job_operators(job.df))
    assert isinstance(path, Path)
    return path


def restore(job: Job, sp: Path, **options):
    return restore_job(job, RestoreRequest(str(sp), **options), job_operators(job.df))


def assert_once(out: Path, rows: dict[str, int]) -> None:
    """Every source's rows 0..n-1 once in the whole output (all versions together), with
    the amounts a batch generation of the same rows gives ("c": times its key's weight)."""
    frame = pd.concat([pd.read_parquet(f) for f in data_files(out)], ignore_index=True)
    assert sorted(set(frame["src"])) == sorted(rows)
    for uid, n in rows.items():
        part = frame[frame["src"] == uid].sort_values("id")
        assert part["id"].tolist() == list(range(n)), uid
        batch = generate(0, n, KEYS, SEEDS[uid]).to_pandas()
        weight = batch["key"].map(WEIGHTS) if uid == "c" else 1.0
        assert part["key"].tolist() == batch["key"].tolist(), uid
        assert np.allclose(part["amount"].to_numpy(), (batch["amount"] * weight).to_numpy())


def epochs(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def test_sources_resume_by_uid_and_new_ones_start_from_their_start(spark, tmp_path,
                                                                   savepoints):
    out = tmp_path / "out"
    # v1: source a alone
    v1 = make_job(tagged(source(spark, "a", 1000), "a"), tmp_path / "ck1", out)
    run(v1)
    sp1 = savepoint(v1, savepoints)
    first = read_manifest(sp1)
    assert [(s["index"], s["uid"]) for s in first.sources] == [(0, "a")]
    assert_once(out, {"a": 1000})

    # (a) v2: a new source b unioned after a: a resumes, b starts at its first row
    ck2 = tmp_path / "ck2"
    v2 = make_job(tagged(source(spark, "a", 2000), "a").unionByName(
        tagged(source(spark, "b", 600), "b")), ck2, out)
    done = restore(v2, sp1)
    assert done["sources"] == ["#0->#0", "new->#1"] and done["sources_new"] == ["'b'"]
    n = first.epoch
    assert (ck2 / "offsets" / str(n)).read_text().splitlines()[-1] == "-"
    run(v2)
    assert_once(out, {"a": 2000, "b": 600})
    assert epochs(ck2 / "commits")[:3] == [n - 1, n, n + 1]  # the epochs go on at N+1
    assert epochs(ck2 / "commits") == list(range(n - 1, epochs(ck2 / "commits")[-1] + 1))
    sp2 = savepoint(v2, savepoints)

    # (b) + (d) v3: b now first, a second, and a new source c joined with a static table
    ck3 = tmp_path / "ck3"
    v3 = make_job(tagged(source(spark, "b", 1200), "b")
                  .unionByName(tagged(source(spark, "a", 2500), "a"))
                  .unionByName(joined(spark, 500)), ck3, out)
    done = restore(v3, sp2)
    assert done["sources"] == ["#1->#0", "#0->#1", "new->#2"]
    run(v3)
    assert_once(out, {"a": 2500, "b": 1200, "c": 500})
    sp3 = savepoint(v3, savepoints)
    assert [s["uid"] for s in read_manifest(sp3).sources] == ["b", "a", "c"]

    # (c) v4 reads c and b only: a's position is refused, naming it, before anything is
    # written; with allow_non_restored_state it is dropped and the others go on
    ck4 = tmp_path / "ck4"
    v4 = make_job(joined(spark, 800).unionByName(tagged(source(spark, "b", 1500), "b")),
                  ck4, out)
    with pytest.raises(SavepointError, match=r"source 'a'.*--allow-non-restored-state"):
        restore(v4, sp3)
    assert not (ck4 / "offsets").exists()
    done = restore(v4, sp3, allow_non_restored_state=True)
    assert done["sources"] == ["#2->#0", "#0->#1"] and done["sources_dropped"] == ["'a'"]
    run(v4)
    assert_once(out, {"a": 2500, "b": 1500, "c": 800})


def test_two_sources_with_one_uid_are_refused(spark, tmp_path, savepoints):
    v1 = make_job(tagged(source(spark, "a", 100), "a"), tmp_path / "ck1", tmp_path / "out")
    run(v1)
    sp = savepoint(v1, savepoints)
    twice = make_job(tagged(source(spark, "a", 200), "a").unionByName(
        tagged(source(spark, "a", 200), "a")), tmp_path / "ck2", tmp_path / "out")
    with pytest.raises(SavepointError, match="'a' is given to more than one source"):
        restore(twice, sp)
    assert not (tmp_path / "ck2" / "offsets").exists()

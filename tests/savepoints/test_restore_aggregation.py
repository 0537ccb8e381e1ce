"""Savepoints of a per-key count and sum (groupBy().agg, update mode) into PostgreSQL, restored
unchanged, rescaled 2 -> 4 -> 3, switched hashmap -> RocksDB -> hashmap, upgraded with a new
stateful step before the old one, and downgraded without it. Real Spark, real PostgreSQL;
after every restore and run, every key's count and sum in the table equal the same
computation done in one batch over all input so far."""

from __future__ import annotations

import pytest
from savepoint_jobs import StatefulJob, assert_totals, table_totals
from savepoint_jobs import stage as run_stage

from exactly.errors import SavepointError
from exactly.savepoints.manifest import read_manifest

pytestmark = pytest.mark.server

STEP = 1000


def test_aggregation_survives_every_restore_of_the_upgrade_path(spark, pg, conn, table_name,
                                                               tmp_path, savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name,
           "JOB_BACKEND": "hashmap"}

    def stage(name: str, savepoint, rows: int, **overrides):
        done, sp = run_stage(spark, tmp_path / name, env, savepoint, rows, savepoints,
                             **overrides)
        assert_totals(table_totals(conn, table_name), rows)
        return None, done, sp

    _, _, sp0 = stage("ck0", None, STEP)
    first = read_manifest(sp0)
    assert [(o.uid, o.name, o.partitions) for o in first.operators] == [
        ("counts", "stateStoreSave", 2)]
    assert first.operators[0].stores[0].rows == 10 and first.state_backend == "hashmap"

    # (a) unchanged: a new query takes the table over and goes on from the savepoint
    _, done, sp1 = stage("ck1", sp0, 2 * STEP)
    assert done["restored"] == ["counts: #0->#0 (copy)"] and done["query_id"] != first.query_id

    # (b) 2 -> 4 -> 3 state partitions
    _, done, sp2 = stage("ck2", sp1, 3 * STEP, parallelism=4)
    assert done["partitions"] == "2->4" and read_manifest(sp2).operators[0].partitions == 4
    _, done, sp3 = stage("ck3", sp2, 4 * STEP, parallelism=3)
    assert read_manifest(sp3).shuffle_partitions == 3

    # (c) hashmap -> RocksDB -> hashmap
    _, done, sp4 = stage("ck4", sp3, 5 * STEP, JOB_BACKEND="rocksdb")
    assert done["backend"] == "hashmap->rocksdb" and read_manifest(sp4).state_backend == "rocksdb"
    _, done, sp5 = stage("ck5", sp4, 6 * STEP, JOB_BACKEND="hashmap")
    assert done["backend"] == "rocksdb->hashmap"

    # (d) a new version with a stateful step (dedup) before the old one: it starts empty
    _, done, sp6 = stage("ck6", sp5, 7 * STEP, JOB_VERSION="v2")
    assert done["new"] == ["dedup"] and done["restored"] == ["counts: #0->#0 (copy)"]
    assert sorted(o.uid for o in read_manifest(sp6).operators) == ["counts", "dedup"]

    # (e) a version without the dedup step: refused, then accepted with the flag
    job = StatefulJob(spark, tmp_path / "ck7", **env)
    with pytest.raises(SavepointError, match=r"dedup.*--allow-non-restored-state"):
        job.restore(sp6, 8 * STEP)
    assert not (tmp_path / "ck7" / "offsets").exists()  # refused before writing anything
    _, done, _ = stage("ck7", sp6, 8 * STEP, allow_non_restored_state=True)
    assert done["dropped"] == ["dedup"]


def test_changed_value_schema_of_a_named_step_is_refused_with_both_schemas(
        spark, pg, table_name, tmp_path, savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name}
    # a removed aggregate column (an added nullable one is carried:
    # test_state_schema_evolution.py)
    old = StatefulJob(spark, tmp_path / "ck0", **env, JOB_CHANGED_VALUE="1")
    old.run(STEP)
    sp = old.savepoint(savepoints)
    changed = StatefulJob(spark, tmp_path / "ck1", **env)
    with pytest.raises(SavepointError) as refused:
        changed.restore(sp, 2 * STEP)
    assert ("value schema changed from struct<count:bigint,sum:double,max:double> "
            "(savepoint) to struct<count:bigint,sum:double> (job)") in str(refused.value)
    assert not (tmp_path / "ck1" / "offsets").exists()  # refused before writing anything


def test_rolling_back_postgres_to_an_older_savepoint_is_refused_by_default(
        spark, pg, conn, table_name, tmp_path, savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name}
    job = StatefulJob(spark, tmp_path / "ck0", **env)
    job.run(STEP)
    older = job.savepoint(savepoints)
    job.run(2 * STEP)  # the table moves past the savepoint
    again = StatefulJob(spark, tmp_path / "ck1", **env)
    with pytest.raises(SavepointError, match=r"newer than the savepoint.*--sink-rollback keep"):
        again.restore(older, 3 * STEP)
    assert_totals(table_totals(conn, table_name), 2 * STEP)  # nothing changed

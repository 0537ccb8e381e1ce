"""State schema evolution across a savepoint restore (issue 46): an aggregation that gains
a column with a nullable buffer (``max``) is restored from a savepoint of the old version,
its state rewritten with the new field null; a new non-nullable buffer field (``count``)
is refused with both schemas. Real Spark, real PostgreSQL; the output is audited against a
batch computation of the input."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
from psycopg import sql
from pyspark.errors import StreamingQueryException
from savepoint_jobs import KEYS, StatefulJob, assert_totals, expected_totals

from exactly.audit import audit_ids, data_files, file_ids
from exactly.connectors.datagen import generate
from exactly.errors import SavepointError
from exactly.savepoints.manifest import read_manifest

pytestmark = pytest.mark.server

STEP = 1000


# "": RocksDB with changelogs; hashmap is a slow proof (CI budget: the same rewrite)
@pytest.mark.parametrize("backend", ["", pytest.param("hashmap", marks=pytest.mark.slow)])
def test_a_new_max_column_is_carried_and_covers_the_rows_after_the_restore(
        spark, pg, conn, table_name, tmp_path, savepoints, backend):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name,
           "JOB_BACKEND": backend}
    old = StatefulJob(spark, tmp_path / "ck0", **env)
    old.run(STEP)
    sp = old.savepoint(savepoints)
    evolved_table = f"{table_name}_v2"  # the new column needs a table that has it
    new = StatefulJob(spark, tmp_path / "ck1", **{**env, "JOB_TABLE": evolved_table},
                      JOB_CHANGED_VALUE="1")
    done = new.restore(sp, 2 * STEP)
    assert done["restored"] == ["counts: #0->#0 (rewrite)"]
    new.run(2 * STEP)
    rows = conn.execute(sql.SQL("SELECT key, n, total, biggest FROM {}").format(
        sql.Identifier(evolved_table))).fetchall()
    found = pd.DataFrame(rows, columns=["key", "n", "total", "biggest"])
    assert_totals(found, 2 * STEP)  # the old columns: carried across the restore exactly
    after = generate(STEP, 2 * STEP, KEYS, 0).to_pandas()  # ids STEP..2*STEP-1
    expected = after.groupby("key")["amount"].max().sort_index()
    got = found.set_index("key").sort_index()["biggest"]
    assert list(got.index) == list(expected.index)
    assert np.allclose(got.to_numpy(), expected.to_numpy())

    # the evolved state is the job's own from now on: its savepoint restores as a copy
    sp2 = new.savepoint(savepoints)
    again = StatefulJob(spark, tmp_path / "ck2", **{**env, "JOB_TABLE": evolved_table},
                        JOB_CHANGED_VALUE="1")
    assert again.restore(sp2, 3 * STEP)["restored"] == ["counts: #0->#0 (copy)"]
    again.run(3 * STEP)
    rows = conn.execute(sql.SQL("SELECT key, n, total, biggest FROM {}").format(
        sql.Identifier(evolved_table))).fetchall()
    found = pd.DataFrame(rows, columns=["key", "n", "total", "biggest"])
    assert_totals(found, 3 * STEP)
    after = generate(STEP, 3 * STEP, KEYS, 0).to_pandas()
    assert np.allclose(found.set_index("key").sort_index()["biggest"].to_numpy(),
                       after.groupby("key")["amount"].max().sort_index().to_numpy())


def test_a_new_count_column_is_refused_with_both_schemas(spark, pg, table_name, tmp_path,
                                                         savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name}
    old = StatefulJob(spark, tmp_path / "ck0", **env)
    old.run(STEP)
    sp = old.savepoint(savepoints)
    changed = StatefulJob(spark, tmp_path / "ck1", **env, JOB_ADDED_COUNT="1")
    with pytest.raises(SavepointError) as refused:
        changed.restore(sp, 2 * STEP)
    message = str(refused.value)
    assert ("from struct<count:bigint,sum:double> (savepoint) to "
            "struct<count:bigint,sum:double,count:bigint> (job)") in message
    assert "non-nullable" in message and "sum(F.lit(1))" in message
    assert not (tmp_path / "ck1" / "offsets").exists()  # refused before writing anything


def test_a_changed_dedup_key_is_refused_with_both_schemas(spark, pg, table_name, tmp_path,
                                                         savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name, "JOB_VERSION": "v2"}
    old = StatefulJob(spark, tmp_path / "ck0", **env)
    old.run(STEP)
    sp = old.savepoint(savepoints)
    same = StatefulJob(spark, tmp_path / "ck2", **env)  # the same key: restored as it was
    assert "dedup: #1->#1 (copy)" in same.restore(sp, 2 * STEP)["restored"]
    changed = StatefulJob(spark, tmp_path / "ck1", **env, JOB_DEDUP_KEY="id,key")
    with pytest.raises(SavepointError) as refused:
        changed.restore(sp, 2 * STEP)
    assert ("operator dedup: its state key schema changed from struct<id:bigint> (savepoint) "
            "to struct<id:bigint,key:string> (job)") in str(refused.value)
    assert not (tmp_path / "ck1" / "offsets").exists()  # refused before writing anything


@contextmanager
def encoding(spark, value: str | None):
    """The session's state encoding format for new checkpoints (Spark pins it in the
    offsets log: a restored job keeps its savepoint's)."""
    key = "spark.sql.streaming.stateStore.encodingFormat"
    if value is not None:
        spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key)


def test_a_new_nullable_field_of_avro_encoded_tws_state_is_carried_by_spark(
        spark, tmp_path, savepoints):
    out = tmp_path / "out"
    env = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb", "JOB_OUT": str(out)}
    with encoding(spark, "avro"):
        old = StatefulJob(spark, tmp_path / "ck0", **env)
        old.run(STEP)
        sp = old.savepoint(savepoints)
    assert read_manifest(sp).sql_conf.get(
        "spark.sql.streaming.stateStore.encodingFormat") == "avro"
    new = StatefulJob(spark, tmp_path / "ck1", **env, JOB_TWS_ADDED="1")
    done = new.restore(sp, 2 * STEP)  # the session's default encoding: the pinned one wins
    assert done["restored"] == ["running: #0->#0 (copy)"]
    new.run(2 * STEP)
    found, _ = file_ids(out)
    report = audit_ids(found, np.arange(2 * STEP))
    assert report.ok, report.to_json()
    frame = pd.concat([pd.read_parquet(f) for f in data_files(out)], ignore_index=True)
    last = frame.sort_values("n").groupby("key").tail(1).set_index("key").sort_index()
    expected = expected_totals(2 * STEP)  # the old fields: carried across the restore
    assert last["n"].tolist() == expected["n"].tolist()
    assert np.allclose(last["total"].to_numpy(), expected["total"].to_numpy(), rtol=1e-9)
    after = generate(STEP, 2 * STEP, KEYS, 0).to_pandas()  # the new field: rows after it
    assert np.allclose(last["biggest"].to_numpy(),
                       after.groupby("key")["amount"].max().sort_index().to_numpy())
    assert frame.loc[frame["id"] < STEP, "biggest"].isna().all()


def test_a_new_field_of_unsaferow_tws_state_is_refused_by_spark_at_the_first_epoch(
        spark, tmp_path, savepoints):
    """Spark's default encoding (unsaferow) cannot evolve: the restored query fails at its
    first epoch, showing both schemas (exactly cannot see a Python processor's state
    schemas before Spark runs it); avro set after the fact changes nothing (pinned)."""
    env = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb", "JOB_OUT": str(tmp_path / "out")}
    old = StatefulJob(spark, tmp_path / "ck0", **env)
    old.run(STEP)
    sp = old.savepoint(savepoints)
    new = StatefulJob(spark, tmp_path / "ck1", **env, JOB_TWS_ADDED="1")
    with encoding(spark, "avro"):  # too late: the savepoint's state is unsaferow-encoded
        new.restore(sp, 2 * STEP)
        with pytest.raises(StreamingQueryException) as refused:
            new.run(2 * STEP)
    message = str(refused.value)
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in message
    assert ("Existing value_schema=StructType(StructField(n,LongType,true),"
            "StructField(total,DoubleType,true)) and new value_schema=StructType("
            "StructField(n,LongType,true),StructField(total,DoubleType,true),"
            "StructField(biggest,DoubleType,true))") in message

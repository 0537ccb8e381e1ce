"""Savepoints of jobs on a Spark Connect session: the operators' uids and Spark's numbers
found from the client's plan and the server's explain equal those a classic session finds
for the same job, and a savepoint of an aggregation taken on Connect, restored on Connect
into another number of state partitions with a new stateful step (state rewritten by a
classic local Spark in a child process of the client), resumes with every key's count and
sum right. Real Spark Connect server, real PostgreSQL.

The Connect side runs in a child process (connect_client.py): a Python process that holds a
classic session (the ``spark`` fixture) cannot open a Connect one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from psycopg import sql
from savepoint_jobs import StatefulJob, assert_totals

from exactly.savepoints.manifest import read_manifest
from exactly.savepoints.operators import explained_operators

pytestmark = pytest.mark.server

CLIENT = Path(__file__).parent / "connect_client.py"
STEP = 1000


def table_totals(conn, table: str) -> pd.DataFrame:
    rows = conn.execute(sql.SQL("SELECT key, n, total FROM {}").format(
        sql.Identifier(table))).fetchall()
    return pd.DataFrame(rows, columns=["key", "n", "total"])


def on_connect(server, request: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    proc = subprocess.run([sys.executable, str(CLIENT), json.dumps({"url": server.url,
                                                                     **request})],
                          capture_output=True, text=True, env=env, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_uids_and_operator_numbers_on_connect_equal_the_classic_sessions(
        spark, connect_server, tmp_path):
    env = {"JOB_KIND": "agg", "JOB_VERSION": "v2", "JOB_DSN": "unused", "JOB_TABLE": "unused"}
    classic = [asdict(op) for op in StatefulJob(spark, tmp_path / "ck", **env).operators()]
    answer = on_connect(connect_server, {"command": "operators", "env": env,
                                         "checkpoint": str(tmp_path / "ck")})
    connect = answer["operators"]

    def named(ops):
        return [(o["operator_id"], o["physical"], o["logical"], o["uid"]) for o in ops]

    assert named(classic) == [(0, "StateStoreSave", "Aggregate", "counts"),
                              (1, "StreamingDeduplicate", "Deduplicate", "dedup")]
    assert named(connect) == named(classic)
    # the explain text names no state schemas: Spark's own check at start guards them
    assert all(o["key_schema"] is None and o["value_schema"] is None for o in connect)
    # refused on Connect as on a classic session
    assert "df has no stateful step" in answer["stateless"]
    assert "this step is already named 'counts'" in answer["renamed"]


def test_explained_operators_reads_ids_of_every_stateful_operator_once():
    explain = """== Physical Plan ==
*(5) HashAggregate(keys=[key#9], functions=[count(1)], output=[key#9, n#12L])
+- StateStoreSave [key#9], state info [ checkpoint = <unknown>, runId = 5d, opId = 0, ver = 0, \
numPartitions = 2] stateStoreCkptIds = None, Append, 0, 0, 2
   +- StateStoreRestore [key#9], state info [ checkpoint = <unknown>, runId = 5d, opId = 0, \
ver = 0, numPartitions = 2] stateStoreCkptIds = None, 2
      +- *(2) Project [key#9]
         +- StreamingDeduplicate [id#8L], state info [ checkpoint = <unknown>, runId = 5d, \
opId = 1, ver = 0, numPartitions = 2] stateStoreCkptIds = None, 0, 0
!TransformWithStateInPySpark transformWithStateUDF(id#1L)#2, [key#1], state info [ \
checkpoint = <unknown>, runId = 9e, opId = 2, ver = 0, numPartitions = 2] stateStoreCkptIds
"""
    assert explained_operators(explain) == [(0, "StateStoreSave"), (1, "StreamingDeduplicate"),
                                            (2, "TransformWithStateInPySpark")]


def test_aggregation_savepoint_on_connect_restores_rescaled_with_a_new_step(
        connect_server, pg, conn, table_name, tmp_path, savepoints):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name,
           "JOB_BACKEND": "hashmap"}
    answer = on_connect(connect_server, {
        "command": "stages", "env": env, "savepoints": str(savepoints),
        "stages": [{"checkpoint": str(tmp_path / "ck0"), "rows": STEP},
                   {"checkpoint": str(tmp_path / "ck1"), "rows": 2 * STEP,
                    "savepoint": "previous", "options": {"parallelism": 3},
                    "env": {"JOB_VERSION": "v2"}}]})
    first, second = answer["stages"]
    before = read_manifest(first["savepoint"])
    assert [(o.uid, o.partitions, o.stores[0].rows) for o in before.operators] == [
        ("counts", 2, 10)]
    done = second["done"]
    assert done["partitions"] == "2->3"
    assert done["restored"] == ["counts: #0->#0 (rewrite)"] and done["new"] == ["dedup"]
    state = tmp_path / "ck1" / "state"  # both operators' state in 3 partitions
    assert sorted(p.name for p in (state / "0").iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    assert sorted(p.name for p in (state / "1").iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    assert_totals(table_totals(conn, table_name), 2 * STEP)

"""Savepoints of jobs on a Spark Connect session: the operators' uids and Spark's numbers
found from the client's plan and the server's explain equal those a classic session finds
for the same job, and a savepoint of an aggregation taken on Connect, restored on Connect
into another number of state partitions with a new stateful step (state rewritten by a
classic local Spark in a child process of the client), resumes with every key's count and
sum right; only restores that change state files start that child, and its failure names
Spark's error. Real Spark Connect server, real PostgreSQL.

The Connect side runs in a child process (connect_client.py): a Python process that holds a
classic session (the ``spark`` fixture) cannot open a Connect one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from savepoint_jobs import StatefulJob, assert_totals, table_totals

from exactly.savepoints.manifest import read_manifest
from exactly.savepoints.operators import explained_operators

pytestmark = pytest.mark.server

CLIENT = Path(__file__).parent / "connect_client.py"
STEP = 1000


def on_connect(server, request: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    proc = subprocess.run([sys.executable, str(CLIENT), json.dumps({"url": server.url,
                                                                     **request})],
                          capture_output=True, text=True, env=env, timeout=240, check=False)
    if proc.returncode != 0:  # the Python side of the output, without JVM stack frames
        lines = (proc.stdout + proc.stderr).splitlines()
        shown = [line for line in lines if not line.lstrip().startswith("at ")]
        raise AssertionError("the Connect client failed:\n" + "\n".join(shown[-150:]))
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


# CI budget: tests/ops/test_run_remote.py restores a savepoint rescaled on Connect in the
# default lane (through exactly run --remote); the new step's empty state: slow lane
@pytest.mark.slow
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


KEY = '{"type":"struct","fields":[{"name":"key","type":"string","nullable":true,"metadata":{}}]}'
VALUE = ('{"type":"struct","fields":[{"name":"count","type":"long","nullable":true,'
         '"metadata":{}}]}')


def rescale_plan(savepoint: Path, partitions: int, *, new_step: bool = False):
    from exactly.savepoints.manifest import Manifest, OperatorInfo, StoreInfo
    from exactly.savepoints.operators import JobOperator
    from exactly.savepoints.restore import plan_restore

    manifest = Manifest("id", 5, "t", "q", "stop", "4.3.0", 2, "hashmap", {}, [],
                        [OperatorInfo(0, "stateStoreSave", 2, "counts",
                                      [StoreInfo("default", KEY, VALUE, 10, 1)], 1)], [], {})
    job = [JobOperator(0, "StateStoreSave", "Aggregate", "counts", KEY, VALUE)]
    if new_step:
        job.append(JobOperator(1, "StreamingDeduplicate", "Deduplicate", "dedup"))
    return plan_restore(manifest, savepoint, job, partitions=partitions, backend="hashmap")


def test_only_restores_that_change_state_files_go_to_a_classic_spark(tmp_path):
    from exactly.savepoints.restore import needs_spark
    from exactly.savepoints.rewrite import plan_to_json
    from exactly.savepoints.rewrite_child import plan_from_json

    assert not needs_spark(rescale_plan(tmp_path, 2))  # copies: no Spark on Connect
    assert needs_spark(rescale_plan(tmp_path, 3))  # rewritten into 3 partitions
    assert needs_spark(rescale_plan(tmp_path, 2, new_step=True))  # a new step's empty state
    plan = rescale_plan(tmp_path, 3, new_step=True)
    assert plan_from_json(json.loads(json.dumps(plan_to_json(plan)))) == plan


def test_a_failed_state_rewrite_in_the_child_process_names_its_cause(tmp_path):
    from exactly.errors import SavepointError
    from exactly.savepoints.rewrite import write_in_child

    plan = rescale_plan(tmp_path / "no-savepoint", 3)  # no state to read
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(SavepointError, match=r"(?s)state rewrite of this restore.*exit code "
                       r"1.*STDS_COMMITTED_BATCH_UNAVAILABLE"):
        write_in_child(plan, tmp_path / "checkpoint", "query-id")

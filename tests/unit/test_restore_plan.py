"""Planning a restore: operators map by uid (or by position and kind without uids), a
removed operator is refused unless allowed, a changed kind or schema is refused naming both,
new operators start empty only where Spark's state allows, and the method per operator
follows partitions and state backend. No Spark: manifests and plans only."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.errors import SavepointError
from exactly.savepoints.manifest import Manifest, OperatorInfo, StoreInfo
from exactly.savepoints.operators import JobOperator
from exactly.savepoints.restore import Method, plan_restore

KEY = '{"type":"struct","fields":[{"name":"key","type":"string","nullable":true,"metadata":{}}]}'
VALUE = ('{"type":"struct","fields":[{"name":"count","type":"long","nullable":true,'
         '"metadata":{}}]}')
VALUE2 = ('{"type":"struct","fields":[{"name":"count","type":"long","nullable":true,'
          '"metadata":{}},{"name":"max","type":"double","nullable":true,"metadata":{}}]}')


def savepoint(*ops: OperatorInfo, partitions: int = 2, backend: str = "hashmap") -> Manifest:
    return Manifest("id", 5, "t", "q", "stop", "4.3.0", partitions, backend, {}, [],
                    list(ops), [], {})


def agg(op_id: int, uid: str | None = "counts", version: int = 1) -> OperatorInfo:
    return OperatorInfo(op_id, "stateStoreSave", 2, uid,
                        [StoreInfo("default", KEY, VALUE, 10, 1)], version)


def tws(op_id: int, uid: str | None = "running") -> OperatorInfo:
    return OperatorInfo(op_id, "transformWithStateInPandasExec", 2, uid,
                        [StoreInfo("default", "", "", 10, 1)], 2)


def job_agg(op_id: int, uid: str | None = "counts", value: str = VALUE) -> JobOperator:
    return JobOperator(op_id, "StateStoreSave", "Aggregate", uid, KEY, value)


def dedup(op_id: int, uid: str | None = "dedup") -> JobOperator:
    return JobOperator(op_id, "StreamingDeduplicate", "Deduplicate", uid)


def plan(manifest, ops, **kwargs):
    kwargs.setdefault("partitions", None)
    kwargs.setdefault("backend", manifest.state_backend)
    return plan_restore(manifest, Path("/sp"), ops, **kwargs)


def test_a_uid_follows_its_step_to_another_operator_number():
    result = plan(savepoint(agg(0)), [dedup(0), job_agg(1)])
    assert [(m.old.operator_id, m.new.operator_id, m.method) for m in result.moves] == [
        (0, 1, Method.COPY)]
    assert [o.uid for o in result.new] == ["dedup"]


def test_without_uids_operators_map_by_number_and_kind():
    result = plan(savepoint(agg(0, None)), [job_agg(0, None)])
    assert [(m.old.operator_id, m.new.operator_id) for m in result.moves] == [(0, 0)]
    # a job that named its steps since: the savepoint's unnamed operator keeps its place
    result = plan(savepoint(agg(0, None)), [job_agg(0, "counts")])
    assert [(m.old.operator_id, m.new.uid) for m in result.moves] == [(0, "counts")]
    # another kind at that number is not its state
    with pytest.raises(SavepointError, match=r"#0 \(stateStoreSave\) that the job no longer"):
        plan(savepoint(agg(0, None)), [dedup(0, None)])


def test_a_uid_naming_another_kind_of_step_is_refused():
    with pytest.raises(SavepointError, match="was a stateStoreSave in the savepoint and is a "
                                             "dedupe"):
        plan(savepoint(agg(0)), [dedup(0, "counts")])


def test_a_removed_operator_is_refused_unless_its_state_may_be_dropped():
    manifest = savepoint(agg(0), OperatorInfo(1, "dedupe", 2, "dedup",
                                              [StoreInfo("default", "", "", 5, 1)]))
    with pytest.raises(SavepointError, match=r"operator\(s\) dedup .*--allow-non-restored"):
        plan(manifest, [job_agg(0)])
    result = plan(manifest, [job_agg(0)], allow_non_restored_state=True)
    assert [o.uid for o in result.dropped] == ["dedup"]


def test_a_new_nullable_aggregate_buffer_field_is_carried_by_a_rewrite():
    result = plan(savepoint(agg(0)), [job_agg(0, value=VALUE2)])
    assert [m.method for m in result.moves] == [Method.REWRITE]


def test_a_removed_or_non_nullable_value_field_is_refused_showing_both():
    removed = OperatorInfo(0, "stateStoreSave", 2, "counts",
                           [StoreInfo("default", KEY, VALUE2, 10, 1)], 1)
    with pytest.raises(SavepointError, match=r"value schema changed from "
                                             r"struct<count:bigint,max:double> \(savepoint\) "
                                             r"to struct<count:bigint> \(job\)"):
        plan(savepoint(removed), [job_agg(0)])
    strict = VALUE2.replace('"max","type":"double","nullable":true',
                            '"n","type":"long","nullable":false')
    with pytest.raises(SavepointError, match=r"to struct<count:bigint,n:bigint> \(job\); the "
                                             r"new buffer field\(s\) n are non-nullable"):
        plan(savepoint(agg(0)), [job_agg(0, value=strict)])


def test_only_aggregations_and_deduplications_start_empty():
    new_tws = JobOperator(1, "TransformWithStateInPySpark", "TransformWithStateInPySpark", "x")
    with pytest.raises(SavepointError, match="only aggregations and deduplications can start"):
        plan(savepoint(agg(0)), [job_agg(0), new_tws])


@pytest.mark.parametrize(("op", "partitions", "backend", "method"), [
    (agg(0), None, "hashmap", Method.COPY),
    (agg(0), 4, "hashmap", Method.REWRITE),
    (agg(0), None, "rocksdb", Method.REWRITE),
    (tws(0), 4, "rocksdb", Method.REPARTITION),
])
def test_the_method_follows_partitions_and_backend(op, partitions, backend, method):
    source_backend = "rocksdb" if op.metadata_version == 2 else "hashmap"
    job_op = job_agg(0) if op.metadata_version == 1 else JobOperator(
        0, "TransformWithStateInPySpark", "TransformWithStateInPySpark", "running")
    result = plan(savepoint(op, backend=source_backend), [job_op], partitions=partitions,
                  backend=backend)
    assert [m.method for m in result.moves] == [method]


def test_transform_with_state_cannot_move_to_the_hashmap_backend():
    job_op = JobOperator(0, "TransformWithStateInPySpark", "TransformWithStateInPySpark",
                         "running")
    with pytest.raises(SavepointError, match="transformWithState needs RocksDB"):
        plan(savepoint(tws(0), backend="rocksdb"), [job_op], backend="hashmap")

"""Operator uids: naming a job's stateful steps so savepoints map state by name.

Spark numbers a query's stateful operators by position (a pre-order walk of the physical
plan, the last operator of the pipeline first) and keys their state by that number: adding an
operator after the others shifts every number. :func:`uid` names a stateful step the way
Flink's ``uid()`` does::

    counts = exactly.uid("counts", events.groupBy("key").agg(F.count("*").alias("n")))

A savepoint records each operator's uid beside Spark's number; a restore moves the state of
uid ``counts`` to wherever ``counts`` sits in the new job's plan (:func:`job_operators`).

How the name reaches Spark's number: :func:`uid` tags the first stateful node of the
DataFrame's analyzed plan (a Catalyst tree-node tag, kept by every DataFrame built on it).
:func:`job_operators` walks the job's analyzed plan and the physical plan Spark's streaming
planner makes of it (the ``IncrementalExecution`` ``explain`` uses) and pairs the stateful
nodes of both in pre-order, checking that their kinds agree. When they cannot be paired
(the optimizer merged or removed a stateful step) it raises a ConfigError instead of
guessing.

On a Spark Connect session there is no analyzed plan in this process: the uid is kept on the
client's own plan node of the stateful step (``df._plan``; every DataFrame built on it holds
that node object as a child), the logical side is the walk of the client's plan, and the
physical side is the server's ``explain`` of the streaming DataFrame (the same incremental
planning, every stateful operator with ``opId = N`` in its state info). The explain text
names no state schemas: a Connect job's operators have none, so the restore's own schema
check leaves a changed schema to Spark's check when the restored query starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.location import as_store
from exactly.checkpoint.store import LogStore
from exactly.errors import ConfigError
from exactly.fsutil import parse_json
from exactly.spark.connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

UID_TAG = "exactly.uid"

#: logical node -> words one of which the physical operator's name contains
_KINDS: dict[str, tuple[str, ...]] = {
    "Aggregate": ("StateStoreSave",),
    "Distinct": ("StateStoreSave",),
    "Deduplicate": ("StreamingDeduplicate",),
    "DeduplicateWithinWatermark": ("StreamingDeduplicateWithinWatermark",),
    "FlatMapGroupsWithState": ("FlatMapGroupsWithState",),
    "FlatMapGroupsInPandasWithState": ("FlatMapGroupsInPandasWithState",),
    "TransformWithState": ("TransformWithState",),
    "TransformWithStateInPySpark": ("TransformWithState",),
    "TransformWithStateInPandas": ("TransformWithState",),
    "Join": ("StreamingSymmetricHashJoin",),
}
#: words in the names of Spark's stateful physical operators
_STATEFUL_WORDS = ("StateStore", "Deduplicate", "FlatMapGroups", "TransformWithState",
                   "SymmetricHashJoin", "SessionWindow", "GlobalLimit", "Stateful")
#: physical nodes that share the id of the operator above them
_SHARES_ID = ("StateStoreRestore", "SessionWindowStateStoreRestore")


@dataclass(frozen=True)
class JobOperator:
    """A stateful operator of a job: Spark's number, its physical node and the uid."""

    operator_id: int
    physical: str
    logical: str
    uid: str | None
    #: state key and value schemas (Spark JSON) where the plan states them (aggregations)
    key_schema: str | None = None
    value_schema: str | None = None


def _seq(s: Any) -> list[Any]:
    return [s.apply(i) for i in range(s.size())]


def _tag(jvm: Any) -> Any:
    return jvm.org.apache.spark.sql.catalyst.trees.TreeNodeTag(UID_TAG)


def _is_stateful_logical(node: Any) -> bool:
    name = node.nodeName()
    if name not in _KINDS or not node.isStreaming():
        return False
    if name == "Join":
        children = _seq(node.children())
        return len(children) == 2 and all(c.isStreaming() for c in children)
    return True


def _logical_stateful(node: Any, out: list[Any]) -> list[Any]:
    if _is_stateful_logical(node):
        out.append(node)
    for child in _seq(node.children()):
        _logical_stateful(child, out)
    return out


def _schemas(node: Any) -> tuple[str | None, str | None]:
    """(key, value) schema JSON of an aggregation's state, from its physical node; for a
    deduplication the key (its columns) and no value (Spark stores a fixed one: a dummy, or
    the expiry of ``dropDuplicatesWithinWatermark``)."""
    if node.nodeName() not in ("StateStoreSave", "StreamingDeduplicate",
                               "StreamingDeduplicateWithinWatermark"):
        return None, None
    try:
        keys = [{"name": a.name(), "type": json.loads(a.dataType().json()), "nullable": True,
                 "metadata": {}} for a in _seq(node.keyExpressions())]
        if node.nodeName() != "StateStoreSave":
            return json.dumps({"type": "struct", "fields": keys}), None
        value = str(node.stateManager().getStateValueSchema().json())
    except Exception:  # another Spark version: Spark's own check at start remains
        return None, None
    return json.dumps({"type": "struct", "fields": keys}), value


def _physical_stateful(node: Any, out: list[tuple[int, str, Any]]
                       ) -> list[tuple[int, str, Any]]:
    name = node.nodeName()
    if any(word in name for word in _STATEFUL_WORDS) and not any(
            name.startswith(s) for s in _SHARES_ID):
        try:
            option = node.stateInfo()
            info = option.get() if option.isDefined() else None
        except Exception:  # a node without stateInfo is stateless
            info = None
        if info is not None:
            out.append((int(info.operatorId()), name, node))
    for child in _seq(node.children()):
        _physical_stateful(child, out)
    return out


def uid(name: str, df: DataFrame) -> DataFrame:
    """Name the stateful step that produces ``df`` (the first stateful operator found
    walking down from ``df``'s last step) and return ``df`` unchanged.

    When ``df`` is a streaming source itself (``spark.readStream...load()``, nothing
    applied to it), the uid names that source instead: a savepoint records the source's
    position under it, and a restore resumes it by uid wherever it sits among the job's
    sources (:func:`job_sources`).

    The uid is how savepoints find this step's state in a new version of the job. Raises
    ConfigError for an empty name, a DataFrame without a stateful step, or a step or source
    named twice with different names.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("exactly.uid: give a non-empty name")
    if not df.isStreaming:
        raise ConfigError(f"exactly.uid({name!r}, df): df is not a streaming DataFrame")
    if is_connect(df):
        return _connect_uid(name, df)
    plan = df._jdf.logicalPlan()
    if _is_source(plan):
        return _tagged(name, df, plan, "source")
    found = _logical_stateful(plan, [])
    if not found:
        raise ConfigError(f"exactly.uid({name!r}, df): df has no stateful step (an "
                          "aggregation, dropDuplicates, transformWithState, a stream-stream "
                          "join ...); name the DataFrame that a stateful step returns")
    return _tagged(name, df, found[0], "step")


def _tagged(name: str, df: DataFrame, node: Any, what: str) -> DataFrame:
    """Tag ``node`` (a plan node of ``df``) with the uid ``name``; ConfigError when it
    already has another."""
    tag = _tag(df.sparkSession._jvm)
    old = node.getTagValue(tag)
    if old.isDefined() and old.get() != name:
        raise ConfigError(f"exactly.uid({name!r}, df): this {what} is already named "
                          f"{old.get()!r}; a {what} has one uid")
    node.setTagValue(tag, name)
    return df


def _is_source(node: Any) -> bool:
    """Whether a logical plan node is a streaming source (V1 or V2) read by the query."""
    return "StreamingRelation" in node.getClass().getSimpleName()


def _source_name(node: Any) -> str:
    """The name of a streaming source node (``kafka``, ``exactly.datagen`` ...) as the
    savepoint manifest records it."""
    return str(node.toString()).split("[")[0].strip()


def job_sources(df: DataFrame) -> list[tuple[str, str | None]]:
    """``(name, uid)`` of every streaming source of ``df``, in the order of Spark's offset
    log (the analyzed plan's leaves in pre-order, as Spark collects its sources); the uid
    is the one :func:`uid` gave the source, None for an unnamed one. On Spark Connect the
    sources have no uids (their names only)."""
    if is_connect(df):
        from exactly.spark.connect import streaming_sources

        return [(fmt, None) for fmt, _ in streaming_sources(df)]
    tag = _tag(df.sparkSession._jvm)
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    found: list[tuple[str, str | None]] = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if _is_source(leaf):
            value = leaf.getTagValue(tag)
            found.append((_source_name(leaf), value.get() if value.isDefined() else None))
    return found


def job_operators(df: DataFrame) -> list[JobOperator]:
    """The stateful operators of a query that would run ``df``, with Spark's numbers and
    the uids :func:`uid` gave them, in Spark's order (operator 0 first).

    Raises ConfigError when two operators share a uid or when uids were given but Spark's
    plan cannot be paired with the DataFrame's steps.
    """
    if is_connect(df):
        return _connect_operators(df)
    qe = df._jdf.queryExecution()
    analyzed = qe.analyzed()
    tag = _tag(df.sparkSession._jvm)
    logical = _logical_stateful(analyzed, [])
    physical_all = _physical_stateful(qe.queryExecutionForExplain().executedPlan(), [])
    physical: list[tuple[int, str, Any]] = []
    for op in physical_all:
        if op[0] not in {p[0] for p in physical}:
            physical.append(op)
    uids = []
    for node in logical:
        value = node.getTagValue(tag)
        uids.append(value.get() if value.isDefined() else None)
    return _paired([node.nodeName() for node in logical], uids, physical, _schemas)


def _paired(logical: list[str], uids: list[str | None],
            physical: list[tuple[int, str, Any]],
            schemas: Any) -> list[JobOperator]:
    """Pair the stateful steps (their kinds, a key of ``_KINDS``, and uids) with Spark's
    stateful operators (id, name, node; ``schemas(node)`` -> key and value schema) in
    pre-order; ConfigError for a uid given twice or named steps that cannot be paired."""
    named = [u for u in uids if u is not None]
    duplicates = sorted({u for u in named if named.count(u) > 1})
    if duplicates:
        raise ConfigError(f"operator uid {duplicates[0]!r} is given to more than one stateful "
                          "step; every uid must be unique in a job")
    paired = len(logical) == len(physical) and all(
        any(word in phys for word in _KINDS[kind])
        for kind, (_, phys, _) in zip(logical, physical, strict=True))
    if not paired:
        if named:
            raise ConfigError(
                "cannot pair the job's named stateful steps "
                f"({', '.join(logical) or 'none'}) with the stateful "
                f"operators Spark plans ({', '.join(p for _, p, _ in physical) or 'none'}): "
                "Spark's optimizer merged or removed a step. Give uids only to steps Spark "
                "keeps (e.g. do not aggregate an aggregate by the same key)")
        return [JobOperator(op_id, phys, "", None, *schemas(node))
                for op_id, phys, node in physical]
    return [JobOperator(op_id, phys, kind, u, *schemas(pnode))
            for kind, (op_id, phys, pnode), u in zip(logical, physical, uids, strict=True)]


# -- Spark Connect: the client's plan and the server's explain --------------------------------
#: attribute of a Connect client's plan node holding the uid :func:`uid` gave it
CONNECT_UID_ATTR = "_exactly_uid"
#: a physical operator of the explain text with its state info: name and ``opId``
_EXPLAIN_STATEFUL = re.compile(
    r"^[\s|:+\-!]*(?:\*\(\d+\)\s+)?!?(\w+).*\bstate info \[.*?\bopId = (\d+)")


def _connect_children(node: Any) -> list[Any]:
    """The child plans of a Connect client's plan node, in Catalyst's order (a join's left
    side first, a union's first input first; subquery references are no children)."""
    from pyspark.sql.connect.plan import LogicalPlan

    found: list[Any] = []
    for key, value in vars(node).items():
        if key == "_references":
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, LogicalPlan) and not any(item is f for f in found):
                found.append(item)
    return found


def _connect_streaming(node: Any) -> bool:
    """Whether the client's plan ``node`` reads a stream (a streaming source below it)."""
    if getattr(node, "_is_streaming", None):
        return True
    return any(_connect_streaming(child) for child in _connect_children(node))


def _connect_kind(node: Any) -> str | None:
    """The logical kind (a key of ``_KINDS``) of a client's plan node, None when stateless."""
    name = type(node).__name__
    if name == "Deduplicate":
        kind = "DeduplicateWithinWatermark" if node.within_watermark else "Deduplicate"
    elif name == "ApplyInPandasWithState":
        kind = "FlatMapGroupsInPandasWithState"
    elif name in ("Aggregate", "Join", "TransformWithStateInPySpark",
                  "TransformWithStateInPandas"):
        kind = name
    else:
        return None
    if kind == "Join":
        children = _connect_children(node)
        return kind if len(children) == 2 and all(map(_connect_streaming, children)) else None
    return kind if _connect_streaming(node) else None


def _connect_stateful(node: Any, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    kind = _connect_kind(node)
    if kind is not None:
        out.append((kind, node))
    for child in _connect_children(node):
        _connect_stateful(child, out)
    return out


def _connect_uid(name: str, df: DataFrame) -> DataFrame:
    found = _connect_stateful(df._plan, [])
    if not found and getattr(df._plan, "_is_streaming", None):
        raise ConfigError(f"exactly.uid({name!r}, df): naming a streaming source is not "
                          "supported on Spark Connect (the client's plan reaches the server "
                          "without it); run the job on a classic session, or keep its "
                          "sources and their order unchanged across restores")
    if not found:
        raise ConfigError(f"exactly.uid({name!r}, df): df has no stateful step (an "
                          "aggregation, dropDuplicates, transformWithState, a stream-stream "
                          "join ...) in the plan this Spark Connect client built; name the "
                          "DataFrame that a stateful step returns (a step inside spark.sql "
                          "text cannot be named on Spark Connect)")
    node = found[0][1]
    old = getattr(node, CONNECT_UID_ATTR, None)
    if old is not None and old != name:
        raise ConfigError(f"exactly.uid({name!r}, df): this step is already named {old!r}; a "
                          "step has one uid")
    setattr(node, CONNECT_UID_ATTR, name)
    return df


def explained_operators(explain: str) -> list[tuple[int, str]]:
    """``(operator id, physical name)`` of every stateful operator of a physical plan as
    Spark's ``explain`` prints it, in pre-order, once per id (the restore half of an
    aggregation shares its id)."""
    physical = explain.split("== Physical Plan ==", 1)[-1]
    found: list[tuple[int, str]] = []
    for line in physical.splitlines():
        match = _EXPLAIN_STATEFUL.match(line)
        if match is None:
            continue
        name, op_id = match.group(1), int(match.group(2))
        if any(name.startswith(s) for s in _SHARES_ID) or \
                op_id in {i for i, _ in found}:
            continue
        found.append((op_id, name))
    return found


def _connect_operators(df: DataFrame) -> list[JobOperator]:
    connect: Any = df  # a Connect DataFrame: its plan and the server's explain
    physical = explained_operators(connect._explain_string(extended=False))
    logical = _connect_stateful(connect._plan, [])
    uids = [getattr(node, CONNECT_UID_ATTR, None) for _, node in logical]
    return _paired([kind for kind, _ in logical], uids,
                   [(op_id, name, None) for op_id, name in physical],
                   lambda node: (None, None))


#: the operators of the job last started on a checkpoint (``exactly-job/operators.json``):
#: the uids a restore from that checkpoint (``-s CHECKPOINT``) maps state by
RECORD = "operators.json"


def record_operators(directory: LogStore | Path, operators: list[JobOperator],
                     sources: list[tuple[str, str | None]] | None = None) -> None:
    """Keep ``operators`` (and the job's ``sources``, :func:`job_sources`) in the job
    directory of a checkpoint (written at every start)."""
    data: dict[str, Any] = {"operators": [asdict(op) for op in operators]}
    if sources is not None:
        data["sources"] = [{"name": name, "uid": uid} for name, uid in sources]
    as_store(directory).write(RECORD, json.dumps(data, sort_keys=True, indent=1).encode())


def recorded_sources(directory: LogStore | Path) -> list[tuple[str, str | None]] | None:
    """The sources (name, uid) :func:`record_operators` kept, in Spark's order, or None
    when there is no readable record of them (a checkpoint written by an older exactly or
    without ``exactly run``: its sources are then matched by number)."""
    store = as_store(directory)
    raw = store.read(RECORD)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return [(str(s["name"]), s.get("uid")) for s in data["sources"]]
    except (ValueError, KeyError, TypeError):
        return None


def recorded_operators(directory: LogStore | Path) -> list[JobOperator] | None:
    """The operators :func:`record_operators` kept, or None when there is no readable record
    (a checkpoint not written by ``exactly run``: its operators have no uids)."""
    store = as_store(directory)
    raw = store.read(RECORD)
    if raw is None:
        return None
    data = parse_json(raw, store.describe(RECORD), repair="delete it: the restore then maps "
                      "state by Spark's operator numbers")
    if not isinstance(data, dict):
        return None
    try:
        return [JobOperator(**op) for op in data["operators"]]
    except (KeyError, TypeError):
        return None

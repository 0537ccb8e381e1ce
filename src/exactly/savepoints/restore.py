"""Restoring a savepoint into a new checkpoint, mapping operators by uid.

:func:`plan_restore` decides, before anything is written, what happens to every operator:

* **restored**: a savepoint operator whose uid (or, without uids, whose position and kind)
  matches an operator of the job. Its state moves to the job's operator number; it is
  *copied* when the partitions and the state backend stay, *rewritten* through Spark's
  providers (:mod:`~exactly.savepoints.state_writer`) when either changes, or *repartitioned*
  by Spark's own offline repartition (``transformWithState`` state, RocksDB only);
* **dropped**: a savepoint operator the job no longer has: refused unless
  ``allow_non_restored_state`` (Flink's ``--allow-non-restored-state``);
* **new**: a job operator the savepoint does not have: it starts with empty state (for
  aggregations and deduplications; other kinds are refused).

Every refusal happens here and names the operator, so a restore either writes a complete
checkpoint or nothing. :func:`restore_into` then writes the new checkpoint: a new query id,
the savepoint's offsets and commits (N-1, N) with the target partitions and state backend,
and state version N+1 of every restored and new operator. The savepoint is only read
(``no_claim``) unless the restore mode is ``claim``, which deletes it once the restore
completed.

The savepoint here is a local directory (one on S3 is downloaded first:
:mod:`exactly.ops.job_savepoints`); the new checkpoint is local or on S3 (``s3a://``): for
S3 it is written into a local staging directory (:func:`~.places.staging_dir`), Spark's providers
writing the state there as for a local one, and uploaded before the marker says done.

On a Spark Connect session the restore runs in the client: copies need no Spark, and what
needs Spark's state providers (a rewrite, Spark's repartition, a new operator's empty state)
runs in a child process with a classic local Spark (:mod:`~exactly.savepoints.rewrite`), so
the savepoint and the new checkpoint must be files of the client's host (local or shared).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.history import append_now
from exactly.checkpoint.layout import RESTORE_MARKER
from exactly.checkpoint.location import (
    checkpoint_uri,
    job_store,
    local_checkpoint,
    open_store,
)
from exactly.checkpoint.restore_marker import read_restore_marker
from exactly.checkpoint.store import is_remote
from exactly.checkpoint.transfer import delete_tree, upload_tree
from exactly.errors import SavepointError
from exactly.logs import log_event
from exactly.protocol.faults import FaultSpec, maybe_crash, register_point
from exactly.savepoints.engine import engine_change
from exactly.savepoints.manifest import CHECKPOINT_DIR, Manifest, OperatorInfo
from exactly.savepoints.metadata_files import edit_meta, relocate_schemas, renumber_v2
from exactly.savepoints.operators import JobOperator
from exactly.savepoints.places import staging_dir
from exactly.savepoints.sources import SourceMap, remap_offsets
from exactly.savepoints.take import PROVIDER_KEY, SHUFFLE_KEY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger("exactly.savepoints")

PROVIDERS = {
    "hashmap": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
#: Spark's physical operator -> the name its operator metadata records
METADATA_NAMES = {
    "StateStoreSave": "stateStoreSave",
    "StreamingDeduplicate": "dedupe",
    "StreamingDeduplicateWithinWatermark": "dedupeWithinWatermark",
    "TransformWithStateInPySpark": "transformWithStateInPandasExec",
    "TransformWithState": "transformWithStateExec",
    "StreamingSymmetricHashJoin": "symmetricHashJoin",
    "FlatMapGroupsWithState": "flatMapGroupsWithState",
    "SessionWindowStateStoreSave": "sessionWindowStateStoreSaveExec",
}
#: operators a restore can start empty: one default store, operator metadata version 1
EMPTY_START = ("stateStoreSave", "dedupe", "dedupeWithinWatermark")
#: crash point (``restore_into(fault=...)``, ``exactly run --fault``): state written, the
#: restore not yet recorded done
RESTORED_STATE = register_point("restore.state", on_driver=True,
                                description="restored state written, restore not recorded")


class RestoreMode(str, Enum):
    """Flink's restore modes: ``no_claim`` never changes the savepoint and does not depend
    on it afterwards; ``claim`` takes it over: it is deleted once the restore completed
    (files are copied first, so a crash while restoring can redo the restore)."""

    NO_CLAIM = "no_claim"
    CLAIM = "claim"


class Method(str, Enum):
    COPY = "copy"  # same partitions, same backend: the files, renumbered
    REWRITE = "rewrite"  # exactly's state writer: other partitions and/or backend
    REPARTITION = "repartition"  # Spark's offline repartition (RocksDB only)


@dataclass(frozen=True)
class Move:
    """A restored operator: savepoint operator -> job operator, and how."""

    old: OperatorInfo
    new: JobOperator
    method: Method


@dataclass
class RestorePlan:
    savepoint: Path
    manifest: Manifest
    partitions: int
    backend: str
    moves: list[Move] = field(default_factory=list)
    dropped: list[OperatorInfo] = field(default_factory=list)
    new: list[JobOperator] = field(default_factory=list)
    #: which savepoint position each job source resumes (None: copied as they are)
    sources: SourceMap | None = None
    #: what the restore converts from the savepoint's older Spark (None: the same Spark)
    engine: str | None = None

    @property
    def spark_repartition(self) -> bool:
        return any(m.method is Method.REPARTITION for m in self.moves)

    def describe(self) -> dict[str, Any]:
        return {"savepoint": str(self.savepoint), "epoch": self.manifest.epoch,
                "partitions": f"{self.manifest.shuffle_partitions}->{self.partitions}",
                "backend": f"{self.manifest.state_backend}->{self.backend}",
                "restored": [f"{m.old.label}: #{m.old.operator_id}->#{m.new.operator_id} "
                             f"({m.method.value})" for m in self.moves],
                "dropped": [o.label for o in self.dropped],
                "new": [o.uid or f"#{o.operator_id}" for o in self.new],
                **(self.sources.describe() if self.sources is not None else {}),
                **({"engine": self.engine} if self.engine else {})}


def _kind(op: JobOperator) -> str:
    return METADATA_NAMES.get(op.physical, op.physical)


def _match(manifest: Manifest, job_ops: list[JobOperator]) -> tuple[
        list[tuple[OperatorInfo, JobOperator]], list[OperatorInfo], list[JobOperator]]:
    """Pair savepoint operators with job operators: by uid; a savepoint operator without a
    uid (taken before the job named its steps) by its number, with a job operator of the same
    kind whose uid no savepoint operator has."""
    pairs: list[tuple[OperatorInfo, JobOperator]] = []
    taken: set[int] = set()
    unmatched: list[OperatorInfo] = []
    saved_uids = {op.uid for op in manifest.operators if op.uid is not None}
    by_uid = {op.uid: op for op in job_ops if op.uid is not None}
    by_id = {op.operator_id: op for op in job_ops if op.uid not in saved_uids}
    for old in sorted(manifest.operators, key=lambda o: o.uid is None):
        new = by_uid.get(old.uid) if old.uid is not None else by_id.get(old.operator_id)
        if new is None or new.operator_id in taken:
            unmatched.append(old)
            continue
        if _kind(new) != old.name:
            if old.uid is None:
                unmatched.append(old)
                continue
            raise SavepointError(
                f"operator {old.label} was a {old.name} in the savepoint and is a "
                f"{_kind(new)} in the job: a uid must keep naming the same kind of step; "
                "give the new step another uid")
        _check_schemas(old, new)
        pairs.append((old, new))
        taken.add(new.operator_id)
    new_ops = [op for op in job_ops if op.operator_id not in taken]
    return pairs, unmatched, new_ops


def _types(schema_json: str) -> list[str]:
    from pyspark.sql.types import StructType

    return [f.dataType.simpleString() for f in StructType.fromJson(json.loads(schema_json)).fields]


def _shown(schema_json: str) -> str:
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(schema_json)).simpleString()


def added_value_fields(old: OperatorInfo, new: JobOperator) -> list[dict[str, Any]]:
    """The value fields a named aggregation's state gains in the job (Spark JSON fields),
    or ``[]`` when its value schema is unchanged or unknown.

    Guarantee: a non-empty answer means the savepoint's value fields are, by position and
    type, the first fields of the job's, and every added field is nullable, so every old
    row is carried by appending nulls (:func:`evolve_values`). Raises SavepointError, with
    both schemas and what would make the restore possible, for any other change: a removed,
    reordered or retyped field, or an added non-nullable field (a ``count``'s buffer)."""
    store = old.stores[0] if len(old.stores) == 1 else None
    if store is None or not store.value_schema or not new.value_schema:
        return []
    before = json.loads(store.value_schema)["fields"]
    after = json.loads(new.value_schema)["fields"]
    if _types(store.value_schema) == _types(new.value_schema):
        return []
    shown = (f"from {_shown(store.value_schema)} (savepoint) to {_shown(new.value_schema)} "
             "(job)")
    if old.name != "stateStoreSave" or len(after) <= len(before) or \
            _types(store.value_schema) != _types(new.value_schema)[:len(before)]:
        raise SavepointError(
            f"operator {old.label}: its state value schema changed {shown}; only new "
            "aggregate columns added after the existing ones can be carried (with nullable "
            "buffers: max, min, sum, first, last...). Keep the existing aggregates in their "
            "order and types, or give the changed step a new uid (it then starts empty; "
            "restore with --allow-non-restored-state to drop the old one)")
    strict = [f["name"] for f in after[len(before):] if not f.get("nullable", True)]
    if strict:
        raise SavepointError(
            f"operator {old.label}: its state value schema changed {shown}; the new buffer "
            f"field(s) {', '.join(strict)} are non-nullable (a count's buffer is a non-null "
            "long), so the old rows have no value for them: Spark's initial value would count "
            "from the restore, not from the start. Add an aggregate with a nullable buffer "
            "(e.g. sum(F.lit(1)) instead of count), or give the changed step a new uid")
    return after[len(before):]


def evolve_values(rows: DataFrame, new_value_schema: str) -> DataFrame:
    """``rows`` (key, value as ``format("statestore")`` reads them) with their value in
    ``new_value_schema``: the old fields in place (renamed to the new names) and every
    added field null. Only call it after :func:`added_value_fields` accepted the change."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    target = StructType.fromJson(json.loads(new_value_schema))
    value_type = rows.schema["value"].dataType
    assert isinstance(value_type, StructType)
    # by position: two aggregates of one kind share a buffer name (sum, sum)
    count = len(value_type.fields)
    numbered = StructType([StructField(f"_{i}", f.dataType) for i, f in
                           enumerate(value_type.fields)])
    rows = rows.select("key", F.col("value").cast(numbered).alias("value"))
    fields = [F.col(f"value._{i}").cast(f.dataType).alias(f.name)
              for i, f in enumerate(target.fields[:count])]
    fields += [F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields[count:]]
    return rows.select("key", F.struct(*fields).alias("value"))


def _check_schemas(old: OperatorInfo, new: JobOperator) -> None:
    """Refuse a named step whose state key schema changed, or whose value schema changed
    in a way :func:`added_value_fields` cannot carry (as Spark would at its first epoch),
    before anything is written, showing both schemas."""
    if len(old.stores) != 1:
        return
    store = old.stores[0]
    before, after = store.key_schema, new.key_schema
    if before and after and _types(before) != _types(after):
        raise SavepointError(
            f"operator {old.label}: its state key schema changed from "
            f"{_shown(before)} (savepoint) to {_shown(after)} (job); Spark cannot read "
            "the old state with the new schema. Keep the step's state as it was, or give "
            "the changed step a new uid (it then starts empty; restore with "
            "--allow-non-restored-state to drop the old one)")
    added_value_fields(old, new)


def plan_restore(manifest: Manifest, savepoint: Path, job_ops: list[JobOperator], *,
                 partitions: int | None, backend: str,
                 allow_non_restored_state: bool = False,
                 spark_version: str | None = None) -> RestorePlan:
    """Decide every operator's fate (module docstring); raises SavepointError on what
    cannot be restored, naming the operator and the way out. ``spark_version``, the running
    Spark's, is checked against the savepoint's (exactly.savepoints.engine)."""
    if backend not in PROVIDERS:
        raise SavepointError(f"unknown state backend {backend!r}: hashmap | rocksdb")
    target = partitions or manifest.shuffle_partitions
    plan = RestorePlan(savepoint, manifest, target, backend)
    if spark_version is not None:
        plan.engine = engine_change(manifest.spark_version, spark_version)
    pairs, unmatched, plan.new = _match(manifest, job_ops)
    if unmatched and not allow_non_restored_state:
        names = ", ".join(o.label for o in unmatched)
        raise SavepointError(
            f"the savepoint holds state of operator(s) {names} that the job no longer has. "
            "Restore with --allow-non-restored-state to drop that state, or give the job's "
            "step the same uid (exactly.uid)")
    plan.dropped = unmatched
    for op in plan.new:
        if _kind(op) not in EMPTY_START:
            raise SavepointError(
                f"the job's operator {op.uid or '#' + str(op.operator_id)} ({op.physical}) is "
                "not in the savepoint, and only aggregations and deduplications can start "
                "empty in a restored job; restore the job without it, then add it from a "
                "fresh checkpoint")
    rescale = target != manifest.shuffle_partitions
    switch = backend != manifest.state_backend
    any_evolved = False
    for old, new in pairs:
        evolved = bool(added_value_fields(old, new))
        any_evolved = any_evolved or evolved
        if not rescale and not switch and not evolved:
            method = Method.COPY
        elif old.metadata_version == 1 and len(old.stores) == 1:
            method = Method.REWRITE
        elif manifest.state_backend == backend == "rocksdb":
            method = Method.REPARTITION
        else:
            raise SavepointError(
                f"operator {old.label} ({old.name}) cannot be restored into the "
                f"{backend} state backend from {manifest.state_backend}: only RocksDB holds "
                "its kind of state (transformWithState needs RocksDB; joins switch no backend)")
        if evolved and method is not Method.REWRITE:
            raise SavepointError(
                f"operator {old.label}: its new aggregate columns can only be carried by "
                "exactly's state writer, which this restore cannot use for it; restore "
                "without the new columns first, or with the same partitions and backend")
        plan.moves.append(Move(old, new, method))
    if plan.spark_repartition and any_evolved:
        raise SavepointError(
            "this restore rescales transformWithState state with Spark's repartition, which "
            "rewrites every operator as it was: it cannot add aggregate columns in the same "
            "restore. Restore with the old job version first (rescaled), then add the columns")
    if plan.spark_repartition:
        # Spark's repartition rewrites every operator of the checkpoint at once
        plan.moves = [Move(m.old, m.new, Method.REPARTITION) for m in plan.moves]
    return plan


# -- writing the new checkpoint ---------------------------------------------------------------
#: Spark's own files and folders at the top of a checkpoint
SPARK_NAMES = ("metadata", "offsets", "commits", "state", "sources")


def _is_fresh(checkpoint: str) -> bool:
    """No Spark file under the checkpoint (local or on S3)."""
    if not is_remote(checkpoint):
        directory = local_checkpoint(checkpoint)
        return directory is None or not directory.exists() or not any(
            p.name in SPARK_NAMES for p in directory.iterdir())
    return not any(open_store(checkpoint, name).any() for name in SPARK_NAMES[1:]) and \
        not open_store(checkpoint).exists("metadata")


def _clear_spark_files(checkpoint: str) -> None:
    """Delete Spark's files (not ``exactly-job``): what an interrupted restore wrote, or
    the query's an upgrade replaces."""
    if not is_remote(checkpoint):
        directory = local_checkpoint(checkpoint)
        assert directory is not None
        for name in SPARK_NAMES:
            target = directory / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        # Hadoop's checksum of a query's metadata (an upgrade replaces that query's files)
        (directory / ".metadata.crc").unlink(missing_ok=True)
        return
    store = open_store(checkpoint)
    store.delete("metadata")  # first: no half-deleted checkpoint looks like a query's
    for name in SPARK_NAMES[1:]:
        delete_tree(store, name)


@contextlib.contextmanager
def _staging(checkpoint: str) -> Iterator[Path]:
    """Where the new checkpoint's files are written: the local checkpoint itself, or for
    one on S3 a local directory of this host named after it
    (:func:`~exactly.savepoints.places.staging_dir`), uploaded by the caller."""
    if not is_remote(checkpoint):
        directory = local_checkpoint(checkpoint)
        assert directory is not None
        directory.mkdir(parents=True, exist_ok=True)
        yield directory
        return
    with staging_dir(checkpoint, "restoring") as directory:
        yield directory


def read_marker(checkpoint: str) -> dict[str, Any] | None:
    """The restore marker ``exactly-job/restore.json`` of a checkpoint (local or on S3):
    ``{"state": "in-progress" | "done", "savepoint": ..., "query_id": ...}``, or None."""
    return read_restore_marker(job_store(checkpoint))


def mark_in_progress(checkpoint: str, savepoint: str, epoch: int,
                     query_id: str | None = None,
                     upgrade: dict[str, Any] | None = None) -> str:
    """Record in ``checkpoint``'s marker that its restore of ``savepoint`` (epoch ``epoch``)
    is in progress, as query ``query_id`` (None: a new one), for the upgrade ``upgrade``
    (``exactly upgrade``'s job files) if any; returns the query id. From then on the next
    attempt replaces whatever Spark files the checkpoint holds with the savepoint's, and a
    driver without that restore refuses to start on it."""
    query_id = query_id or str(uuid.uuid4())
    marker = {"state": "in-progress", "savepoint": savepoint, "epoch": epoch,
              "query_id": query_id, **({"upgrade": upgrade} if upgrade else {})}
    job_store(checkpoint).write(RESTORE_MARKER, _json(marker))
    return query_id


def _rewrite_offsets(text: str, conf: dict[str, str]) -> str:
    return edit_meta(text, lambda meta: meta.setdefault("conf", {}).update(conf))


def _v1_metadata(op_id: int, name: str, stores: list[str], partitions: int) -> str:
    info = {"operatorInfo": {"operatorId": op_id, "operatorName": name},
            "stateStoreInfo": [{"storeName": s, "numColsPrefixKey": 0,
                                "numPartitions": partitions} for s in stores]}
    return "v1\n" + json.dumps(info, separators=(",", ":"))


def _copy_operator(src_op: Path, dst_op: Path, new_id: int, new_root: str) -> None:
    for path in sorted(p for p in src_op.rglob("*") if p.is_file()):
        relative = path.relative_to(src_op)
        target = dst_op / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.parts[:1] == ("_metadata",) and relative.name == "metadata":
            target.write_text(edit_meta(path.read_text(), lambda meta: meta[
                "operatorInfo"].update(operatorId=new_id)))
        elif relative.parts[:2] == ("_metadata", "v2"):
            target.write_text(renumber_v2(path.read_text(), new_root, new_id))
        else:
            shutil.copyfile(path, target)


def restore_into(spark: SparkSession, plan: RestorePlan, checkpoint: str | Path, *,
                 mode: RestoreMode = RestoreMode.NO_CLAIM, query_id: str | None = None,
                 before_done: Callable[[], dict[str, Any]] | None = None,
                 origin: str | None = None,
                 restored_from: str = "savepoint",
                 fault: FaultSpec | None = None) -> dict[str, Any]:
    """Write the new checkpoint at ``checkpoint`` (a local directory or ``s3a://``) as
    ``plan`` says; returns what was done.

    The checkpoint must be new (no ``metadata``, ``offsets``, ``commits``, ``state``,
    ``sources``). A marker in ``exactly-job/restore.json`` records the restore; a crash
    before it says done leaves a marker the next attempt recognises: it deletes what the
    interrupted attempt wrote and redoes the restore from scratch, with the same query id.
    ``before_done`` runs last, before the marker says done (the sink's take-over); what it
    returns is recorded. ``origin`` is what the marker names as restored (default: the
    savepoint); ``restored_from`` (``savepoint`` or ``checkpoint``) what the history's
    ``restore`` record calls it. ``fault`` arms the crash point :data:`RESTORED_STATE` for
    the crash tests.

    Nothing of this is atomic but each write of the marker: the files are written one by
    one (for a checkpoint on S3, into a local staging directory of this host with Spark's
    providers, then uploaded, ``metadata`` last), and only the marker's ``done`` makes them
    a checkpoint a job runs on; until then the next attempt starts over."""
    target = str(checkpoint)
    jobs = job_store(target)
    previous = read_restore_marker(jobs)
    if previous is not None and previous.get("state") == "in-progress":
        _clear_spark_files(target)
    if not _is_fresh(target):
        raise SavepointError(
            f"{target} already holds a query's checkpoint: a savepoint is restored into a new "
            "checkpoint directory (give another --checkpoint)")
    # an `exactly upgrade` marks its restore before it starts (exactly.ops.upgrade): kept
    upgrade = previous.get("upgrade") if previous else None
    query_id = mark_in_progress(target, origin or str(plan.savepoint), plan.manifest.epoch,
                                query_id, upgrade)
    with _staging(target) as dest:
        _write(spark, plan, dest, query_id)
        _remap_sources(plan, dest)
        if is_remote(target):
            relocate_schemas(dest, checkpoint_uri(target))
            upload_tree(dest, open_store(target), last=["metadata"])
    manifest = plan.manifest
    epoch = manifest.epoch
    maybe_crash(fault, RESTORED_STATE, epoch)
    sink = before_done() if before_done is not None else {}
    done = {"state": "done", "epoch": epoch,
            "query_id": query_id, "savepoint_query_id": manifest.query_id,
            "mode": mode.value, **plan.describe(), **sink,
            "savepoint": origin or str(plan.savepoint)}
    if upgrade:
        done["upgrade"] = upgrade
    jobs.write(RESTORE_MARKER, _json(done))
    append_now(target, {"kind": "restore", "source": restored_from,
                        "path": done["savepoint"], "epoch": epoch, "mode": mode.value,
                        "query_id": query_id, "plan": plan.describe()})
    if mode is RestoreMode.CLAIM:  # the job has taken the savepoint over: not restored again
        shutil.rmtree(plan.savepoint, ignore_errors=True)
    log_event(logger, "savepoint_restored", checkpoint=target, **plan.describe())
    return done


def _remap_sources(plan: RestorePlan, dest: Path) -> None:
    """Put the written checkpoint ``dest``'s source positions in the job's order
    (``plan.sources``): offsets N-1 and N get one line per job source (``-`` for a new
    one, which Spark then starts from its configured start) and ``sources/<i>`` holds the
    metadata of the savepoint source job source ``i`` resumes; a dropped source's is left
    out. Nothing changes when every source keeps its number."""
    if plan.sources is None or plan.sources.identity:
        return
    for n in (plan.manifest.epoch - 1, plan.manifest.epoch):
        path = dest / "offsets" / str(n)
        if path.is_file():
            path.write_text(remap_offsets(path.read_text(), plan.sources))
            (dest / "offsets" / f".{n}.crc").unlink(missing_ok=True)
    saved = plan.savepoint / CHECKPOINT_DIR / "sources"
    shutil.rmtree(dest / "sources", ignore_errors=True)
    for i, j in enumerate(plan.sources.resumed_from):
        if j is not None and (saved / str(j)).is_dir():
            shutil.copytree(saved / str(j), dest / "sources" / str(i))


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, indent=1).encode()


def _write(spark: SparkSession, plan: RestorePlan, dest: Path, query_id: str) -> None:
    """:func:`write_checkpoint` in this process, or for a Spark Connect session whose
    restore needs Spark's state providers, in a child process with a classic local Spark
    (:mod:`~exactly.savepoints.rewrite`)."""
    from exactly.savepoints import rewrite
    from exactly.spark.connect import is_connect

    if is_connect(spark) and needs_spark(plan):
        rewrite.write_in_child(plan, dest, query_id)
    else:
        write_checkpoint(spark, plan, dest, query_id)


def needs_spark(plan: RestorePlan) -> bool:
    """Whether writing ``plan``'s checkpoint needs Spark (a rewrite, Spark's repartition, or
    an operator that starts empty) rather than copies of the savepoint's files."""
    return bool(plan.new) or any(m.method is not Method.COPY for m in plan.moves)


def write_checkpoint(spark: SparkSession, plan: RestorePlan, dest: Path,
                     query_id: str) -> None:
    """Write the restored checkpoint's files into the local directory ``dest`` (``spark``:
    a classic session, unless every operator is copied and none starts empty)."""
    from exactly.savepoints import state_writer

    manifest = plan.manifest
    source = plan.savepoint / CHECKPOINT_DIR
    epoch = manifest.epoch
    repartition = plan.spark_repartition
    # Spark's repartition starts from the savepoint's own partitions and backend
    partitions = manifest.shuffle_partitions if repartition else plan.partitions
    conf = {SHUFFLE_KEY: str(partitions), PROVIDER_KEY: PROVIDERS[plan.backend]}
    (dest / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for log in ("offsets", "commits"):
        (dest / log).mkdir(exist_ok=True)
        for n in (epoch - 1, epoch):
            path = source / log / str(n)
            if not path.is_file():
                continue
            text = path.read_text()
            (dest / log / str(n)).write_text(_rewrite_offsets(text, conf) if log == "offsets"
                                             else text)
    if (source / "sources").is_dir():
        shutil.copytree(source / "sources", dest / "sources")
    state_conf = {**manifest.sql_conf, **conf}
    new_root = "file:" + str(dest.absolute())
    for move in plan.moves:
        src_op = source / "state" / str(move.old.operator_id)
        dst_op = dest / "state" / str(move.new.operator_id)
        if move.method in (Method.COPY, Method.REPARTITION):
            _copy_operator(src_op, dst_op, move.new.operator_id, new_root)
            continue
        store = move.old.stores[0].name
        rows = (spark.read.format("statestore").option("batchId", epoch)
                .option("operatorId", move.old.operator_id).option("storeName", store)
                .load(str(source)))
        evolved = bool(added_value_fields(move.old, move.new))
        if evolved:
            assert move.new.value_schema is not None
            rows = evolve_values(rows, move.new.value_schema)
        written = state_writer.write_store(
            spark, state_writer.with_partitions(rows, plan.partitions),
            f"{new_root}/state", move.new.operator_id, store, epoch + 1, plan.partitions,
            state_conf)
        if written != move.old.stores[0].rows:
            raise SavepointError(f"operator {move.old.label}: wrote {written} state rows, the "
                                 f"savepoint holds {move.old.stores[0].rows}")
        (dst_op / "_metadata").mkdir(parents=True, exist_ok=True)
        (dst_op / "_metadata" / "metadata").write_text(_v1_metadata(
            move.new.operator_id, move.old.name, [store], plan.partitions))
        schema = src_op / "0" / "_metadata" / "schema"
        if schema.is_file() and not evolved:  # evolved: Spark writes the new one at start
            (dst_op / "0" / "_metadata").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(schema, dst_op / "0" / "_metadata" / "schema")
    version = epoch + 1
    if repartition:
        spark._streamingCheckpointManager.repartition(new_root, plan.partitions)
        version = epoch + 2  # Spark's repartition batch N+1 holds state version N+2
        state_conf = {**state_conf, SHUFFLE_KEY: str(plan.partitions)}
        for op_dir in (dest / "state").iterdir():  # partitions the new count no longer has
            for part in op_dir.iterdir():
                if part.name.isdigit() and int(part.name) >= plan.partitions:
                    shutil.rmtree(part)
            v1 = op_dir / "_metadata" / "metadata"  # Spark updates only versioned metadata
            if v1.is_file():
                v1.write_text(edit_meta(v1.read_text(), lambda meta: [
                    store.update(numPartitions=plan.partitions)
                    for store in meta.get("stateStoreInfo", [])]))
    for op in plan.new:
        state_writer.write_store(spark, state_writer.empty_rows(spark), f"{new_root}/state",
                                 op.operator_id, "default", version, plan.partitions,
                                 state_conf)
        meta = dest / "state" / str(op.operator_id) / "_metadata"
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "metadata").write_text(_v1_metadata(op.operator_id, _kind(op), ["default"],
                                                    plan.partitions))

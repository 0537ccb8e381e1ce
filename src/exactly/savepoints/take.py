"""Taking a savepoint: a self-contained copy of a checkpoint's last completed epoch.

What is copied for epoch N (the newest epoch with a ``commits/N`` entry):

* ``metadata``, ``offsets/`` and ``commits/`` N-1 and N (Spark restarts from the last two
  offsets entries), ``sources/`` entries up to N;
* for every stateful operator and state store, the files that load state version N+1 (the
  state after epoch N) and nothing newer: for the hashmap provider the newest snapshot at or
  below N+1 and the deltas after it; for RocksDB ``N+1.zip``, or with changelog checkpointing
  the newest zip below it and the changelogs after it, or, before Spark uploaded any
  snapshot of the store, changelogs 1..N+1 alone; the SST files the zip lists; the
  operator's metadata and schema files.

Checksum files (``.crc``) are not copied: the manifest's SHA-256 of every file replaces them.
Files of a completed epoch never change, so this runs while the job keeps running; Spark
deletes old versions only after ``minBatchesToRetain`` (100) newer epochs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import time
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.history import append_now
from exactly.checkpoint.spark_files import batch_numbers, local_checkpoint, read_offsets
from exactly.config import StateBackend
from exactly.errors import SavepointError
from exactly.logs import log_event
from exactly.protocol.faults import FaultSpec, maybe_crash, register_point
from exactly.savepoints.manifest import (
    CHECKPOINT_DIR,
    Manifest,
    OperatorInfo,
    SinkInfo,
    StoreInfo,
    inprogress_dir,
    publish,
    write_manifest,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.savepoints.operators import JobOperator

logger = logging.getLogger("exactly.savepoints")

#: crash points of taking a savepoint (armed by ``take_savepoint(fault=...)``, ``exactly run
#: --fault``), for the crash tests
COPIED = register_point("savepoint.copied", on_driver=True,
                        description="savepoint files copied, no manifest yet")
WRITTEN = register_point("savepoint.written", on_driver=True,
                         description="manifest written, not yet renamed to its final name")

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
SHUFFLE_KEY = "spark.sql.shuffle.partitions"
FORMAT_VERSION_KEY = "spark.sql.streaming.stateStore.checkpointFormatVersion"
_VERSION_FILE = re.compile(r"^(\d+)\.(delta|snapshot|zip|changelog)$")


def last_completed_epoch(checkpoint: Path) -> int | None:
    """The newest epoch with both an ``offsets`` and a ``commits`` entry."""
    commits = set(batch_numbers(str(checkpoint), "commits"))
    offsets = set(batch_numbers(str(checkpoint), "offsets"))
    done = sorted(commits & offsets)
    return done[-1] if done else None


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.endswith(".crc")
                  and not p.name.startswith("."))


def _store_dirs(partition: Path) -> list[Path]:
    """The directories holding version files of a partition (the partition itself for the
    default store, a sub-directory per named store, e.g. a join's four stores)."""
    dirs = [partition] if any(_VERSION_FILE.match(p.name) for p in partition.iterdir()) else []
    for sub in sorted(p for p in partition.iterdir() if p.is_dir()):
        if sub.name not in ("_metadata", "SSTs") and any(
                _VERSION_FILE.match(p.name) for p in sub.iterdir()):
            dirs.append(sub)
    return dirs


def _versions(store: Path) -> dict[int, dict[str, Path]]:
    found: dict[int, dict[str, Path]] = {}
    for path in store.iterdir():
        match = _VERSION_FILE.match(path.name)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = path
    return found


def _needed_files(store: Path, version: int) -> list[Path]:
    """The files of ``store`` that load ``version`` and nothing newer."""
    versions = _versions(store)
    if any("zip" in kinds or "changelog" in kinds for kinds in versions.values()):
        return _rocksdb_files(store, versions, version)
    return _chain(store, versions, version, "snapshot", "delta")


def _chain(store: Path, versions: dict[int, dict[str, Path]], version: int, base_kind: str,
           step_kind: str) -> list[Path]:
    """The newest ``base_kind`` file at or below ``version`` (none: the chain starts at
    version 0) and the ``step_kind`` file of every version after it up to ``version``."""
    bases = [v for v, kinds in versions.items() if base_kind in kinds and v <= version]
    base = max(bases) if bases else 0
    files = [versions[base][base_kind]] if bases else []
    for v in range(base + 1, version + 1):
        step = versions.get(v, {}).get(step_kind)
        if step is None:
            raise SavepointError(f"state version {version} of {store} cannot be loaded: "
                                 f"{v}.{step_kind} is missing (deleted by Spark's retention?)")
        files.append(step)
    return files


def _rocksdb_files(store: Path, versions: dict[int, dict[str, Path]],
                   version: int) -> list[Path]:
    """RocksDB: ``version.zip`` or, with changelog checkpointing, the newest zip below it and
    the changelogs after it, or with no zip at or below it (Spark uploads snapshots late, from
    its maintenance thread) empty state and changelogs 1..``version``; plus the SST files the
    zip lists (a changelog holds its rows itself)."""
    files = _chain(store, versions, version, "zip", "changelog")
    if files and files[0].name.endswith(".zip"):
        for sst in _zip_metadata(files[0]).get("sstFiles", []):
            path = store / "SSTs" / sst["dfsSstFileName"]
            if not path.is_file():
                raise SavepointError(f"state version {version} of {store} lists {path.name}, "
                                     "which is missing")
            files.append(path)
    return files


def _zip_metadata(archive_path: Path) -> dict[str, Any]:
    """The JSON of a RocksDB snapshot's ``metadata`` entry (line 2: SST files, key count)."""
    with zipfile.ZipFile(archive_path) as archive:
        lines = archive.read("metadata").decode().split("\n")
    return dict(json.loads(lines[1]))


def copy_epoch(checkpoint: Path, epoch: int, dest: Path, partitions: int) -> None:
    """Copy what Spark needs to restart after ``epoch`` from ``checkpoint`` to ``dest``
    (state partitions 0..``partitions``-1: a rescaled checkpoint keeps stale higher ones)."""
    dest.mkdir(parents=True, exist_ok=True)
    _copy(checkpoint / "metadata", dest / "metadata")
    for log in ("offsets", "commits"):
        for n in (epoch - 1, epoch):
            if n >= 0 and (checkpoint / log / str(n)).is_file():
                _copy(checkpoint / log / str(n), dest / log / str(n))
    sources = checkpoint / "sources"
    if sources.is_dir():
        for path in _data_files(sources):
            if not path.name.isdigit() or int(path.name) <= epoch:
                _copy(path, dest / path.relative_to(checkpoint))
    state = checkpoint / "state"
    if not state.is_dir():
        return
    version = epoch + 1
    for op_dir in sorted(p for p in state.iterdir() if p.is_dir() and p.name.isdigit()):
        for meta_name in ("_metadata", "_stateSchema"):
            meta = op_dir / meta_name
            if meta.is_dir():
                for path in _data_files(meta):
                    if meta_name == "_metadata" and path.parent.name == "v2" and (
                            path.name.isdigit() and int(path.name) > epoch):
                        continue
                    _copy(path, dest / path.relative_to(checkpoint))
        for part in sorted(p for p in op_dir.iterdir() if p.is_dir() and p.name.isdigit()
                           and int(p.name) < partitions):
            schema_dir = part / "_metadata"
            if schema_dir.is_dir():
                for path in _data_files(schema_dir):
                    _copy(path, dest / path.relative_to(checkpoint))
            for store in _store_dirs(part):
                for path in _needed_files(store, version):
                    _copy(path, dest / path.relative_to(checkpoint))


def operator_infos(spark: SparkSession, location: Path, epoch: int,
                   operators: list[JobOperator] | None) -> list[OperatorInfo]:
    """The stateful operators of the checkpoint at ``location`` (a savepoint's copy), with
    row counts and sizes read back from it (reading proves the copy loads)."""
    if not (location / "state").is_dir():
        return []
    uids = {op.operator_id: op.uid for op in operators or []}
    meta = spark.read.format("state-metadata").option("batchId", epoch).load(str(location))
    infos: dict[int, OperatorInfo] = {}
    for row in meta.collect():
        op_id = int(row["operatorId"])
        info = infos.setdefault(op_id, OperatorInfo(
            operator_id=op_id, name=str(row["operatorName"]),
            partitions=int(row["numPartitions"]), uid=uids.get(op_id),
            metadata_version=2 if row["operatorProperties"] else 1))
        store = StoreInfo(name=str(row["stateStoreName"]))
        if info.metadata_version == 1:
            df = (spark.read.format("statestore").option("batchId", epoch)
                  .option("operatorId", op_id).option("storeName", store.name)
                  .load(str(location)))
            store.key_schema = df.schema["key"].dataType.json()
            store.value_schema = df.schema["value"].dataType.json()
            store.rows = df.count()
        else:
            store.rows = _keyed_rows(spark, location, epoch, info,
                                     str(row["operatorProperties"]))
        info.stores.append(store)
    for info in infos.values():
        _store_sizes(location / "state" / str(info.operator_id), info.stores)
    return [infos[k] for k in sorted(infos)]


def _keyed_rows(spark: SparkSession, location: Path, epoch: int, info: OperatorInfo,
                properties: str) -> int:
    """The keys of a ``transformWithState`` operator at ``epoch``: RocksDB's key count from
    the version's snapshot of every partition, or, with changelog checkpointing (a
    partition's version is a changelog, on an older snapshot or on none), the keys of each
    state variable read back through Spark's state reader."""
    op_id = info.operator_id
    snapshots = list((location / "state" / str(op_id)).rglob(f"{epoch + 1}.zip"))
    if snapshots and len(snapshots) == info.partitions:
        return sum(int(_zip_metadata(path).get("numKeys", 0)) for path in snapshots)
    variables = json.loads(properties or "{}").get("stateVariables", [])
    names = [str(v["stateName"]) for v in variables
             if not str(v.get("stateName", "$")).startswith("$")]  # $: Spark's timers, TTLs
    return sum(spark.read.format("statestore").option("batchId", epoch)
               .option("operatorId", op_id).option("stateVarName", name)
               .load(str(location)).select("key").distinct().count() for name in names)


def _store_sizes(op_path: Path, stores: list[StoreInfo]) -> None:
    """Bytes on disk per store: the whole operator for a single store, else the files of
    each named store's directories (``<partition>/<store>/``, e.g. a join's four)."""
    def size(paths) -> int:
        return sum(p.stat().st_size for p in paths if p.is_file())

    if len(stores) == 1:
        stores[0].bytes = size(op_path.rglob("*"))
        return
    for store in stores:
        store.bytes = size(op_path.glob(f"*/{store.name}/**/*"))


def take_savepoint(spark: SparkSession, checkpoint: str, target: str | os.PathLike[str], *,
                   operators: list[JobOperator] | None = None,
                   sinks: list[SinkInfo] | None = None, trigger: str = "savepoint",
                   job: dict[str, Any] | None = None, record: bool = True,
                   fault: FaultSpec | None = None) -> Path:
    """Take a savepoint of ``checkpoint``'s last completed epoch under ``target``; returns
    its directory (``target/savepoint-<epoch>-<id>``). ``record`` adds a ``savepoint``
    record to the checkpoint's history (off where the checkpoint must stay unwritten: a
    retained checkpoint being restored). ``fault`` arms a crash point (:data:`COPIED`,
    :data:`WRITTEN`) for the crash tests.

    Safe while the query runs. Raises SavepointError when no epoch has completed yet, the
    checkpoint is not local, or a state version cannot be copied. A crash leaves only a
    ``.inprogress`` directory, which restores refuse.
    """
    started = time.monotonic()
    local = local_checkpoint(checkpoint)
    if local is None or not local.is_dir():
        raise SavepointError(f"savepoints need a local checkpoint directory; {checkpoint} is "
                             "not one")
    epoch = last_completed_epoch(local)
    if epoch is None:
        raise SavepointError(f"the job on {checkpoint} has not completed an epoch yet: a "
                             "savepoint holds a completed epoch; try again after the first")
    entry = read_offsets(str(local), epoch)
    if entry is None:
        raise SavepointError(f"offsets/{epoch} of {checkpoint} vanished while taking the "
                             "savepoint (the checkpoint was deleted or cleaned)")
    conf = {str(k): str(v) for k, v in entry.metadata.get("conf", {}).items()}
    if conf.get(FORMAT_VERSION_KEY, "1") != "1":
        raise SavepointError("savepoints support state checkpoint format version 1 (Spark's "
                             f"default); this checkpoint uses {conf[FORMAT_VERSION_KEY]}")
    savepoint_id = uuid.uuid4().hex[:12]
    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    work = inprogress_dir(root, epoch, savepoint_id)
    work.mkdir()
    copy_epoch(local, epoch, work / CHECKPOINT_DIR, int(conf.get(SHUFFLE_KEY, "200")))
    maybe_crash(fault, COPIED, epoch)
    infos = operator_infos(spark, work / CHECKPOINT_DIR, epoch, operators)
    query_id = json.loads((local / "metadata").read_text())["id"]
    provider = conf.get(PROVIDER_KEY, "HDFSBackedStateStoreProvider")
    manifest = Manifest(
        savepoint_id=savepoint_id, epoch=epoch,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        query_id=query_id, trigger=trigger, spark_version=spark.version,
        shuffle_partitions=int(conf.get(SHUFFLE_KEY, "200")),
        state_backend=StateBackend.of_provider(provider).value, sql_conf=conf,
        sources=[{"index": i, "offset": s} for i, s in enumerate(entry.input.sources)],
        operators=infos, sinks=list(sinks or []), job=dict(job or {}))
    write_manifest(work, manifest)
    maybe_crash(fault, WRITTEN, epoch)
    final = publish(work)
    size = sum(f["size"] for f in manifest.files)
    log_event(logger, "savepoint_taken", path=str(final), epoch=epoch,
              operators=len(infos), rows=sum(s.rows for o in infos for s in o.stores),
              bytes=size)
    if record:
        append_now(local, {"kind": "savepoint", "epoch": epoch, "path": str(final),
                           "savepoint_id": savepoint_id, "trigger": trigger,
                           "bytes": size, "query_id": query_id,
                           "duration_ms": round((time.monotonic() - started) * 1000, 1)})
    return final

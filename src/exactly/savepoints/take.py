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
deletes old versions only after ``minBatchesToRetain`` (100) newer epochs (a file deleted
while it is copied makes the copy start over: :func:`copy_epoch`).

The checkpoint may be local or on S3 (``s3a://``), and so may the target (``s3://``): the
files are copied into a local directory (the savepoint's own for a local target, a temporary
one for S3), Spark reads the copy back there (row counts; this proves it loads), and a
savepoint for S3 is then uploaded, its manifest last (:func:`upload_savepoint`).

On a Spark Connect session the same runs in the client: the copy is this host's file work and
the read-back is a batch read (``format("state-metadata")``, ``format("statestore")``) the
server runs on the copy's path, so the server must see that path (a Connect server on this
host, or a file system both share: the condition of a checkpoint on Connect already).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.history import append_now
from exactly.checkpoint.location import local_checkpoint, location_uri, open_store
from exactly.checkpoint.spark_files import batch_numbers, read_metadata, read_offsets
from exactly.checkpoint.store import LogStore, is_remote
from exactly.checkpoint.transfer import fetch_all
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
    upload_savepoint,
    write_manifest,
)
from exactly.savepoints.metadata_files import relocate_schemas, v2_files

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
#: how often a savepoint lists and copies a checkpoint's files when some vanish meanwhile
COPY_ATTEMPTS = 3


def last_completed_epoch(checkpoint: str | os.PathLike[str]) -> int | None:
    """The newest epoch with both an ``offsets`` and a ``commits`` entry (a local
    checkpoint or one on S3)."""
    commits = set(batch_numbers(os.fspath(checkpoint), "commits"))
    offsets = set(batch_numbers(os.fspath(checkpoint), "offsets"))
    done = sorted(commits & offsets)
    return done[-1] if done else None


class _StateFileMissing(SavepointError):
    """A file a state version needs is not (or no longer) there."""


def restorable_epochs(checkpoint: str | os.PathLike[str]) -> list[int]:
    """The completed epochs of ``checkpoint`` (local or on S3) that a restore can still
    start from (``exactly run -s CHECKPOINT@N``), oldest first: those whose ``offsets`` and
    ``commits`` entries are there and whose every state version loads from the files still
    present. Spark keeps the logs and state files of the last ``minBatchesToRetain`` epochs
    (100 by default) and deletes older ones in its maintenance, so this is a moving window;
    the list is read once and may be one epoch stale by the time a restore copies it (the
    copy then names the file that vanished)."""
    store = open_store(os.fspath(checkpoint))
    folders = _listing(store)
    completed = sorted({int(n) for n in folders.get("commits", ()) if n.isdigit()}
                       & {int(n) for n in folders.get("offsets", ()) if n.isdigit()})
    if not completed:
        return []
    entry = read_offsets(os.fspath(checkpoint), completed[-1])
    conf = entry.metadata.get("conf", {}) if entry is not None else {}
    partitions = int(conf.get(SHUFFLE_KEY, "200"))
    found = []
    for epoch in completed:
        try:
            epoch_files(folders, epoch, partitions)
        except _StateFileMissing:
            continue
        found.append(epoch)
    return found


def spans(epochs: list[int]) -> str:
    """``3..7, 9`` for [3, 4, 5, 6, 7, 9] (``none`` for no epoch)."""
    if not epochs:
        return "none"
    parts, start = [], epochs[0]
    for prev, cur in zip(epochs, [*epochs[1:], None], strict=True):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}..{prev}")
            start = cur if cur is not None else start
    return ", ".join(parts)


def _pick_epoch(checkpoint: str, epoch: int | None) -> int:
    """``epoch`` when it is a completed epoch of ``checkpoint`` still retained there, or
    with None the last completed one; raises SavepointError naming the epochs that are."""
    last = last_completed_epoch(checkpoint)
    if last is None:
        raise SavepointError(f"the job on {checkpoint} has not completed an epoch yet: a "
                             "savepoint holds a completed epoch; try again after the first")
    if epoch is None:
        return last
    restorable = restorable_epochs(checkpoint)
    if epoch not in restorable:
        why = ("it has not completed" if epoch > last else
               "it is no longer retained (Spark keeps the last minBatchesToRetain epochs, "
               "100 by default)")
        raise SavepointError(f"epoch {epoch} of {checkpoint} cannot be restored: {why}; the "
                             f"epochs that can: {spans(restorable)} (`exactly checkpoints "
                             f"{checkpoint}` lists them)")
    return epoch


def _is_data(name: str) -> bool:
    """Not a checksum or a temporary file (their names start with a dot)."""
    return not name.rsplit("/", 1)[-1].startswith(".") and not name.endswith(".crc")


def _listing(store: LogStore) -> dict[str, set[str]]:
    """The checkpoint's data files, as folder -> file names (the root folder is ``""``)."""
    names = [n for n in store.list_tree("state") if _is_data(n)]
    found = [f"state/{n}" for n in names]
    found += [f"sources/{n}" for n in store.list_tree("sources") if _is_data(n)]
    found += [f"{log}/{n}" for log in ("offsets", "commits") for n in store.list(log)
              if _is_data(n)]
    if store.exists("metadata"):
        found.append("metadata")
    folders: dict[str, set[str]] = {}
    for name in found:
        folder, _, base = name.rpartition("/")
        folders.setdefault(folder, set()).add(base)
    return folders


def _subfolders(folders: dict[str, set[str]], folder: str) -> list[str]:
    """The names of the folders directly in ``folder`` that hold files at some depth."""
    prefix = folder + "/"
    return sorted({f[len(prefix):].split("/", 1)[0] for f in folders if f.startswith(prefix)})


def _below(folders: dict[str, set[str]], folder: str) -> list[str]:
    """Every file at any depth below ``folder``."""
    return sorted(f"{f}/{b}" for f, bases in folders.items()
                  if f == folder or f.startswith(folder + "/") for b in bases)


def _store_dirs(folders: dict[str, set[str]], partition: str) -> list[str]:
    """The folders holding version files of a partition (the partition itself for the
    default store, a sub-folder per named store, e.g. a join's four stores)."""
    def has_versions(folder: str) -> bool:
        return any(_VERSION_FILE.match(b) for b in folders.get(folder, ()))

    dirs = [partition] if has_versions(partition) else []
    dirs += [f"{partition}/{sub}" for sub in _subfolders(folders, partition)
             if sub not in ("_metadata", "SSTs") and has_versions(f"{partition}/{sub}")]
    return dirs


def _versions(folders: dict[str, set[str]], store: str) -> dict[int, dict[str, str]]:
    found: dict[int, dict[str, str]] = {}
    for base in folders.get(store, ()):
        match = _VERSION_FILE.match(base)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = f"{store}/{base}"
    return found


def _needed_files(folders: dict[str, set[str]], store: str, version: int) -> list[str]:
    """The files of ``store`` that load ``version`` and nothing newer (but the SST files a
    RocksDB snapshot lists: :func:`_sst_files`)."""
    versions = _versions(folders, store)
    if any("zip" in kinds or "changelog" in kinds for kinds in versions.values()):
        # RocksDB: ``version.zip`` or, with changelog checkpointing, the newest zip below it
        # and the changelogs after it, or with no zip at or below it (Spark uploads
        # snapshots late, from its maintenance thread) empty state and changelogs
        # 1..``version``
        return _chain(store, versions, version, "zip", "changelog")
    return _chain(store, versions, version, "snapshot", "delta")


def _chain(store: str, versions: dict[int, dict[str, str]], version: int, base_kind: str,
           step_kind: str) -> list[str]:
    """The newest ``base_kind`` file at or below ``version`` (none: the chain starts at
    version 0) and the ``step_kind`` file of every version after it up to ``version``."""
    bases = [v for v, kinds in versions.items() if base_kind in kinds and v <= version]
    base = max(bases) if bases else 0
    files = [versions[base][base_kind]] if bases else []
    for v in range(base + 1, version + 1):
        step = versions.get(v, {}).get(step_kind)
        if step is None:
            raise _StateFileMissing(f"state version {version} of {store} cannot be loaded: "
                                    f"{v}.{step_kind} is missing (deleted by Spark's "
                                    "retention?)")
        files.append(step)
    return files


def epoch_files(folders: dict[str, set[str]], epoch: int, partitions: int) -> list[str]:
    """What Spark needs to restart after ``epoch``, of the checkpoint listed in ``folders``
    (state partitions 0..``partitions``-1: a rescaled checkpoint keeps stale higher ones);
    the SST files of RocksDB snapshots come from the snapshots themselves."""
    wanted = ["metadata"]
    for log in ("offsets", "commits"):
        wanted += [f"{log}/{n}" for n in (epoch - 1, epoch)
                   if n >= 0 and str(n) in folders.get(log, ())]
    wanted += [n for n in _below(folders, "sources") if _source_file_upto(n, epoch)]
    version = epoch + 1
    for op in (o for o in _subfolders(folders, "state") if o.isdigit()):
        op_dir = f"state/{op}"
        for meta in ("_metadata", "_stateSchema"):
            for path in _below(folders, f"{op_dir}/{meta}"):
                folder, _, base = path.rpartition("/")
                if meta == "_metadata" and folder.endswith("/v2") and (
                        base.isdigit() and int(base) > epoch):
                    continue
                wanted.append(path)
        for part in (p for p in _subfolders(folders, op_dir)
                     if p.isdigit() and int(p) < partitions):
            wanted += _below(folders, f"{op_dir}/{part}/_metadata")
            for store in _store_dirs(folders, f"{op_dir}/{part}"):
                wanted += _needed_files(folders, store, version)
    return wanted


def _source_uid(job: dict[str, Any] | None, index: int) -> str | None:
    """The uid the job gave its source number ``index`` (``job["source_uids"]``, recorded
    by the caller), None for an unnamed source or when the job's uids are not known."""
    uids = (job or {}).get("source_uids") or []
    return uids[index] if index < len(uids) else None


def _source_file_upto(name: str, epoch: int) -> bool:
    """A source's log file (``sources/<i>/<n>`` or ``<n>.compact``) written at ``epoch`` or
    before it, or a file of no epoch: a retained epoch is cut before the later ones."""
    number = name.rsplit("/", 1)[-1].split(".", 1)[0]
    return not number.isdigit() or int(number) <= epoch


def _sst_files(dest: Path, zip_name: str, folders: dict[str, set[str]]) -> list[str]:
    """The SST files the RocksDB snapshot ``zip_name`` (copied to ``dest``) lists."""
    store = zip_name.rpartition("/")[0]
    names = []
    for sst in _zip_metadata(dest / zip_name).get("sstFiles", []):
        base = sst["dfsSstFileName"]
        if base not in folders.get(f"{store}/SSTs", ()):
            raise _StateFileMissing(f"the state snapshot {zip_name} lists SSTs/{base}, which "
                                    "is missing")
        names.append(f"{store}/SSTs/{base}")
    return names


def _zip_metadata(archive_path: Path) -> dict[str, Any]:
    """The JSON of a RocksDB snapshot's ``metadata`` entry (line 2: SST files, key count)."""
    with zipfile.ZipFile(archive_path) as archive:
        lines = archive.read("metadata").decode().split("\n")
    return dict(json.loads(lines[1]))


def copy_epoch(checkpoint: str | os.PathLike[str] | LogStore, epoch: int, dest: Path,
               partitions: int) -> list[str]:
    """Copy what Spark needs to restart after ``epoch`` from ``checkpoint`` (a local
    directory or an S3 prefix) to the local directory ``dest``; returns the names copied.

    Files of a completed epoch never change, but Spark's maintenance may delete the older
    files of a state version while they are copied (a newer snapshot replaces them): a file
    that is gone by the time it is copied lists the checkpoint again and copies anew, up to
    :data:`COPY_ATTEMPTS` times; then SavepointError names the file."""
    store = checkpoint if isinstance(checkpoint, LogStore) else open_store(checkpoint)
    for attempt in range(1, COPY_ATTEMPTS + 1):
        try:
            return _copy_epoch_once(store, epoch, dest, partitions)
        except (FileNotFoundError, _StateFileMissing) as exc:
            if attempt == COPY_ATTEMPTS:
                if isinstance(exc, SavepointError):
                    raise
                raise SavepointError(
                    f"{exc.filename or exc} vanished while the savepoint copied it, "
                    f"{COPY_ATTEMPTS} times: the checkpoint was deleted or is being cleaned "
                    "up; take the savepoint again") from None
            log_event(logger, "savepoint_copy_retried", logging.WARNING, attempt=attempt,
                      cause=str(exc)[:300])
            shutil.rmtree(dest, ignore_errors=True)
    raise AssertionError("unreachable")


def _copy_epoch_once(store: LogStore, epoch: int, dest: Path, partitions: int) -> list[str]:
    folders = _listing(store)
    wanted = epoch_files(folders, epoch, partitions)
    dest.mkdir(parents=True, exist_ok=True)
    fetch_all(store, wanted, dest)
    ssts = [n for zipped in wanted if zipped.endswith(".zip")
            for n in _sst_files(dest, zipped, folders)]
    fetch_all(store, ssts, dest)
    return wanted + ssts


@contextlib.contextmanager
def _read_in_place(copy: Path) -> Iterator[None]:
    """While Spark reads the copy back, its operator metadata v2 names the copy's own state
    schema files, not the checkpoint's (which may be on S3, where this session may have no
    file system, and may change); afterwards the copied bytes again."""
    copied = {path: path.read_bytes() for path in v2_files(copy)}
    relocate_schemas(copy, "file:" + str(copy.absolute()))
    try:
        yield
    finally:
        for path, data in copied.items():
            path.write_bytes(data)


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
                   fault: FaultSpec | None = None, epoch: int | None = None) -> Path | str:
    """Take a savepoint of ``checkpoint``'s last completed epoch (or of the retained
    ``epoch``: :func:`restorable_epochs`) under ``target``; returns
    where it is: ``target/savepoint-<epoch>-<id>``, a directory for a local ``target``, an
    ``s3://`` URI for a target on S3. The checkpoint may be local or on S3 (``s3a://``).
    ``record`` adds a ``savepoint`` record to the checkpoint's history (off where the
    checkpoint must stay unwritten: a retained checkpoint being restored). ``fault`` arms a
    crash point (:data:`COPIED`, :data:`WRITTEN`) for the crash tests.

    Safe while the query runs. Raises SavepointError when no epoch has completed yet or a
    state version cannot be copied. What an interruption leaves is never restored: locally
    a ``.inprogress`` directory; on S3 a ``savepoint-<epoch>-<id>`` prefix without its
    manifest (the manifest is uploaded last, created only if absent).
    """
    started = time.monotonic()
    source = open_store(checkpoint)
    if not is_remote(checkpoint):
        local = local_checkpoint(checkpoint)
        if local is None or not local.is_dir():
            raise SavepointError(f"no checkpoint at {checkpoint}: the directory does not "
                                 "exist")
    epoch = _pick_epoch(checkpoint, epoch)
    entry = read_offsets(checkpoint, epoch)
    if entry is None:
        raise SavepointError(f"offsets/{epoch} of {checkpoint} vanished while taking the "
                             "savepoint (the checkpoint was deleted or cleaned)")
    conf = {str(k): str(v) for k, v in entry.metadata.get("conf", {}).items()}
    if conf.get(FORMAT_VERSION_KEY, "1") != "1":
        raise SavepointError("savepoints support state checkpoint format version 1 (Spark's "
                             f"default); this checkpoint uses {conf[FORMAT_VERSION_KEY]}")
    query_id = read_metadata(checkpoint)
    if query_id is None:
        raise SavepointError(f"{checkpoint} has no metadata file (the query id): it is not a "
                             "complete Spark checkpoint")
    savepoint_id = uuid.uuid4().hex[:12]
    remote = is_remote(target)
    with contextlib.ExitStack() as scratch:
        if remote:  # built in a local directory, then uploaded with its manifest last
            root = Path(scratch.enter_context(
                tempfile.TemporaryDirectory(prefix="exactly-savepoint-")))
        else:
            root = Path(target)
            root.mkdir(parents=True, exist_ok=True)
        work = inprogress_dir(root, epoch, savepoint_id)
        work.mkdir()
        copy_epoch(source, epoch, work / CHECKPOINT_DIR, int(conf.get(SHUFFLE_KEY, "200")))
        maybe_crash(fault, COPIED, epoch)
        with _read_in_place(work / CHECKPOINT_DIR):
            infos = operator_infos(spark, work / CHECKPOINT_DIR, epoch, operators)
        provider = conf.get(PROVIDER_KEY, "HDFSBackedStateStoreProvider")
        manifest = Manifest(
            savepoint_id=savepoint_id, epoch=epoch,
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            query_id=query_id, trigger=trigger, spark_version=spark.version,
            shuffle_partitions=int(conf.get(SHUFFLE_KEY, "200")),
            state_backend=StateBackend.of_provider(provider).value, sql_conf=conf,
            sources=[{"index": i, "offset": s, "uid": _source_uid(job, i)}
                     for i, s in enumerate(entry.input.sources)],
            operators=infos, sinks=list(sinks or []), job=dict(job or {}))
        write_manifest(work, manifest)
        if remote:
            final: Path | str = upload_savepoint(
                work, location_uri(target), before_manifest=lambda: maybe_crash(
                    fault, WRITTEN, epoch))
        else:
            maybe_crash(fault, WRITTEN, epoch)
            final = publish(work)
    size = sum(f["size"] for f in manifest.files)
    log_event(logger, "savepoint_taken", path=str(final), epoch=epoch,
              operators=len(infos), rows=sum(s.rows for o in infos for s in o.stores),
              bytes=size)
    if record:
        append_now(checkpoint, {"kind": "savepoint", "epoch": epoch, "path": str(final),
                                "savepoint_id": savepoint_id, "trigger": trigger,
                                "bytes": size, "query_id": query_id,
                                "duration_ms": round((time.monotonic() - started) * 1000, 1)})
    return final

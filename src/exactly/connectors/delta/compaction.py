"""Compaction of a table the ``exactly.delta`` sink writes: fewer, larger files, every row's
epoch still readable from its file's name, and no conflict with the sink's epoch commits.

Guarantee: a compaction changes no data. It rewrites rows unchanged into new files and
commits, in one Delta commit, the removal of the files it read and the addition of the new
ones, both with ``dataChange=false`` (streaming readers of the table skip the commit): a
reader of any version, before, during or after it, sees the same rows.

What it merges: the live files of the newest version that the sink wrote (their names carry
the query id and the epoch, :func:`exactly.connectors.delta.sink.data_file`); other writers'
files stay as they are. Per query, in epoch order, a run of files of contiguous epochs (no
other live file of the query between them) becomes files named
``part-<first>-<last>-c<token>-<query>[.<codec>].parquet``: a retract after a savepoint
(``exactly run -s ... --sink-rollback retract``) removes the compacted files wholly after the
savepoint's epoch, keeps those wholly at or before it, and refuses when one spans it. An
epoch's files always go into one output, never two. Files of ``target_file_bytes`` or more,
the newest ``keep_newest_epochs`` epochs of each query, and epoch boundaries given in
``split_after`` end a run.

Packing, tiered so that a byte is rewritten at most about log1.5(target / epoch size)
times, not once per run: a run is packed into bins of at most ``target_file_bytes`` (by the
files' sizes), and a file (or an epoch's files) larger than twice all the others of its bin
together is left out of it -- a large compacted file takes in small new ones only once they
add up to half its size, so each rewrite makes a file at least 1.5 times as large. A bin
of fewer than ``min_input_files`` files is not written.

The commit, and why it never conflicts with the sink (measured with deltalake 1.6):

* the sink's epoch commits are blind appends with a ``txn`` action; a compaction removes
  only files it read and adds new ones, without a ``txn``. Neither rewrites what the other
  reads, and deltalake lets an append rebased over a compaction commit through: an epoch
  commit never fails because of a compaction.
* deltalake does *not* see a file removed twice when the first removal says
  ``dataChange=false``: two compactions rebased over each other would both commit, and a
  row would be in the table twice. So the compaction commit is never rebased: it is made on
  the newest version with ``max_commit_retries=0`` after checking that every input is
  still in that version; a lost race (any commit in between, an epoch commit most likely)
  reads the new version and tries again with the same output files; inputs another writer
  removed meanwhile (a compaction, a retract) make it plan again from the new version.
* an ambiguous commit (the answer to the put of ``_delta_log/N.json`` lost) is decided by
  reading version N: the compaction's own commit carries its id (``exactly.compactionId``).
  Output files of an attempt that did not commit are deleted -- unless a put of it may
  still land (version N does not exist yet), then they stay (unnamed by the log, invisible)
  for ``VACUUM``.

Removed inputs stay on disk, readable by time travel, until ``VACUUM`` deletes them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.connectors import lake_files
from exactly.connectors.delta import sink as delta_sink
from exactly.connectors.delta.commits import LOG_DIR, file_origins
from exactly.connectors.delta.sink import COMPACTION_KEY, DataFile, compacted_name, data_file
from exactly.connectors.delta.stats import file_stats
from exactly.errors import ConfigError, ExactlyError
from exactly.fsutil import fsync_file
from exactly.logs import log_event
from exactly.objectstore import Location

logger = logging.getLogger("exactly.delta.compaction")

MiB = 1024 * 1024
DEFAULT_TARGET_FILE_BYTES = 128 * MiB
#: the commit info key naming the run that made a compaction commit
COMPACTION_ID_KEY = "exactly.compactionId"
#: the footer key of a compacted file: the version its newest rows were committed in
ORIGIN_VERSION_KEY = "exactly.originVersion"
#: commits of the same outputs tried on a newer version after losing a race (each a fresh
#: read of the newest version; an epoch commit every 100 ms leaves most of them free)
COMMIT_ATTEMPTS = 40
#: plans made afresh after another writer removed an input
PLAN_ATTEMPTS = 5
#: Arrow batches read from an input at a time
READ_BATCH_ROWS = 64 * 1024


class CompactionError(ExactlyError):
    """A compaction that could not commit (it changed nothing in the table)."""


@dataclass(frozen=True)
class CompactedRange:
    """One output file: the epochs ``first..last`` of ``query_id`` it holds, from ``inputs``
    files."""

    query_id: str
    first: int
    last: int
    file: str
    inputs: int


@dataclass(frozen=True)
class CompactionResult:
    """What one :func:`compact_delta` call did (with ``dry_run``: would do).

    ``files_before`` / ``files_after``: live files of the table (every writer's) in the
    version read and in the compaction's version (``table_version``; None when nothing was
    committed). ``rewritten_files`` inputs of ``bytes_read`` bytes became ``written_files``
    outputs of ``bytes_written`` bytes (0 in a dry run: nothing written), described one by
    one in ``ranges``."""

    files_before: int
    files_after: int
    rewritten_files: int
    written_files: int
    bytes_read: int
    bytes_written: int
    table_version: int | None
    ranges: tuple[CompactedRange, ...] = ()
    dry_run: bool = False
    #: commits tried (races lost against other writers + 1)
    attempts: int = 0

    def epochs_by_query(self) -> dict[str, list[tuple[int, int]]]:
        """The epoch ranges compacted, per query, in epoch order."""
        found: dict[str, list[tuple[int, int]]] = {}
        for r in sorted(self.ranges, key=lambda r: (r.query_id, r.first)):
            found.setdefault(r.query_id, []).append((r.first, r.last))
        return found

    def to_json(self) -> dict[str, Any]:
        return {"files_before": self.files_before, "files_after": self.files_after,
                "rewritten_files": self.rewritten_files, "written_files": self.written_files,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "table_version": self.table_version, "dry_run": self.dry_run,
                "attempts": self.attempts,
                "epochs": {q: [list(r) for r in ranges]
                           for q, ranges in self.epochs_by_query().items()}}


@dataclass(frozen=True)
class _Input:
    file: DataFile
    size: int


@dataclass
class _Group:
    """The files of one epoch (or one compacted file): never split between outputs."""

    first: int
    last: int
    files: list[_Input] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class _Output:
    path: str
    query_id: str
    first: int
    last: int
    inputs: list[_Input]
    size: int
    stats: str
    origin: int


def compact_delta(uri: str, storage_options: Mapping[str, str] | None = None, *,
                  target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
                  min_input_files: int = 2, keep_newest_epochs: int = 0,
                  split_after: Iterable[int] = (), compression: str = "snappy",
                  dry_run: bool = False) -> CompactionResult:
    """Compact the files the ``exactly.delta`` sink wrote into the Delta table at ``uri`` in
    one Delta commit that changes no rows (module docstring). Safe while the sink writes.

    Parameters
    ----------
    uri, storage_options
        The table, as the sink takes them (a local directory or ``s3://bucket/prefix``;
        ``AWS_*`` environment variables fill the storage options not given).
    target_file_bytes
        The largest output, by the inputs' sizes; files this large are left alone.
    min_input_files
        An output is written only when it replaces at least this many files (2 or more).
    keep_newest_epochs
        Leave the files of each query's newest this many epochs as they are.
    split_after
        Epochs after which no output continues (e.g. the epochs of the savepoints a
        rollback may go back to: a retract to them stays possible).
    compression
        The Parquet codec of the outputs (the sink's ``compression`` option).
    dry_run
        Plan only: the result says what would be rewritten; nothing is written.

    Returns
    -------
    CompactionResult
        ``table_version`` None when nothing needed compacting (or ``dry_run``).

    Raises
    ------
    ConfigError
        Bad arguments, or a table this cannot rewrite (partitioned, deletion vectors,
        column mapping).
    CompactionError
        Every commit attempt lost its race against other writers; nothing changed.

    Examples
    --------
    >>> result = compact_delta("/data/events", keep_newest_epochs=10)  # doctest: +SKIP
    >>> result.files_before, result.files_after  # doctest: +SKIP
    (3600, 4)
    """
    if target_file_bytes < 1:
        raise ConfigError(f"target_file_bytes must be positive, not {target_file_bytes}")
    if min_input_files < 2:
        raise ConfigError(f"min_input_files must be 2 or more (an output replacing one file "
                          f"changes nothing), not {min_input_files}")
    if keep_newest_epochs < 0:
        raise ConfigError(f"keep_newest_epochs must be 0 or more, not {keep_newest_epochs}")
    location = Location.parse(uri, storage_options)
    splits = frozenset(int(e) for e in split_after)
    attempts = 0
    for _ in range(PLAN_ATTEMPTS):
        table = _open(location)
        adds = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
        files_before = adds.num_rows
        bins = _plan_bins(adds.to_pylist(), target_file_bytes=target_file_bytes,
                         min_input_files=min_input_files,
                         keep_newest_epochs=keep_newest_epochs, split_after=splits)
        if dry_run or not bins:
            inputs = [f for b in bins for f in b]
            planned = tuple(CompactedRange(b[0].file.query_id, b[0].file.first,
                                           b[-1].file.last, "", len(b)) for b in bins)
            return CompactionResult(files_before, files_before - len(inputs) + len(bins),
                                    len(inputs), len(bins), sum(f.size for f in inputs), 0,
                                    None, planned, dry_run, attempts)
        run = _Run(location, table, compression)
        outputs = run.write(bins)
        committed, tries = run.commit(outputs)
        attempts += tries
        if committed is None:
            continue  # an input was removed by another writer: plan on the new version
        inputs = [f for o in outputs for f in o.inputs]
        result = CompactionResult(
            files_before, files_before - len(inputs) + len(outputs), len(inputs),
            len(outputs), sum(f.size for f in inputs), sum(o.size for o in outputs),
            committed, tuple(CompactedRange(o.query_id, o.first, o.last, o.path,
                                            len(o.inputs)) for o in outputs),
            False, attempts)
        log_event(logger, "delta_compaction", table_version=committed,
                  rewritten_files=result.rewritten_files, written_files=result.written_files,
                  bytes_read=result.bytes_read, attempts=attempts)
        return result
    raise CompactionError(
        f"compaction of {location.uri}: other writers removed files it was rewriting "
        f"{PLAN_ATTEMPTS} times in a row (other compactions or retracts running at the same "
        "time?); nothing was changed. Run it again, one compaction at a time")


def _plan_bins(adds: Sequence[Mapping[str, Any]], *, target_file_bytes: int,
              min_input_files: int = 2, keep_newest_epochs: int = 0,
              split_after: frozenset[int] = frozenset()) -> list[list[_Input]]:
    """The outputs to write for a version whose live files are ``adds`` (``path`` and
    ``size_bytes`` of each): per query, runs of contiguous epochs packed into bins (module
    docstring), each bin's inputs in epoch order."""
    per_query: dict[str, list[_Input]] = {}
    for row in adds:
        found = data_file(str(row["path"]))
        if found is not None:
            per_query.setdefault(found.query_id, []).append(_Input(found, int(row["size_bytes"])))
    bins: list[list[_Input]] = []
    for query in sorted(per_query):
        files = sorted(per_query[query], key=lambda f: (f.file.first, f.file.last, f.file.path))
        newest = max(f.file.last for f in files)
        groups: list[_Group] = []
        for f in files:
            if groups and (groups[-1].first, groups[-1].last) == (f.file.first, f.file.last):
                groups[-1].files.append(f)
            else:
                groups.append(_Group(f.file.first, f.file.last, [f]))
        run: list[_Group] = []
        for group in [*groups, None]:
            if group is not None and _joins(run, group, target_file_bytes, split_after,
                                            newest - keep_newest_epochs
                                            if keep_newest_epochs else None):
                run.append(group)
                continue
            bins.extend([f for g in b for f in g.files] for b in _pack(run, target_file_bytes)
                        if sum(len(g.files) for g in b) >= min_input_files)
            run = [group] if group is not None and _eligible(
                group, target_file_bytes,
                newest - keep_newest_epochs if keep_newest_epochs else None) else []
    return bins


def _eligible(group: _Group, target: int, newest_kept_after: int | None) -> bool:
    """A group that may be rewritten: small files, not among the newest epochs kept."""
    if newest_kept_after is not None and group.last > newest_kept_after:
        return False
    return group.size < target


def _joins(run: list[_Group], group: _Group, target: int, split_after: frozenset[int],
           newest_kept_after: int | None) -> bool:
    """Whether ``group`` continues ``run``: eligible, after it, no split between them."""
    if not run or not _eligible(group, target, newest_kept_after):
        return False
    last = run[-1].last
    if group.first <= last:  # overlapping ranges: never merged (cannot happen, see commit)
        return False
    return not any(last <= e < group.first for e in split_after)


def _pack(run: list[_Group], target: int) -> list[list[_Group]]:
    """Bins of contiguous groups of ``run``, each at most ``target`` bytes, none with a
    group larger than twice the others together (that group is packed on its own)."""
    if not run:
        return []
    if len(run) == 1:
        return [run]
    sizes = [g.size for g in run]
    total = sum(sizes)
    big = max(range(len(run)), key=sizes.__getitem__)
    if sizes[big] > 2 * (total - sizes[big]):
        return [*_pack(run[:big], target), [run[big]], *_pack(run[big + 1:], target)]
    if total <= target:
        return [run]
    chunks: list[list[_Group]] = [[]]
    filled = 0
    for group in run:
        if chunks[-1] and filled + group.size > target:
            chunks.append([])
            filled = 0
        chunks[-1].append(group)
        filled += group.size
    return [b for chunk in chunks for b in _pack(chunk, target)]


class _Run:
    """One compaction attempt on one snapshot: writes the outputs, commits them."""

    def __init__(self, location: Location, table: Any, compression: str) -> None:
        self.location = location
        self.table = table
        self.compression = compression
        self.fs, self.base = location.filesystem()
        self.based_on: int = table.version()
        self.id = secrets.token_hex(8)
        self.written: list[str] = []

    # -- writing ---------------------------------------------------------------------------
    def write(self, bins: list[list[_Input]]) -> list[_Output]:
        """Write every bin's rows into new files (deleted again if any write fails)."""
        try:
            origins = self._origins([f for b in bins for f in b if not f.file.compacted])
            return [o for b in bins for o in self._write_bin(b, origins)]
        except BaseException:
            self._delete_outputs()
            raise

    def _origins(self, inputs: list[_Input]) -> dict[str, int]:
        """The version that committed each task file of ``inputs`` (read from the log)."""
        if not inputs:
            return {}
        found = file_origins(self.fs, self.base, [f.file.path for f in inputs], self.based_on)
        return {path: origin.version for path, origin in found.items()}

    def _write_bin(self, inputs: list[_Input], origins: dict[str, int]) -> list[_Output]:
        """One output of ``inputs``' rows, in order, streamed; where an input's schema differs
        from the first one's (a file holds one schema), the partial output is deleted and
        the inputs before and from it are written as two outputs instead."""
        first, last = inputs[0].file, inputs[-1].file
        path = compacted_name(first.query_id, first.first, last.last, secrets.token_hex(4),
                              self.compression)
        full = f"{self.base}/{path}"
        self.written.append(path)
        writer: _Writer | None = None
        origin, size, split = -1, 0, len(inputs)
        with self.fs.open_output_stream(full) as stream:
            try:
                for index, item in enumerate(inputs):
                    with self.fs.open_input_file(f"{self.base}/{item.file.path}") as source:
                        parquet = pq.ParquetFile(source)
                        if writer is None:
                            writer = _Writer(pq.ParquetWriter(stream, parquet.schema_arrow,
                                                              compression=self.compression))
                        elif not writer.schema.equals(parquet.schema_arrow,
                                                      check_metadata=True):
                            split = index
                            break
                        origin = max(origin, self._origin(item, parquet, origins))
                        for batch in parquet.iter_batches(batch_size=READ_BATCH_ROWS):
                            writer.add(batch)
                assert writer is not None
                metadata = writer.close({ORIGIN_VERSION_KEY: str(origin)})
            except BaseException:
                if writer is not None:  # before its stream closes (the file is deleted)
                    with contextlib.suppress(Exception):
                        writer.writer.close()
                raise
            size = stream.tell()
        if split < len(inputs):  # the schema changed at inputs[split]
            lake_files.delete_object(self.fs, full)
            self.written.remove(path)
            return [*self._write_bin(inputs[:split], origins),
                    *self._write_bin(inputs[split:], origins)]
        if self.location.is_local:
            fsync_file(full)
        return [_Output(path, first.query_id, first.first, last.last, inputs, size,
                        file_stats(metadata, writer.schema), origin)]

    def _origin(self, item: _Input, parquet: pq.ParquetFile, origins: dict[str, int]) -> int:
        """The version that committed ``item``'s (newest) rows: a task file's from the log,
        a compacted file's from its footer (from the log when the footer lacks it)."""
        if item.file.compacted:
            recorded = (parquet.metadata.metadata or {}).get(ORIGIN_VERSION_KEY.encode())
            if recorded is not None and recorded.isdigit():
                return int(recorded)
            return self._origins([item]).get(item.file.path, self.based_on)
        return origins.get(item.file.path, self.based_on)

    # -- committing ------------------------------------------------------------------------
    def commit(self, outputs: list[_Output]) -> tuple[int | None, int]:
        """Commit ``outputs`` in place of their inputs (module docstring): ``(the version
        committed, or None when an input was removed meanwhile; attempts)``. Raises
        CompactionError when every attempt lost its race."""
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError, DeltaError
        from deltalake.transaction import AddAction, RemoveAction

        inputs = [f for o in outputs for f in o.inputs]
        record = {o.path: [o.query_id, o.first, o.last, o.origin] for o in outputs}
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(f.file.path, False, now, f.size) for f in inputs]
        actions += [AddAction(o.path, o.size, {}, now, False, o.stats) for o in outputs]
        properties = CommitProperties(
            custom_metadata={COMPACTION_KEY: json.dumps(record, separators=(",", ":")),
                             COMPACTION_ID_KEY: self.id},
            max_commit_retries=0)  # never rebased (module docstring)
        tried: set[int] = set()  # versions attempted whose commit file was not read yet
        table = self.table
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table.update_incremental()  # writing took a while: the newest version
            version = table.version()
            mine = self._landed(tried, version)
            if mine is not None:
                return mine, attempt - 1
            live = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
            if not all(f.file.path in live for f in inputs):
                self._abandon(tried, "an input was removed by another writer's commit")
                return None, attempt - 1
            tried.add(version + 1)
            try:
                table.create_write_transaction(actions, "append", table.schema(),
                                               commit_properties=properties)
            except (CommitFailedError, DeltaError, OSError) as exc:
                log_event(logger, "delta_compaction_raced", logging.DEBUG, attempt=attempt,
                          based_on_version=version, detail=f"{type(exc).__name__}: {exc}")
                time.sleep(random.uniform(0, 0.005 * attempt))  # jitter
                continue
            return version + 1, attempt
        table.update_incremental()
        mine = self._landed(tried, table.version())
        if mine is not None:
            return mine, COMMIT_ATTEMPTS
        self._abandon(tried, f"{COMMIT_ATTEMPTS} commits lost the race against other writers")
        raise CompactionError(
            f"compaction of {self.location.uri}: each of {COMMIT_ATTEMPTS} commits lost the "
            "race against another writer's commit; nothing was changed. Run it again (a "
            "table committed to many times a second leaves compaction few gaps)")

    def _landed(self, tried: set[int], newest: int) -> int | None:
        """The version among ``tried`` (versions attempts were made for) that holds this
        run's commit -- an attempt whose answer was lost -- else None. Versions found to
        hold another writer's commit leave ``tried``: this run's put for them cannot land."""
        for version in sorted(v for v in tried if v <= newest):
            if self._commit_id(version) == self.id:
                return version
            tried.discard(version)
        return None

    def _commit_id(self, version: int) -> str | None:
        path = f"{self.base}/{LOG_DIR}/{version:020d}.json"
        try:
            with self.fs.open_input_stream(path) as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            return None
        for line in text.splitlines():
            if '"commitInfo"' in line:
                return json.loads(line)["commitInfo"].get(COMPACTION_ID_KEY)
        return None

    def _abandon(self, tried: set[int], why: str) -> None:
        """Delete the outputs of a commit that did not happen, unless a put of it may still
        land: an attempted version the log does not hold yet (its outputs then stay for
        ``VACUUM``, unnamed by the log)."""
        if tried:
            log_event(logger, "delta_compaction_left_files", logging.WARNING,
                      files=self.written, versions=sorted(tried),
                      detail=f"{why}; the commit of version {min(tried)} was not answered "
                             "and may still land, so its files stay (unnamed by the log until "
                             "it does; VACUUM removes them otherwise)")
            return
        log_event(logger, "delta_compaction_abandoned", logging.INFO, detail=why,
                  files=len(self.written))
        self._delete_outputs()

    def _delete_outputs(self) -> None:
        for path in self.written:
            lake_files.delete_object(self.fs, f"{self.base}/{path}")
        self.written = []


class _Writer:
    """A Parquet writer whose row groups hold ``ROW_GROUP_ROWS`` rows (the sink's size; fewer
    when they reach ``ROW_GROUP_BYTES`` first, and the last one holds the rest)."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.schema: pa.Schema = writer.schema
        self.pending: list[pa.RecordBatch] = []
        self.rows = 0
        self.nbytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:
            room = delta_sink.ROW_GROUP_ROWS - self.rows
            part, batch = batch.slice(0, room), batch.slice(room)
            self.pending.append(part)
            self.rows += part.num_rows
            self.nbytes += part.nbytes
            if (self.rows >= delta_sink.ROW_GROUP_ROWS
                    or self.nbytes >= delta_sink.ROW_GROUP_BYTES):
                self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, self.schema),
                                    row_group_size=max(self.rows, 1))
        self.pending, self.rows, self.nbytes = [], 0, 0

    def close(self, footer: Mapping[str, str]) -> pq.FileMetaData:
        """Write the rest and the footer (with the key-value pairs ``footer``); the file's
        metadata."""
        self.flush()
        if footer:
            self.writer.add_key_value_metadata(dict(footer))
        self.writer.close()
        return self.writer.writer.metadata


def _open(location: Location) -> Any:
    """The newest version of the table at ``location``; ConfigError when it is no table
    compaction can rewrite."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        table = DeltaTable(location.uri, storage_options=location.resolved_options())
    except (DeltaError, OSError) as exc:
        raise ConfigError(f"compaction: cannot open the Delta table at {location.uri} "
                          f"({exc}); check the path and the storage options") from None
    if table.metadata().partition_columns:
        raise ConfigError(f"compaction: the table at {location.uri} is partitioned by "
                          f"{', '.join(table.metadata().partition_columns)}; the exactly.delta "
                          "sink writes unpartitioned tables, and only those are compacted")
    features = set(table.protocol().reader_features or ())
    unsupported = features & {"deletionVectors", "columnMapping"}
    if unsupported:
        raise ConfigError(f"compaction: the table at {location.uri} uses "
                          f"{', '.join(sorted(unsupported))}; compaction copies Parquet rows "
                          "as they are and would not apply them")
    return table

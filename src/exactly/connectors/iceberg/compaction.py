"""Compaction of an Iceberg table ``exactly.iceberg`` writes: fewer, larger data files, the
same rows, and every file's epochs still readable from its name.

An epoch writes one file per write task (and partition value): at a short trigger that is
thousands of small files an hour. :func:`compact_iceberg` rewrites runs of *contiguous epochs
of one query and one partition* into files of up to ``target_file_bytes``, named
``part-<first epoch>-<last epoch>-c<8 hex>-<query>-00000.parquet``, in one snapshot whose
summary carries ``exactly.compaction``: each new file's query, epoch range and the rows each
epoch contributes, in the file's order (``{file: [query, first, last, [[epoch, rows], ...]]}``;
older compactions recorded the range only). A new file holds its inputs' rows
in epoch order, and its Parquet footer carries the same ``[[epoch, rows], ...]``
(``exactly.epochs``), so that a later compaction of it knows every row's epoch even after
the snapshot that wrote it expired. The audit (:mod:`exactly.auditor.iceberg`) gives each
compacted row its epoch's place in the table's history from the summary. pyiceberg
0.12 cannot write Iceberg's ``replace`` operation (a rewrite that changes no data), so the
snapshot is an ``overwrite`` with the same rows: a streaming reader of the table that stops
at overwrites (Spark's, unless ``streaming-skip-overwrite-snapshots``) must skip it.

It never conflicts with the exactly-once commits: it only removes files it read and adds new
ones, based on one snapshot. When the sink (or anyone) committed meanwhile, the catalog
refuses the compaction; it is tried again on the new metadata if every input is still live
(else its new files are deleted and nothing changes); the sink's own commit, refused the
same way when the compaction came first, is retried by the sink. Files of other writers are
left alone. Savepoint rollback keeps working: a retract after epoch N removes compacted files
whose first epoch is after N and refuses a file that spans N (restore a savepoint at or after
its last epoch, or use ``--sink-rollback keep``).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.connectors import lake_files
from exactly.connectors.iceberg.data_files import (
    LayoutWriter,
    OpenFile,
    TableLayout,
    file_epochs,
    file_query,
)
from exactly.connectors.iceberg.snapshots import SUMMARY_COMPACTION
from exactly.errors import ConfigError
from exactly.logs import log_event

logger = logging.getLogger("exactly.iceberg")

#: the size of a compacted file (Iceberg's ``write.target-file-size-bytes`` default)
TARGET_FILE_BYTES = 512 * 1024 * 1024
#: commits of a compaction refused because another commit came first, tried again
COMMIT_RETRIES = 15
#: the Parquet footer key of a compacted file: its rows' epochs, JSON ``[[epoch, rows], ...]``
EPOCHS_KEY = b"exactly.epochs"
_COMPACTED_NAME = re.compile(r"^part-\d{12}-\d{12}-c[0-9a-f]{8}-")


@dataclass(frozen=True)
class CompactionResult:
    """What one compaction did (nothing when ``snapshot`` is None)."""

    files_before: int
    files_after: int
    rewritten_files: int = 0
    written_files: int = 0
    bytes_written: int = 0
    snapshot: int | None = None
    #: new file -> [query, first epoch, last epoch]
    ranges: dict[str, list[Any]] = field(default_factory=dict)
    #: new file -> its rows' epochs in file order, ``[[epoch, rows], ...]`` (a file with an
    #: input of an older compaction, which did not record them, is absent)
    epoch_rows: dict[str, list[list[int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The fields :meth:`exactly.connectors.delta.compaction.CompactionResult.to_json`
        prints too; ``snapshot`` for its ``table_version``."""
        epochs: dict[str, list[list[int]]] = {}
        for query, first, last in sorted(self.ranges.values()):
            epochs.setdefault(query, []).append([first, last])
        return {"files_before": self.files_before, "files_after": self.files_after,
                "rewritten_files": self.rewritten_files, "written_files": self.written_files,
                "bytes_written": self.bytes_written, "snapshot": self.snapshot,
                "epochs": epochs}


@dataclass
class _Group:
    query: str
    files: list[Any]  # pyiceberg DataFile, oldest epoch first

    @property
    def first(self) -> int:
        return file_epochs(self.files[0].file_path)[0]

    @property
    def last(self) -> int:
        return file_epochs(self.files[-1].file_path)[1]


def plan(files: Sequence[Any], *, target_file_bytes: int, min_input_files: int,
         keep_newest_epochs: int, split_after: Iterable[int] = ()) -> list[_Group]:
    """Runs of files of one query, one partition and contiguous epochs, each up to
    ``target_file_bytes`` in all and at least ``min_input_files`` long; the newest
    ``keep_newest_epochs`` epochs of each query are left out, and no run goes on past an
    epoch of ``split_after`` (a savepoint's: a retract to it stays possible).

    Tiered: a file larger than twice the rest of its run together stays out of it, so a
    large compacted file takes in small new ones only once they add up to half its size --
    each rewrite makes a file at least 1.5 times as large, and a byte is rewritten about
    log1.5(target / epoch size) times, not once per compaction."""
    splits = set(split_after)
    by_key: dict[tuple[str, int, str], list[Any]] = defaultdict(list)
    newest: dict[str, int] = {}
    for data_file in files:
        query = file_query(data_file.file_path)
        if query is None:
            continue  # another writer's file
        by_key[(query, data_file.spec_id, repr(data_file.partition))].append(data_file)
        newest[query] = max(newest.get(query, -1), file_epochs(data_file.file_path)[1])
    groups: list[_Group] = []
    for (query, _, _), found in sorted(by_key.items()):
        limit = newest[query] - keep_newest_epochs
        found = sorted((f for f in found if file_epochs(f.file_path)[1] <= limit),
                       key=lambda f: (file_epochs(f.file_path), f.file_path))
        run: list[Any] = []
        size = 0
        for data_file in found:
            first, last = file_epochs(data_file.file_path)
            previous = file_epochs(run[-1].file_path)[1] if run else None
            ends = previous is not None and (
                first > previous + 1 or any(previous <= e < first for e in splits)
                or size + data_file.file_size_in_bytes > target_file_bytes)
            if ends:
                groups.extend(_Group(query, part) for part in _tiered(run))
                run, size = [], 0
            if data_file.file_size_in_bytes >= target_file_bytes:
                continue  # full already
            run.append(data_file)
            size += data_file.file_size_in_bytes
            if any(first <= e < last for e in splits):  # a compacted file across a split
                groups.extend(_Group(query, part) for part in _tiered(run))
                run, size = [], 0
        groups.extend(_Group(query, part) for part in _tiered(run))
    return [g for g in groups if len(g.files) >= min_input_files]


def _tiered(run: list[Any]) -> list[list[Any]]:
    """``run`` without a file larger than twice the others together (split around it)."""
    if len(run) < 2:
        return [run] if run else []
    sizes = [f.file_size_in_bytes for f in run]
    largest = max(range(len(run)), key=sizes.__getitem__)
    if sizes[largest] <= 2 * (sum(sizes) - sizes[largest]):
        return [run]
    return _tiered(run[:largest]) + _tiered(run[largest + 1:])


def compact_iceberg(catalog: Any, table_name: str, *,
                    target_file_bytes: int = TARGET_FILE_BYTES, min_input_files: int = 2,
                    keep_newest_epochs: int = 0, split_after: Iterable[int] = (),
                    dry_run: bool = False) -> CompactionResult:
    """Compact the table ``table_name`` of the catalog (a :class:`CatalogSpec`): one
    snapshot, or none when no run of at least ``min_input_files`` files is found (or with
    ``dry_run``, which reports the plan only; :func:`plan` for the other parameters). Safe
    while the sink writes. Raises the catalog's error when the table cannot be read, and
    CommitFailedException when the commit keeps losing races (its new files are deleted
    then); a commit whose answer was lost is raised as it came, its files kept (they may be
    in the table)."""
    from pyiceberg.exceptions import CommitFailedException

    loaded = catalog.load()
    table = loaded.load_table(table_name)
    live, inputs = _live(table)
    groups = plan(inputs, target_file_bytes=target_file_bytes, min_input_files=min_input_files,
                  keep_newest_epochs=keep_newest_epochs, split_after=split_after)
    rewritten = sum(len(g.files) for g in groups)
    if not groups or dry_run:
        return CompactionResult(len(live), len(live) - rewritten + len(groups), rewritten,
                                len(groups), 0, None)
    layout = TableLayout.of(table, catalog.io_properties())
    writer = LayoutWriter(layout)
    outputs = [(group, *_rewrite(table, writer, group)) for group in groups]
    written = [facts for _, facts, _ in outputs]
    ranges = {facts.path: [g.query, g.first, g.last] for g, facts, _ in outputs}
    epoch_rows = {facts.path: runs for _, facts, runs in outputs if runs is not None}
    summary = compaction_summary(ranges, epoch_rows)
    try:
        for _ in range(COMMIT_RETRIES + 1):
            current = {f.file_path for f in _live(table)[1]}
            if not all(f.file_path in current for g in groups for f in g.files):
                raise _Stale()  # an input went (a retract, another compaction): start over
            try:
                table = _commit(table, groups, written, summary)
                break
            except CommitFailedException:
                table = loaded.load_table(table_name)
        else:
            raise CommitFailedException(f"compaction of {table_name}: {COMMIT_RETRIES + 1} "
                                        "commits in a row lost the race to other writers")
    except (_Stale, CommitFailedException, ConfigError) as exc:
        fs, _ = _fs(layout)
        for facts in written:
            lake_files.delete_object(fs, facts.path.split("://", 1)[-1])
        if isinstance(exc, _Stale):
            log_event(logger, "iceberg_compaction_abandoned", logging.INFO,
                      table=table_name, detail="an input file left the table meanwhile")
            return CompactionResult(len(live), len(live), 0, 0, 0, None)
        raise
    snapshot = table.metadata.current_snapshot_id
    result = CompactionResult(len(live), len(live) - rewritten + len(written), rewritten,
                              len(written), sum(f.size for f in written), snapshot, ranges,
                              epoch_rows)
    log_event(logger, "iceberg_compaction", table=table_name, files_before=result.files_before,
              files_after=result.files_after, snapshot=snapshot)
    return result


class _Stale(Exception):
    pass


def _live(table: Any) -> tuple[list[Any], list[Any]]:
    """The table's live data files, and those of them compaction may take as inputs: not a
    file that a row-level delete file applies to (another writer's merge-on-read delete, in
    pyiceberg's scan plan), whose rows as read are fewer than the file's -- it stays as it
    is, its deletes with it. Raises ConfigError when the plan cannot say which files deletes
    apply to (equality deletes, which pyiceberg 0.12 does not read): nothing is compacted."""
    if table.metadata.current_snapshot_id is None:
        return [], []
    try:
        tasks = list(table.scan().plan_files())
    except (ValueError, NotImplementedError) as exc:
        if "equality delete" not in str(exc).lower():
            raise
        name = ".".join(table.name())
        raise ConfigError(
            f"compaction of {name}: the table has equality delete files (another writer's "
            "row-level deletes), which pyiceberg 0.12 cannot match to data files, so a "
            "compaction could bring deleted rows back; nothing was compacted. Apply and drop "
            "them with the engine that wrote them first (Spark: CALL <catalog>.system."
            f"rewrite_data_files(table => '{name}', options => map('delete-file-threshold', "
            "'1', 'remove-dangling-deletes', 'true'))), or do not compact this table with "
            "exactly") from None
    return [t.file for t in tasks], [t.file for t in tasks if not t.delete_files]


def _fs(layout: TableLayout) -> Any:
    from exactly.objectstore import Location

    return Location.parse(layout.location).filesystem()


def _rewrite(table: Any, writer: LayoutWriter, group: _Group
             ) -> tuple[Any, list[list[int]] | None]:
    """Write the rows of ``group``'s files into one new file beside them: its facts, and its
    rows' epochs in file order (``[[epoch, rows], ...]``; None when an input is a file of an
    older compaction, which recorded no epoch of its rows: the rows then stay in the inputs'
    order, oldest epochs first).

    The rows are in epoch order: each input's rows are cut at their epochs and the pieces put
    in epoch order (stable: within an epoch, the inputs' order), whatever the inputs' ranges
    (a compacted input may reach past the epoch of a plain file an earlier merge left out)."""
    first_file = group.files[0].file_path
    directory = first_file.rsplit("/", 1)[0]
    name = (f"part-{group.first:012d}-{group.last:012d}-c{uuid.uuid4().hex[:8]}-"
            f"{group.query}-00000.parquet")
    path = f"{directory}/{name}"
    tables: list[pa.Table] = []
    pieces: list[tuple[int, pa.Table]] | None = []
    for data_file in group.files:
        with table.io.new_input(data_file.file_path).open() as stream:
            read = pq.read_table(stream)
        tables.append(read)
        runs = input_epochs(data_file.file_path, read)
        if runs is None or pieces is None:
            pieces = None
            continue
        offset = 0
        for epoch, count in runs:
            pieces.append((epoch, read.slice(offset, count)))
            offset += count
    epochs: list[list[int]] | None = None
    if pieces is not None:
        pieces.sort(key=lambda piece: piece[0])  # stable
        tables = [piece for _, piece in pieces]
        epochs = []
        for epoch, piece in pieces:
            if epochs and epochs[-1][0] == epoch:
                epochs[-1][1] += piece.num_rows
            elif piece.num_rows:
                epochs.append([epoch, piece.num_rows])
    rows = pa.concat_tables(tables, promote_options="default")
    kept = {k: v for k, v in (rows.schema.metadata or {}).items() if k != EPOCHS_KEY}
    if epochs is not None:
        kept[EPOCHS_KEY] = json.dumps(epochs).encode()
    rows = rows.replace_schema_metadata(kept or None)
    partition = [None if v is None else _hex(writer, i, v)
                 for i, v in enumerate(group.files[0].partition)]
    stream = writer.io.new_output(path).create(overwrite=True)
    out = OpenFile(path, partition, stream,
                   pq.ParquetWriter(stream, schema=rows.schema, store_decimal_as_integer=True,
                                    **writer.writer_kwargs))
    for batch in rows.to_batches():
        out.add(batch)
    footer, size = out.close()
    return writer.facts(out, footer, size), epochs


def input_epochs(path: str, rows: pa.Table) -> list[list[int]] | None:
    """The epochs of a data file's rows (read whole as ``rows``) in file order,
    ``[[epoch, rows], ...]``: a plain file of the sink holds its name's epoch; a compacted
    one says it in its footer (:data:`EPOCHS_KEY`). None for a compacted file of an older
    compaction (no such footer) or a footer whose counts do not add up to the rows."""
    metadata = rows.schema.metadata or {}
    if EPOCHS_KEY in metadata:
        try:
            runs = [[int(e), int(n)] for e, n in json.loads(metadata[EPOCHS_KEY])]
        except (ValueError, TypeError):
            return None
        return runs if sum(n for _, n in runs) == rows.num_rows else None
    if _COMPACTED_NAME.match(path.rsplit("/", 1)[-1]):
        return None
    return [[file_epochs(path)[0], rows.num_rows]]


def _hex(writer: LayoutWriter, index: int, value: Any) -> str:
    from pyiceberg.conversions import to_bytes

    return to_bytes(writer.partition_type.fields[index].field_type, value).hex()


def compaction_summary(ranges: dict[str, list[Any]],
                       epoch_rows: dict[str, list[list[int]]]) -> dict[str, str]:
    """A compaction snapshot's summary: :data:`SUMMARY_COMPACTION`, JSON ``{new file: [query,
    first epoch, last epoch, [[epoch, rows], ...]]}``, the last item only where known."""
    record = {path: [*span, *([epoch_rows[path]] if path in epoch_rows else [])]
              for path, span in ranges.items()}
    return {SUMMARY_COMPACTION: json.dumps(record, sort_keys=True)}


def _commit(table: Any, groups: Sequence[_Group], written: Sequence[Any],
            summary: dict[str, str]) -> Any:
    from exactly.connectors.iceberg.sink import without_retries

    schema, specs = table.schema(), table.metadata.specs()
    tx = without_retries(table).transaction()
    with tx.update_snapshot(snapshot_properties=summary).overwrite() as rewrite:
        for group in groups:
            for data_file in group.files:
                rewrite.delete_data_file(data_file)
        for facts in written:
            rewrite.append_data_file(facts.data_file(schema, specs[facts.spec_id]))
    return tx.commit_transaction()

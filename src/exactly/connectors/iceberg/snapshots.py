"""What an Iceberg table written by ``exactly.iceberg`` records about its epochs.

Every snapshot the sink commits carries, in its summary, the query id and the epoch
(``exactly.queryId``, ``exactly.epoch``), as Flink's Iceberg committer records its job id and
checkpoint id (``flink.job-id``, ``flink.max-committed-checkpoint-id``). In exactly_once mode
the same commit sets the table property ``exactly.epoch.<query id>`` to the epoch. The main
line's newest snapshot of the query says which epoch the table holds (so a rollback of the
table to an older snapshot is seen); the property says it once the query's snapshots expired
(a snapshot's summary goes with it). A retract (savepoint rollback) sets the property back
in the snapshot that removes the epochs' files, and says so in that snapshot's summary
(``exactly.retractedAfter``, ``exactly.line``). A compaction by exactly is a snapshot with
``exactly.compaction`` in its summary; it adds and removes files, never rows, and says which
epochs the rows of each file it adds come from (:func:`compacted_epochs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SUMMARY_QUERY = "exactly.queryId"
SUMMARY_EPOCH = "exactly.epoch"
SUMMARY_RETRACTED = "exactly.retractedAfter"
SUMMARY_LINE = "exactly.line"
SUMMARY_COMPACTION = "exactly.compaction"
PROGRESS_PREFIX = "exactly.epoch."
#: snapshot operations of other writers that add rows and rewrite none
APPEND_OPERATIONS = frozenset({"append"})


def progress_property(query_id: str) -> str:
    """The table property holding the newest epoch of ``query_id`` the table holds."""
    return f"{PROGRESS_PREFIX}{query_id}"


@dataclass(frozen=True)
class EpochSnapshot:
    """A snapshot of the table's main line, and the epoch it committed (None: not an epoch
    of exactly's)."""

    snapshot: Any
    query_id: str | None
    epoch: int | None

    @property
    def operation(self) -> str:
        summary = self.snapshot.summary
        return str(summary.operation.value if summary is not None else "append")

    @property
    def properties(self) -> dict[str, str]:
        summary = self.snapshot.summary
        return dict(summary.additional_properties) if summary is not None else {}


def epoch_of(snapshot: Any) -> tuple[str | None, int | None]:
    """``(query id, epoch)`` from a snapshot's summary; ``(None, None)`` for others'."""
    summary = snapshot.summary
    extra = summary.additional_properties if summary is not None else {}
    query, epoch = extra.get(SUMMARY_QUERY), extra.get(SUMMARY_EPOCH)
    if query is None or epoch is None or not str(epoch).isdigit():
        return None, None
    return str(query), int(epoch)


def compacted_epochs(snapshot: Any) -> dict[str, tuple[str, list[tuple[int, int]]]]:
    """The files an exactly compaction's ``snapshot`` added, each with its query and its
    rows' epochs in file order, ``[(epoch, rows), ...]``, from the summary's
    :data:`SUMMARY_COMPACTION` (``{file: [query, first, last, [[epoch, rows], ...]]}``).
    Files of older compactions (``[query, first, last]``: no rows per epoch) and entries
    that do not parse are left out; ``{}`` for any other snapshot."""
    summary = snapshot.summary
    extra = summary.additional_properties if summary is not None else {}
    try:
        record = json.loads(extra.get(SUMMARY_COMPACTION) or "{}")
    except ValueError:
        return {}
    found: dict[str, tuple[str, list[tuple[int, int]]]] = {}
    for path, entry in (record.items() if isinstance(record, dict) else ()):
        if not isinstance(entry, list) or len(entry) < 4 or not isinstance(entry[3], list):
            continue
        try:
            runs = [(int(epoch), int(rows)) for epoch, rows in entry[3]]
        except (TypeError, ValueError):
            continue
        found[str(path)] = (str(entry[0]), runs)
    return found


def main_line(table: Any, snapshot_id: int | None = None) -> Iterator[EpochSnapshot]:
    """The snapshots of the table's main line (or of ``snapshot_id``'s), newest first: the
    current snapshot and its ancestors, as far as they have not expired."""
    from pyiceberg.table.snapshots import ancestors_of

    meta = table.metadata
    start = (meta.snapshot_by_id(snapshot_id) if snapshot_id is not None
             else meta.current_snapshot())
    for snapshot in ancestors_of(start, meta):
        query, epoch = epoch_of(snapshot)
        yield EpochSnapshot(snapshot, query, epoch)


def committed_epoch(table: Any, query_id: str) -> int | None:
    """The newest epoch of ``query_id`` the table holds. None: the table holds none.

    The main line decides: the newest snapshot of the query (after a retract of the query's
    line, no more than the epoch it retracted to). A rollback of the table to an older
    snapshot (Iceberg's ``rollback_to_snapshot``) therefore moves it back, and the epochs
    after it are committed again by their replays. When no snapshot of the query is left on
    the main line (they expired), the progress property says it."""
    retracted: int | None = None
    for entry in main_line(table):
        if entry.query_id == query_id:
            assert entry.epoch is not None
            return entry.epoch if retracted is None else min(entry.epoch, retracted)
        extra = entry.properties
        if query_id in extra.get(SUMMARY_LINE, "").split(",") and retracted is None:
            after = extra.get(SUMMARY_RETRACTED, "")
            if after.isdigit():
                retracted = int(after)
    return recorded_epoch(table, query_id)


def recorded_epoch(table: Any, query_id: str) -> int | None:
    """The query's progress property (None: absent)."""
    value = table.metadata.properties.get(progress_property(query_id))
    if value is not None and value.lstrip("-").isdigit():
        return int(value)
    return None


def snapshot_of(table: Any, query_id: str, epoch: int) -> Any | None:
    """The main-line snapshot that committed ``epoch`` of ``query_id`` (newest first), or
    None."""
    for entry in main_line(table):
        if entry.query_id == query_id and entry.epoch == epoch:
            return entry.snapshot
    return None


def added_paths(table: Any, snapshot: Any) -> set[str]:
    """The data files ``snapshot`` added (from its own manifests)."""
    paths: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id == snapshot.snapshot_id and int(entry.status) == 1:  # ADDED
                paths.add(entry.data_file.file_path)
    return paths


def live_files(table: Any, snapshot_id: int | None = None) -> list[Any]:
    """The data files (pyiceberg ``DataFile``) of the current snapshot (or ``snapshot_id``)."""
    if table.metadata.current_snapshot_id is None and snapshot_id is None:
        return []
    return [task.file for task in table.scan(snapshot_id=snapshot_id).plan_files()]

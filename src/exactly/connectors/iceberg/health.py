"""``exactly doctor --table iceberg:...``: what an Iceberg table says about a query's epochs.

Read-only. Compared with the sink's commit log (the query id, the completed epochs): a
table with no trace of the query at all (the wrong table, or a new one), the table's
progress for the query (``exactly.epoch.<query>``) behind a completed epoch (epochs lost
outside exactly), ahead of it (a commit whose completion record the next start writes),
an epoch committed in two snapshots, pending task attempts, data files of the query that no
snapshot names (aborted attempts whose cleanup did not finish), and a query whose snapshots
expired (its replays are still recognised by the progress property, which must stay).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from exactly.connectors import lake_files
from exactly.connectors.iceberg import snapshots
from exactly.connectors.iceberg.catalog import IcebergAddress
from exactly.connectors.iceberg.data_files import file_query
from exactly.errors import ConfigError
from exactly.objectstore import Location


@dataclass(frozen=True)
class TableFinding:
    severity: str  #: error | warning | info
    path: str
    problem: str
    repair: str


def table_findings(address: IcebergAddress, query_id: str | None,
                   completed: Sequence[int]) -> list[TableFinding]:
    """The findings about ``query_id`` (the sink log's query; None: unknown) in the table
    at ``address``, given the epochs its commit log completed."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    where = address.describe()
    try:
        table = address.catalog.load().load_table(address.table)
    except ConfigError as exc:
        return [TableFinding("error", where, str(exc), "check the address's catalog")]
    except (NoSuchTableError, NoSuchNamespaceError):
        return [TableFinding("error", where, f"does not exist in its catalog{address.name_hint()}",
                             "name the table the job writes (iceberg:CATALOG?table=NS.NAME)")]
    if query_id is None:
        return [TableFinding("info", where, "the sink log names no query: only the table's "
                             "own records are checked", "pass the job's --sink-log")]
    found: list[TableFinding] = []
    progress = snapshots.committed_epoch(table, query_id)
    newest = max(completed) if completed else None
    prop = snapshots.progress_property(query_id)
    if newest is not None and progress is None and not _ever_written(table, query_id):
        found.append(TableFinding(
            "error", where, f"holds no snapshot of query {query_id} and no property {prop}, "
            f"but the sink log completed epochs up to {newest}: the address names another "
            "table than the job writes, or the table is a new one (replaced, or created "
            "after the query's epochs were written; in at_least_once mode, which sets no "
            "property, also: the query's snapshots expired)",
            "name the table the job writes (its catalog, &catalog.name=NAME and table=NS.NAME "
            "as the sink's options); for a new table on purpose, start the job on a new "
            "checkpoint, or restore it from a savepoint (`exactly run -s`) to write the "
            "epochs into it again"))
    elif newest is not None and (progress is None or progress < newest):
        held = "none of its epochs" if progress is None else f"its epochs up to {progress}"
        found.append(TableFinding(
            "error", where, f"holds {held} (property {prop}), but the sink log completed "
            f"epoch {newest}: epochs were removed from the table outside exactly (a rollback "
            "of snapshots, a replaced table)",
            "restore the job from a savepoint at or before the table's epoch "
            "(`exactly run -s`), or write to a new table"))
    elif progress is not None and (newest is None or progress > newest):
        found.append(TableFinding(
            "info", where, f"holds epoch {progress} of the query, whose completion record "
            "the sink log lacks (the driver stopped after the commit)",
            "none needed: the next start recognises the epoch and records it"))
    recorded = snapshots.recorded_epoch(table, query_id)
    if recorded is not None and progress is not None and recorded > progress:
        found.append(TableFinding(
            "warning", where, f"the table's main line holds epochs of the query up to "
            f"{progress}, its property {prop} says {recorded}: the table was rolled back to an "
            "older snapshot outside exactly",
            "none needed for new epochs; a replay of a rolled-back epoch is committed again, "
            "older ones are not (restore from a savepoint to write them again)"))
    line = [e for e in snapshots.main_line(table) if e.query_id == query_id]
    twice = sorted(epoch for epoch, n in Counter(e.epoch for e in line).items()
                   if n > 1 and epoch is not None)
    if twice:
        found.append(TableFinding(
            "error", where, f"epoch(s) {', '.join(map(str, twice))} of the query are in more "
            "than one snapshot: their rows are in the table twice",
            "restore from a savepoint before the first of them with --sink-rollback "
            "retract, or delete the extra snapshot's files with an Iceberg tool"))
    if progress is not None and not line:
        found.append(TableFinding(
            "info", where, f"no snapshot of the query is left (expired); replays are "
            f"recognised by the table property {prop}",
            f"none needed; keep {prop} when editing table properties"))
    found.extend(_files(table, query_id))
    return found


def _ever_written(table: Any, query_id: str) -> bool:
    """Whether any snapshot the table's metadata keeps (on its main line or not) is one of
    ``query_id``'s: a table rolled back before the query's epochs still keeps them."""
    return any(snapshots.epoch_of(s)[0] == query_id for s in table.metadata.snapshots)


def _files(table: Any, query_id: str) -> list[TableFinding]:
    fs, base = Location.parse(table.metadata.location).filesystem()
    pending = lake_files.marker_records(fs, base, query_id, lambda p: f"{base}/{p}",
                                        ("files",))
    found = []
    if pending:
        epochs = sorted({int(r["epoch"]) for r in pending})
        found.append(TableFinding(
            "info", f"{base}/{lake_files.PENDING}/{query_id}",
            f"{len(pending)} task attempt(s) of epoch(s) {', '.join(map(str, epochs))} are "
            "pending (pre-committed data files no snapshot names yet)",
            "none needed: the next start's recovery commits or aborts them"))
    named = {f for r in pending for f in r["files"]}
    named = {n.split("://", 1)[-1] for n in named}
    referenced = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                referenced.add(entry.data_file.file_path.split("://", 1)[-1])
    stray = []
    selector = pafs.FileSelector(f"{base}/data", recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        if info.type == pafs.FileType.File and file_query(info.path) == query_id \
                and info.path not in referenced and info.path not in named:
            stray.append(info.path)
    if stray:
        found.append(TableFinding(
            "warning", stray[0], f"{len(stray)} data file(s) of the query that no snapshot "
            "and no pending attempt names (aborted attempts whose cleanup did not finish); "
            "readers never see them",
            "delete them once no driver of the query runs (or run Iceberg's "
            "remove_orphan_files)"))
    return found

"""``exactly compact TABLE``: compaction of a Delta or Iceberg table an exactly sink writes,
once or on a schedule, while the job runs.

``TABLE`` is an ``iceberg:CATALOG?table=NS.NAME`` address
(:data:`exactly.connectors.iceberg.catalog.ADDRESS_FORM`) or a Delta table (``delta:PATH``,
or a directory / ``s3://`` prefix holding ``_delta_log/``). Each pass is one commit that
changes no row (:mod:`exactly.connectors.delta.compaction`,
:mod:`exactly.connectors.iceberg.compaction`) and never makes an epoch commit fail; with
``every`` a pass runs every that many seconds until the process is stopped, and a pass that
lost its races to the job's commits is reported and the next one goes on.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exactly.errors import ConfigError
from exactly.logs import log_event

logger = logging.getLogger("exactly.compaction")


@dataclass(frozen=True)
class CompactionPlan:
    """What a pass compacts and how (``target_file_bytes`` None: the format's default)."""

    table: str
    target_file_bytes: int | None = None
    min_input_files: int = 2
    keep_newest_epochs: int = 0
    split_after: tuple[int, ...] = ()
    dry_run: bool = False


def table_kind(table: str) -> str:
    """``iceberg`` or ``delta``; ConfigError naming both forms for anything else."""
    if table.startswith("iceberg:"):
        return "iceberg"
    if table.startswith("delta:"):
        return "delta"
    from exactly.objectstore import Location

    location = Location.parse(table)
    fs, base = location.filesystem()
    import pyarrow.fs as pafs

    if fs.get_file_info(f"{base}/_delta_log").type == pafs.FileType.Directory:
        return "delta"
    raise ConfigError(f"{table} is neither an Iceberg table (iceberg:CATALOG?table=NS.NAME) "
                      "nor a Delta table (a directory or s3:// prefix holding _delta_log/, or "
                      "delta:PATH)")


def check_table(table: str) -> str:
    """:func:`table_kind`, an Iceberg address parsed too (ConfigError naming the form)."""
    kind = table_kind(table)
    if kind == "iceberg":
        from exactly.connectors.iceberg.catalog import IcebergAddress

        IcebergAddress.parse(table)
    return kind


def compact_once(plan: CompactionPlan) -> dict[str, Any]:
    """One pass; its result as JSON (``format`` and the compaction's own fields)."""
    kind = table_kind(plan.table)
    sizes = {} if plan.target_file_bytes is None else {
        "target_file_bytes": plan.target_file_bytes}
    if kind == "iceberg":
        from exactly.connectors.iceberg.catalog import IcebergAddress
        from exactly.connectors.iceberg.compaction import compact_iceberg

        address = IcebergAddress.parse(plan.table)
        result: Any = compact_iceberg(
            address.catalog, address.table, min_input_files=plan.min_input_files,
            keep_newest_epochs=plan.keep_newest_epochs, split_after=plan.split_after,
            dry_run=plan.dry_run, **sizes)
    else:
        from exactly.connectors.delta.compaction import compact_delta

        uri = plan.table[len("delta:"):] if plan.table.startswith("delta:") else plan.table
        from exactly.connectors.delta.compaction import DEFAULT_TARGET_FILE_BYTES

        result = compact_delta(uri, target_file_bytes=plan.target_file_bytes
                               or DEFAULT_TARGET_FILE_BYTES,
                               min_input_files=plan.min_input_files,
                               keep_newest_epochs=plan.keep_newest_epochs,
                               split_after=plan.split_after, dry_run=plan.dry_run)
    return {"format": kind, "table": plan.table, **result.to_json()}


def compact_every(plan: CompactionPlan, seconds: float, emit: Callable[[str], None],
                  stop: threading.Event, *, passes: int | None = None,
                  failures: Iterable[type[BaseException]] = ()) -> int:
    """A pass every ``seconds`` until ``stop`` is set (or ``passes`` ran), each result one
    JSON line through ``emit``; a pass that fails with one of ``failures`` (lost races) is
    emitted as ``{"error": ...}`` and the next goes on. Returns the passes that committed."""
    committed = ran = 0
    lost = tuple(failures)
    while not stop.is_set() and (passes is None or ran < passes):
        ran += 1
        try:
            result = compact_once(plan)
        except lost as exc:
            log_event(logger, "compaction_pass_failed", logging.WARNING, table=plan.table,
                      detail=str(exc))
            emit(json.dumps({"table": plan.table, "error": str(exc)}))
        else:
            committed += result.get("snapshot", result.get("table_version")) is not None
            emit(json.dumps(result))
        stop.wait(seconds)
    return committed

"""Epoch identity: an epoch is its number AND its input (docs/design.md section 3).

Spark can plan an epoch number again over different input: an operator deletes a torn
``offsets/N`` (and ``commits/N``) while more input arrived, a checkpoint is restored from an
older copy, a future re-planning of a timed-out epoch. The sink's commit log would then see
a commit call for an epoch it already completed. Treating it as a replay silently drops the
input the first commit did not cover; committing it again duplicates the input both share.
So the sink records the positions every epoch consumed (``offsets/N``'s source lines) with
its intent and completion, and compares:

* same input -> a replay: abort the new handles, as always;
* different input -> :class:`~exactly.errors.ReplannedEpochError`: nothing of the call is
  committed, the query fails, and the message names both positions and the repair
  (``exactly restore-offsets`` puts back the entry the epoch was committed with);
* no record (a log written before epochs recorded their input, or a sink used without a
  checkpoint location) -> treated as a replay, with a WARNING that says it was not checked.

:func:`check_checkpoint_against_log` runs the same comparison before a query starts, so a
re-planned epoch is refused before Spark runs anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactly.checkpoint.spark_files import (
    EpochInput,
    batch_numbers,
    describe_positions,
    read_metadata,
    read_offsets,
)
from exactly.checkpoint.store import open_log_store
from exactly.errors import CorruptCheckpointFileError, CorruptFileError, ReplannedEpochError
from exactly.fsutil import parse_json
from exactly.protocol.commitlog import CommitLog


def input_record(location: str | None, epoch: int) -> dict[str, Any] | None:
    """What the commit log records about epoch ``epoch``'s input, read from Spark's
    ``offsets/<epoch>`` under the checkpoint ``location`` (``None`` without a location)."""
    if not location:
        return None
    entry = read_offsets(location, epoch)
    if entry is None:
        raise CorruptCheckpointFileError(
            f"{location.rstrip('/')}/offsets/{epoch}",
            f"is missing while the sink commits epoch {epoch} (Spark writes it before the "
            "epoch runs)",
            "check that option checkpointLocation names this query's checkpoint directory")
    return {**entry.input.to_json(), "offsets_log": entry.text}


def same_input(recorded: dict[str, Any] | None, current: dict[str, Any] | None) -> bool | None:
    """True/False when both are known, ``None`` when either is missing."""
    if not recorded or not current or "digest" not in recorded or "digest" not in current:
        return None
    return recorded["digest"] == current["digest"]


def replanned_error(epoch: int, recorded: dict[str, Any], current: dict[str, Any] | None,
                    record_path: Path | str, log_directory: str | Path,
                    checkpoint: str | None) -> ReplannedEpochError:
    """The error for a commit (or a start) whose epoch ``epoch`` differs from the record."""
    ck = checkpoint or "<checkpoint>"
    now = (f"Spark now plans epoch {epoch} over different input {describe_positions(current)} "
           f"(offsets/{epoch} in {ck})" if current is not None else
           f"the checkpoint {ck} no longer holds offsets/{epoch}, so Spark will plan epoch "
           f"{epoch} again over whatever input is there now")
    return ReplannedEpochError(
        f"epoch {epoch} was already committed by this sink over input "
        f"{describe_positions(recorded)} "
        f"(recorded in {record_path}), but {now}. Spark re-plans an epoch when offsets/{epoch} "
        "was deleted or rewritten after the epoch committed (e.g. to get past a torn offsets "
        "file) or when an older copy of the checkpoint was restored. Dropping the new epoch "
        "would lose the input the first commit did not cover, committing it would duplicate "
        "the input both share: nothing of it was committed. Repair: with the query stopped, "
        f"run `exactly restore-offsets {ck} --sink-log {log_directory} --epoch {epoch}` to "
        "put back the offsets entry the epoch was committed with (repeat for each epoch "
        "`exactly doctor` reports), then restart: Spark replays the epoch as committed and "
        "reads the newer input in the epochs after it."
    )


def check_checkpoint_against_log(checkpoint: str, log_directory: Path | str) -> None:
    """Before a start: every epoch the sink completed and still records must be in Spark's
    offset log with the same input, else Spark would re-plan it. Raises
    :class:`ReplannedEpochError` for the first one that is not. Does nothing when the log
    belongs to another query (the ownership check at the first commit reports that)."""
    log = CommitLog(log_directory)
    completed = log.completed_epochs()
    if not completed or not _same_query(checkpoint, log_directory):
        return
    last_planned = _last_offsets_epoch(checkpoint)
    restored = _restored_source_order(checkpoint)
    for epoch in completed:
        recorded = (log.completion(epoch) or {}).get("input")
        if not recorded:
            continue
        entry = read_offsets(checkpoint, epoch)
        if entry is None:
            if last_planned < epoch:
                raise replanned_error(epoch, recorded, None, log.completion_path(epoch),
                                      log_directory, checkpoint)
            continue  # purged by Spark below its retained window: never planned again
        current = entry.input.to_json()
        if same_input(recorded, current) is False and not _reordered_by_restore(
                recorded, current, epoch, restored):
            raise replanned_error(epoch, recorded, current, log.completion_path(epoch),
                                  log_directory, checkpoint)


def _restored_source_order(checkpoint: str) -> tuple[int, list[int | None]] | None:
    """``(N, order)`` when the checkpoint was restored from a savepoint at epoch N whose
    source positions the restore put in another order (the restore marker's
    ``source_positions_from``: for each source now, the savepoint's source number it
    resumes, None for a new one); None otherwise (also for an unreadable marker: the
    check then compares as it always does)."""
    from exactly.checkpoint.location import job_store
    from exactly.checkpoint.restore_marker import read_restore_marker

    try:
        marker = read_restore_marker(job_store(checkpoint))
    except CorruptFileError:  # reported where the restore reads it
        return None
    if not marker or marker.get("state") != "done":
        return None
    epoch, order = marker.get("epoch"), marker.get("source_positions_from")
    if not isinstance(epoch, int) or not isinstance(order, list):
        return None
    return epoch, order


def _reordered_by_restore(recorded: dict[str, Any], current: dict[str, Any], epoch: int,
                          restored: tuple[int, list[int | None]] | None) -> bool:
    """Whether epoch ``epoch`` (at or before the restored epoch N) has the recorded input,
    once the restore's new source order is applied to the record: the same epoch, with
    sources that moved, new (no offset) or dropped by the restore, not a re-planned one."""
    if restored is None or epoch > restored[0] or not isinstance(
            recorded.get("sources"), list):
        return False
    sources = recorded["sources"]
    if any(j is not None and not 0 <= j < len(sources) for j in restored[1]):
        return False
    mapped = [sources[j] if j is not None else None for j in restored[1]]
    return EpochInput.of(epoch, mapped).digest == current.get("digest")


def _same_query(checkpoint: str, log_directory: Path | str) -> bool:
    store = open_log_store(log_directory)
    data = store.read("query.json")
    owner = (parse_json(data, store.describe("query.json")) or {}).get("query_id") \
        if data is not None else None
    return bool(owner) and owner == read_metadata(checkpoint)


def _last_offsets_epoch(checkpoint: str) -> int:
    """The newest epoch in Spark's offset log (-1 when empty)."""
    return max(batch_numbers(checkpoint, "offsets"), default=-1)

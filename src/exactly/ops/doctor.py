"""``exactly doctor``: an offline check of a checkpoint and an exactly sink's commit log.

It reads, never writes: every damaged, missing or stray file of Spark's checkpoint
(``metadata``, ``offsets/N``, ``commits/N``, their ``.crc``), gaps in Spark's logs, and the
sink's commit log against them (the query id, intents without a completion, completed epochs
Spark would plan again or has planned over different input), and the lease holder. Each
finding names the file, what is wrong and the safe repair.

The repair texts come from :mod:`exactly.protocol.repairs`, shared with the readers of each file.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.layout import JOB_DIR as JOB_DIR_NAME
from exactly.checkpoint.location import checkpoint_exists
from exactly.checkpoint.mirror import mirrored
from exactly.checkpoint.spark_files import (
    Finding,
    batch_numbers,
    check_files,
    describe_positions,
    local_checkpoint,
    read_metadata,
    read_offsets,
)
from exactly.checkpoint.store import is_remote
from exactly.errors import CorruptCheckpointFileError, CorruptFileError, ExactlyError
from exactly.fsutil import read_json, require_fields
from exactly.protocol.lease import Lease, LeaseState
from exactly.protocol.repairs import (
    completion_repair,
    intent_repair,
    log_file_name,
    marker_repair,
    query_repair,
    task_repair,
)

#: what only Spark (or exactly's sink log) writes into a checkpoint: one of them makes it one
SPARK_CHECKPOINT_ENTRIES = ("metadata", "offsets", "commits", "sources", "state",
                            layout.SINK_LOG_DIR)
_LOG_FILE = re.compile(r"^(\d+)\.json$")


# -- discovery -----------------------------------------------------------------------------
def sink_log_for(checkpoint: str | Path, sink_log: str | Path | None = None,
                 sink_path: str | Path | None = None) -> Path | None:
    """The sink's commit log: ``--sink-log``, ``<--sink-path>/_exactly`` (file sink), or
    ``<checkpoint>/exactly-sink`` when it exists (every other exactly sink)."""
    if sink_log:
        return Path(sink_log)
    if sink_path:
        return Path(sink_path) / layout.OUTPUT_LOG_DIR
    local = local_checkpoint(str(checkpoint))
    if local is not None and (local / layout.SINK_LOG_DIR).is_dir():
        return local / layout.SINK_LOG_DIR
    return None


# -- the report ------------------------------------------------------------------------------
@dataclass
class Report:
    checkpoint: str
    sink_log: str | None
    findings: list[Finding] = field(default_factory=list)
    query_id: str | None = None
    sink_query_id: str | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def add(self, severity: str, path: str | Path, problem: str, repair: str = "") -> None:
        self.findings.append(Finding(severity, str(path), problem, repair))

    def renamed(self, names: dict[str, str]) -> Report:
        """This report with the paths of local copies named as the originals (``names``:
        copy -> original; the longest first, so a copy inside another maps right)."""
        order = sorted(names, key=len, reverse=True)

        def name(text: str | None) -> str | None:
            if text is None:
                return None
            for copy in order:
                text = text.replace(copy, names[copy])
            return text

        return Report(name(self.checkpoint) or self.checkpoint, name(self.sink_log),
                      [Finding(f.severity, name(f.path) or f.path, name(f.problem) or "",
                               name(f.repair) or "") for f in self.findings],
                      self.query_id, self.sink_query_id)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checkpoint": self.checkpoint, "sink_log": self.sink_log,
                "query_id": self.query_id, "sink_query_id": self.sink_query_id,
                "findings": [f.to_json() for f in self.findings]}


def diagnose(checkpoint: str | Path, sink_log: str | Path | None = None,
             sink_path: str | Path | None = None, table: str | None = None) -> Report:
    """Check ``checkpoint`` and the sink's commit log; changes nothing.

    A directory without any of :data:`SPARK_CHECKPOINT_ENTRIES` is an error (not a
    checkpoint: empty, or e.g. an input directory), unless it holds ``exactly-job/`` only:
    ``exactly run`` started on it and its query has not run yet (reported as info). A
    checkpoint or sink log on S3 is checked on a local copy of its small files
    (:mod:`exactly.checkpoint.mirror`); the findings name the S3 objects.
    """
    if is_remote(checkpoint) or (sink_log is not None and is_remote(sink_log)):
        return _diagnose_remote(str(checkpoint), str(sink_log) if sink_log else None,
                                sink_path, table)
    report = _diagnose(checkpoint, sink_log, sink_path)
    if table is not None:
        _check_table(report, table, Path(report.sink_log) if report.sink_log else None)
    return report


def _check_table(report: Report, table: str, log: Path | None) -> None:
    """The findings of the sink's table (``table``: an ``iceberg:`` address) about the sink
    log's query and the epochs the log completed (``log``: the sink log on a local disk, a
    remote one's local copy)."""
    from exactly.connectors.iceberg.catalog import IcebergAddress
    from exactly.connectors.iceberg.health import table_findings

    try:
        address = IcebergAddress.parse(table)
    except ExactlyError as exc:
        report.add("error", table, str(exc), "give the table as iceberg:CATALOG?table=NS.NAME")
        return
    completed: list[int] = []
    folder = None if log is None else log / "complete"
    if folder is not None and folder.is_dir():
        completed = [int(m.group(1)) for p in folder.iterdir()
                     if (m := _LOG_FILE.match(p.name))]
    for finding in table_findings(address, report.sink_query_id, completed):
        report.add(finding.severity, finding.path, finding.problem, finding.repair)


def _diagnose_remote(checkpoint: str, sink_log: str | None,
                     sink_path: str | Path | None, table: str | None = None) -> Report:
    """:func:`_diagnose` on a local copy of the checkpoint and the sink log; the table
    check (``table``) reads the copy's completed epochs, while the copy lasts."""
    if not checkpoint_exists(checkpoint):
        report = Report(checkpoint, sink_log)
        report.add("error", checkpoint, "does not exist (no object under this prefix)",
                   "name the checkpoint the job was started with")
        if table is not None:
            _check_table(report, table, None)
        return report
    remote_log = sink_log or (layout.join(checkpoint, layout.SINK_LOG_DIR))
    with mirrored(checkpoint, sink_log) as (root, log):
        report = _diagnose(root, log, sink_path)
        if table is not None:
            _check_table(report, table, log)
        names = {str(root): checkpoint}
        if log is not None:
            names[str(log)] = remote_log
        return report.renamed(names)


def _diagnose(checkpoint: str | Path, sink_log: str | Path | None = None,
              sink_path: str | Path | None = None) -> Report:
    location = str(checkpoint)
    log = sink_log_for(location, sink_log, sink_path)
    report = Report(location, str(log) if log else None)
    local = local_checkpoint(location)
    if local is None:
        report.add("error", location, "is not a local checkpoint; doctor reads local "
                   "directories only", "copy the checkpoint to a local disk and check the copy")
        return report
    if not local.is_dir():
        report.add("error", local, "does not exist (no checkpoint here)",
                   "name the directory given as checkpointLocation")
        return report
    if not _holds_any(local, SPARK_CHECKPOINT_ENTRIES):
        if not (local / JOB_DIR_NAME).is_dir():  # `exactly run` writes it first
            report.add("error", local, _not_a_checkpoint(local),
                       "give the directory a query was started with as its checkpoint "
                       "(checkpointLocation, CheckpointConfig(storage=DIR) or `exactly run "
                       "--checkpoint DIR`); a file sink's output goes to --sink-path")
            return report
        report.add("info", local, f"no query has run on it yet: `exactly run` started on it "
                   f"({JOB_DIR_NAME}/) but Spark has written no metadata, offsets/ or commits/",
                   "none needed: the query's first start writes them")
    if log is not None:
        report.sink_query_id = _sink_query_id(report, log)
    report.findings.extend(check_files(location, report.sink_query_id))
    with contextlib.suppress(CorruptCheckpointFileError):  # reported by check_files
        report.query_id = read_metadata(location)
    offsets, commits = _check_spark_logs(report, local)
    if log is None:
        report.add("info", local / layout.SINK_LOG_DIR,
                   "no exactly sink log found (the file sink keeps it in <output>/_exactly)",
                   "pass --sink-path OUTPUT for the file sink or --sink-log DIR")
    elif not log.is_dir():
        report.add("error", log, "does not exist (no exactly sink commit log here)",
                   "pass the sink's log directory (--sink-log) or its output (--sink-path)")
    else:
        _check_sink_log(report, location, log, offsets, commits)
        if sink_path:
            _check_staging(report, Path(sink_path) / "_staging")
    return report


def _holds_any(directory: Path, names: tuple[str, ...]) -> bool:
    return any((directory / name).exists() for name in names)


def _not_a_checkpoint(directory: Path) -> str:
    entries = sorted(p.name for p in directory.iterdir())
    if not entries:
        return "is empty: not a checkpoint (no metadata, offsets/ or commits/ in it)"
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    return (f"is not a checkpoint: it holds {shown} but no metadata, offsets/ or commits/ "
            "(an input or output directory?)")


def _sink_query_id(report: Report, log: Path) -> str | None:
    path = log / "query.json"
    try:
        data = read_json(path, repair=query_repair(log))
        if data is None:
            return None
        return str(require_fields(data, path, ("query_id",), query_repair(log))["query_id"])
    except CorruptFileError as exc:
        report.findings.append(Finding.of(exc))
        return None


def _check_spark_logs(report: Report, local: Path) -> tuple[list[int], list[int]]:
    location = str(local)
    offsets = batch_numbers(location, "offsets")
    commits = batch_numbers(location, "commits")
    for log, numbers in (("offsets", offsets), ("commits", commits)):
        if numbers:
            missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
            for run in _runs(missing):
                first, last = run[0], run[-1]
                which = f"{log}/{first}" if first == last else f"{log}/{first}..{last}"
                report.add("warning", local / log / str(first),
                           f"{which} missing inside {log}/{numbers[0]}..{numbers[-1]} (a gap: "
                           "files were deleted by hand; Spark reads only the newest entries)",
                           "if the exactly sink recorded these epochs, `exactly "
                           "restore-offsets` puts offsets entries back; otherwise none needed"
                           if log == "offsets" else "none needed")
    known = set(offsets)
    newest = offsets[-1] if offsets else -1
    for n in commits:
        if n in known:
            continue
        if n > newest or (offsets and n > offsets[0]):
            report.add("error", local / "commits" / str(n),
                       f"commits/{n} exists without offsets/{n} (the offsets entry of a "
                       "committed epoch was deleted)",
                       f"if the exactly sink recorded epoch {n}, run `exactly restore-offsets "
                       f"{local} --epoch {n}`; otherwise delete commits/{n} and its .crc so "
                       "Spark plans the epoch again")
    return offsets, commits


def _runs(numbers: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][-1] == n - 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _epochs(folder: Path, report: Report) -> list[int]:
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        match = _LOG_FILE.match(path.name)
        if match:
            found.append(int(match.group(1)))
        elif path.name.startswith(".") and path.name.endswith(".tmp"):
            report.add("warning", path, "is a temporary file left by an interrupted atomic "
                       "write (never read)", "delete it once no query runs")
        else:
            report.add("warning", path, "is not a file of the commit log (never read)",
                       "move it out of the sink's log directory")
    return sorted(found)


def _check_sink_log(report: Report, location: str, log: Path, offsets: list[int],
                    commits: list[int]) -> None:
    if report.sink_query_id is None and not any(
            f.path == str(log / "query.json") for f in report.findings):
        report.add("info", log / "query.json", "is absent: the sink has not committed yet")
    if report.sink_query_id and report.query_id and report.sink_query_id != report.query_id:
        report.add("error", log / "query.json",
                   f"names query {report.sink_query_id}, but the checkpoint is query "
                   f"{report.query_id}: the first commit would fail with OwnershipError",
                   "start the query on the checkpoint this sink belongs to, or give this "
                   "checkpoint a new, empty output")
    _check_lease(report, log)
    try:
        read_json(log / "recovered-by.json", repair=marker_repair(log))
    except CorruptFileError as exc:
        report.findings.append(Finding.of(exc))
    intents = _epochs(log / "intents", report)
    completed = _epochs(log / "complete", report)
    done = set(completed)
    records: dict[int, dict[str, Any]] = {}
    for epoch in intents:
        path = log / "intents" / log_file_name(epoch)
        try:
            data = require_fields(read_json(path, repair=intent_repair(log, epoch)), path,
                                  ("epoch", "run_id", "handles"), intent_repair(log, epoch))
        except CorruptFileError as exc:
            report.findings.append(Finding.of(exc))
            continue
        if data.get("input"):
            records[epoch] = data["input"]
        if epoch not in done:
            report.add("info", path, f"epoch {epoch} has an intent without a completion: "
                       "recovery is pending (the next start commits its handles)")
    newest = offsets[-1] if offsets else -1
    unchecked = 0
    for epoch in completed:
        path = log / "complete" / log_file_name(epoch)
        try:
            data = require_fields(read_json(path, repair=completion_repair(log, epoch)), path,
                                  ("epoch",), completion_repair(log, epoch))
        except CorruptFileError as exc:
            report.findings.append(Finding.of(exc))
            continue
        recorded = data.get("input") or records.get(epoch)
        restore = (f"with the query stopped, run `exactly restore-offsets {location} "
                   f"--sink-log {log} --epoch {epoch}`")
        if epoch > newest:
            report.add("error", path,
                       f"epoch {epoch} is committed by the sink but Spark's offset log ends at "
                       f"{'offsets/' + str(newest) if newest >= 0 else 'nothing'}: Spark would "
                       "plan the epoch again over whatever input is there now",
                       restore if recorded else "restore the checkpoint's offsets/ from a "
                       "backup, or start over with a new checkpoint and a new output")
            continue
        if not recorded:
            unchecked += 1
            continue
        try:
            entry = read_offsets(location, epoch)
        except CorruptCheckpointFileError:
            continue  # reported by check_files, with this repair
        if entry is None:
            continue  # below Spark's retained window: never planned again
        if entry.input.digest != recorded.get("digest"):
            report.add("error", path,
                       f"epoch {epoch} was committed over input "
                       f"{describe_positions(recorded)}, but "
                       f"offsets/{epoch} now holds {entry.input.describe()}: Spark re-planned "
                       "the epoch (the next commit fails with ReplannedEpochError)", restore)
    if unchecked:
        report.add("info", log / "complete",
                   f"{unchecked} completed epoch(s) record no input (written before epochs "
                   "recorded it): not compared with offsets/")
    if completed and commits and commits[-1] > completed[-1] + 1 and report.sink_query_id:
        report.add("info", log / "complete",
                   f"Spark committed epochs up to {commits[-1]}, the sink up to "
                   f"{completed[-1]} (epochs without rows commit nothing)")


def lease_holder(log: Path) -> tuple[LeaseState | None, bool | None]:
    """The lease and whether its holder is alive (``None``: another host, not stale yet is
    reported as alive by the caller's rules). Raises CorruptFileError when damaged."""
    state = Lease(log).current()
    if state is None:
        return None, False
    if state.released:  # its run ended and gave it up: nobody may use it
        return state, False
    return state, state.holder.is_alive()


def holder_alive(log: Path) -> tuple[LeaseState | None, bool]:
    """The lease and whether a driver may still use it (alive, or on another host and renewed
    within the default stale time)."""
    state, alive = lease_holder(log)
    if state is None:
        return None, False
    if alive is None:
        return state, not Lease(log).is_stale()
    return state, alive


def _check_lease(report: Report, log: Path) -> None:
    path = log / "lease.json"
    try:
        state, alive = lease_holder(log)
    except CorruptFileError as exc:
        report.findings.append(Finding.of(exc))
        return
    if state is None:
        report.add("info", path, "nobody holds the lease")
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.acquired_at))
    who = (f"run {state.run_id} (generation {state.generation}), driver pid "
           f"{state.holder.pid} on {state.holder.host}, since {since}")
    if state.released_at is not None:
        ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.released_at))
        report.add("info", path, f"released at {ended} by {who}: its query ended (the next "
                   "start takes the lease over)")
    elif alive is None:
        age = time.time() - state.renewed_at
        report.add("info", path, f"held by {who}: on another host, renewed {age:.0f} s ago")
    elif alive:
        report.add("warning", path, f"held by {who}: that driver is alive, so the query is "
                   "probably running and this report may already be out of date",
                   "stop the query before any repair")
    else:
        report.add("info", path, f"held by {who}: that driver is gone (the next start takes "
                   "the lease over)")


def _check_staging(report: Report, staging: Path) -> None:
    if not staging.is_dir():
        return
    for task in sorted(staging.glob("*/*/task.json")):
        if task.stat().st_size == 0:  # not fsynced: a power loss may empty it, and
            continue  # recovery aborts such an attempt as an unknown one (protocol.staging)
        try:
            read_json(task, repair=task_repair(task.parent))
        except CorruptFileError as exc:
            report.findings.append(Finding.of(exc))


# -- restore-offsets ---------------------------------------------------------------------------
class RefusedError(ExactlyError):
    """restore-offsets will not write: the message says why."""


def recorded_offsets(log: Path, epoch: int) -> tuple[str, Path]:
    """The raw ``offsets/<epoch>`` text the sink recorded when it committed (or intended to
    commit) ``epoch``, and the file it came from."""
    for folder, repair in (("complete", completion_repair), ("intents", intent_repair)):
        path = log / folder / log_file_name(epoch)
        data = read_json(path, repair=repair(log, epoch))
        record = data.get("input") if isinstance(data, dict) else None
        if record and record.get("offsets_log"):
            return record["offsets_log"], path
    raise RefusedError(
        f"the sink log {log} has no record of epoch {epoch}'s offsets (neither "
        f"complete/{log_file_name(epoch)} nor intents/{log_file_name(epoch)} holds an input with "
        "offsets_log: the epoch is unknown, was pruned, or was committed before epochs "
        "recorded their input). Nothing was written.")


def restore(checkpoint: str | Path, log: Path, epoch: int) -> str:
    """Write the sink's record of ``epoch`` back as ``offsets/<epoch>``; returns the file.

    Refuses (:class:`RefusedError`) while a driver holding the sink's lease is alive, when
    the sink has no record of the epoch, when the sink and the checkpoint belong to different
    queries, and when ``offsets/<epoch>`` already holds the recorded input.
    """
    from exactly.checkpoint.spark_files import restore_offsets

    location = str(checkpoint)
    if not log.is_dir():
        raise RefusedError(f"{log} is not an exactly sink log directory. Nothing was written.")
    state, alive = holder_alive(log)
    if state is not None and alive:
        raise RefusedError(
            f"driver pid {state.holder.pid} on {state.holder.host} holds the sink's lease "
            f"({log / 'lease.json'}) and is alive: the query seems to be running. Stop it "
            "(and its Spark application: the lease names the driver process), then run "
            "restore-offsets again. Nothing was written.")
    text, source = recorded_offsets(log, epoch)
    sink_query = (read_json(log / "query.json", repair=query_repair(log)) or {}).get("query_id")
    try:
        query_id = read_metadata(location, sink_query)
    except CorruptCheckpointFileError:
        query_id = None
    if sink_query and query_id and sink_query != query_id:
        raise RefusedError(
            f"the sink log {log} belongs to query {sink_query}, the checkpoint {location} to "
            f"query {query_id}: they are not a pair. Nothing was written.")
    try:
        current = read_offsets(location, epoch)
    except CorruptCheckpointFileError:
        current = None  # a torn entry is what the restore replaces
    from exactly.checkpoint.spark_files import parse_offsets

    wanted = parse_offsets(text, epoch, str(source))
    if current is not None and current.input.digest == wanted.input.digest:
        raise RefusedError(
            f"offsets/{epoch} in {location} already holds the input the sink recorded for "
            f"epoch {epoch} ({wanted.input.describe()}): nothing to restore.")
    return restore_offsets(location, epoch, text)


def restore_from_sink_log(checkpoint: str, sink_log: str | None, sink_path: str | None,
                          epoch: int) -> str:
    """:func:`restore` with the sink log found as ``exactly doctor`` finds it; on S3 the
    sink log is read from a local copy (:mod:`exactly.checkpoint.mirror`) and the entry is
    written back to the checkpoint on S3 (one PUT). Raises RefusedError naming the S3
    objects when nothing may be written."""
    if not (is_remote(checkpoint) or (sink_log is not None and is_remote(sink_log))):
        log = sink_log_for(checkpoint, sink_log, sink_path)
        if log is None:
            raise RefusedError(f"no exactly sink log found under {checkpoint}: pass "
                               "--sink-log DIR or --sink-path OUTPUT. Nothing was written.")
        return restore(checkpoint, log, epoch)
    remote_log = sink_log or layout.join(checkpoint, layout.SINK_LOG_DIR)
    with mirrored(checkpoint, sink_log) as (root, copy):
        if sink_path is not None or (sink_log is not None and not is_remote(sink_log)):
            copy = sink_log_for(root, sink_log, sink_path)  # a local log: read in place
            remote_log = str(copy)
        if copy is None:
            raise RefusedError(f"no exactly sink log found under {checkpoint}: pass "
                               "--sink-log s3://... Nothing was written.")
        try:
            return restore(checkpoint, copy, epoch)
        except RefusedError as exc:
            raise RefusedError(str(exc).replace(str(copy), remote_log)
                               .replace(str(root), checkpoint)) from None


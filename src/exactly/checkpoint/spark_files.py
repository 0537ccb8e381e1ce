"""Spark's own checkpoint files, read and checked: ``metadata``, ``offsets/N``, ``commits/N``.

Spark's streaming checkpoint directory holds::

    metadata            {"id": "<query id>"}            the query, stable across restarts
    offsets/N           v1 / batch metadata JSON / one line per source ("-" when none)
    commits/N           v1 / {"nextBatchWatermarkMs": ...}  written after the sink committed N
    .N.crc              Hadoop checksum beside each file (optional; checked when present)

The offset log entry of epoch N is written *before* N runs: its source lines are the
epoch's input positions (the barrier). :class:`EpochInput` is what an exactly sink records
about them when it commits N, so a later commit call for the same number can tell a replay
(same positions) from a re-planned epoch (different positions; see docs/design.md section 3,
"Epoch identity").

Every reader here fails with :class:`~exactly.errors.CorruptCheckpointFileError`, which names
the file, what is wrong with it and the safe repair, instead of Spark's bare "Incomplete log
file" or a Jackson error without a path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.checkpoint.location import local_checkpoint, open_store
from exactly.errors import CorruptCheckpointFileError

VERSION_LINE = "v1"
LOGS = ("offsets", "commits")
#: Spark's temporary files: ``.<name>.<uuid>.tmp`` (and their ``..<name>.<uuid>.tmp.crc``)
_TEMP = re.compile(r"^\.+.*\.tmp(\.crc)?$")

logger = logging.getLogger("exactly.checkpoint")


def _read_text(location: str, relative: str, repair: str | None = None) -> str | None:
    """Text of ``relative`` under the checkpoint, or ``None`` when the file does not exist."""
    local = local_checkpoint(location)
    if local is not None:
        path = local / relative
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        problem = checksum_problem(path, data)
        if problem is not None:
            raise CorruptCheckpointFileError(str(path), problem,
                                             repair or _repair_hint(relative))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointFileError(
                str(path), "is not UTF-8 text", repair or _repair_hint(relative)) from None
    stored = open_store(location).read(relative)  # S3A writes no checksum files
    if stored is None:
        return None
    try:
        return stored.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptCheckpointFileError(_where(location, relative), "is not UTF-8 text",
                                         repair or _repair_hint(relative)) from None


def checksum_problem(path: Path, data: bytes | None = None) -> str | None:
    """What is wrong with ``path`` against its Hadoop checksum file ``.<name>.crc``, or
    ``None`` when it matches or has no checksum file.

    The ``.crc`` format: ``b"crc\\0"``, the bytes per checksum (big-endian int32), then one
    big-endian CRC-32 per chunk. A torn or edited file no longer matches.
    """
    crc_path = path.parent / f".{path.name}.crc"
    try:
        crc = crc_path.read_bytes()
    except FileNotFoundError:
        return None
    if data is None:
        data = path.read_bytes()
    if len(crc) < 8 or crc[:4] != b"crc\0":
        return f"has an unreadable checksum file {crc_path}"
    per_sum = struct.unpack(">i", crc[4:8])[0]
    sums = [struct.unpack(">I", crc[i:i + 4])[0] for i in range(8, len(crc) - 3, 4)]
    chunks = [data[i:i + per_sum] for i in range(0, len(data), per_sum)] if per_sum > 0 else []
    if len(sums) != len(chunks) or any(
            zlib.crc32(c) != s for c, s in zip(chunks, sums, strict=True)):
        return (f"does not match its checksum file {crc_path.name} ({len(data)} bytes now): "
                "it was truncated or changed after Spark wrote it")
    return None


def _where(location: str, relative: str) -> str:
    local = local_checkpoint(location)
    return str(local / relative) if local is not None else f"{location.rstrip('/')}/{relative}"


def _repair_hint(relative: str) -> str:
    if relative.startswith("offsets/"):
        return ("if the sink recorded this epoch, restore the entry with `exactly "
                "restore-offsets`; otherwise (the epoch never committed anywhere) delete it "
                "and its .crc so Spark plans the epoch again")
    if relative.startswith("commits/"):
        return ("delete it and its .crc: Spark then runs the epoch again, and the exactly "
                "sink recognises the replay")
    return "restore it from a backup, or start the query on a new checkpoint"


def read_commit(location: str, epoch: int) -> dict[str, Any] | None:
    """``commits/<epoch>`` (its JSON line, e.g. ``{"nextBatchWatermarkMs": 0}``), or
    ``None`` if absent; fails with :class:`CorruptCheckpointFileError` when damaged."""
    relative = f"commits/{epoch}"
    text = _read_text(location, relative)
    if text is None:
        return None
    where, fix = _where(location, relative), _repair_hint(relative)
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines or lines[0].strip() != VERSION_LINE:
        raise CorruptCheckpointFileError(
            where, f"does not start with the version line {VERSION_LINE!r}", fix)
    if len(lines) < 2:
        raise CorruptCheckpointFileError(
            where, "is truncated (incomplete log file: no commit metadata after the version)",
            fix)
    try:
        value = json.loads(lines[1])
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointFileError(where, f"has unreadable commit metadata ({exc})",
                                         fix) from None
    if not isinstance(value, dict):
        raise CorruptCheckpointFileError(where, "has commit metadata that is not an object",
                                         fix)
    return value


def read_metadata(location: str, sink_query_id: str | None = None) -> str | None:
    """The query id in the checkpoint's ``metadata`` file, or ``None`` if it is absent.

    ``sink_query_id`` (the id an exactly sink recorded for this query) makes the repair of
    a damaged file concrete.
    """
    text = _read_text(location, "metadata", _metadata_repair(location, sink_query_id))
    if text is None:
        return None
    fix = _metadata_repair(location, sink_query_id)
    where = _where(location, "metadata")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = "is empty" if not text.strip() else f"is not valid JSON ({exc})"
        raise CorruptCheckpointFileError(where, problem, fix) from None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        raise CorruptCheckpointFileError(where, 'has no "id" (the query id)', fix)
    return value["id"]


def _metadata_repair(location: str, sink_query_id: str | None) -> str:
    crc = _where(location, ".metadata.crc")
    if sink_query_id:
        return (f'with the query stopped, write {{"id":"{sink_query_id}"}} into it (the query '
                f"id the exactly sink recorded in its query.json) and delete {crc}")
    return ("restore it from a backup: it holds the query id (an exactly sink records the "
            "same id in its query.json, as query_id). Without it Spark would start a new "
            "query over the old offsets; if the id is lost, start over on a new checkpoint "
            "and a new, empty output")


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or worth knowing) about a checkpoint or a sink log."""

    severity: str  # "error" | "warning" | "info"
    path: str
    problem: str
    repair: str = ""

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "path": self.path, "problem": self.problem,
                "repair": self.repair}

    @classmethod
    def of(cls, error: CorruptCheckpointFileError | Any) -> Finding:
        return cls("error", error.path, error.problem, error.repair)


def batch_numbers(location: str, log: str) -> list[int]:
    """The epochs that have a file in ``offsets/`` or ``commits/``."""
    return sorted(int(name) for name in open_store(location).list(log) if name.isdigit())


def last_committed_epoch(location: str) -> int | None:
    """The newest epoch of the ``commits/`` log (None before the first commit)."""
    commits = batch_numbers(location, "commits")
    return commits[-1] if commits else None


def uncommitted_epoch(location: str) -> int | None:
    """The newest epoch with an ``offsets/`` entry and no ``commits/`` entry (one in flight,
    or one a failure interrupted), or None when every logged epoch is committed."""
    offsets = batch_numbers(location, "offsets")
    commits = batch_numbers(location, "commits")
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return None


def offsets_logged_at(location: str, epoch: int) -> float | None:
    """When Spark wrote ``offsets/<epoch>`` (the epoch's trigger), as a Unix time; None when
    the entry is not there."""
    return open_store(location).modified(f"offsets/{epoch}")


def check_files(location: str, sink_query_id: str | None = None) -> list[Finding]:
    """Every damaged, missing, stray or foreign file of Spark's checkpoint at ``location``.

    Errors are files Spark would fail on (a torn ``metadata``, ``offsets/N``, ``commits/N``,
    a checksum mismatch, a stray ``.N.crc`` whose file was deleted -- Spark then fails with
    the misleading "Multiple streaming queries are concurrently using ..."); warnings are
    files Spark ignores (temporary files, names that are not batch numbers). Reading
    changes nothing.
    """
    local = local_checkpoint(location)
    if local is None:
        return _check_remote_files(location, sink_query_id)
    if not local.is_dir():
        return []
    found: list[Finding] = []
    has_batches = any(batch_numbers(location, log) for log in LOGS)
    try:
        query_id = read_metadata(location, sink_query_id)
        if query_id is None and has_batches:
            found.append(Finding(
                "error", str(local / "metadata"),
                "is missing while the checkpoint holds offsets and commits: Spark would start "
                "a new query with a new id over the old positions",
                _metadata_repair(location, sink_query_id)))
    except CorruptCheckpointFileError as exc:
        found.append(Finding.of(exc))
    crc = local / ".metadata.crc"
    if crc.exists() and not (local / "metadata").exists():
        found.append(_stray_crc(crc, "metadata"))
    for log in LOGS:
        folder = local / log
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            found.extend(_check_log_entry(location, log, path))
    return found


def _check_remote_files(location: str, sink_query_id: str | None) -> list[Finding]:
    """:func:`check_files` on an object store (S3A writes no checksum files)."""
    store = open_store(location)
    found: list[Finding] = []
    try:
        query_id = read_metadata(location, sink_query_id)
        if query_id is None and any(batch_numbers(location, log) for log in LOGS):
            found.append(Finding(
                "error", _where(location, "metadata"),
                "is missing while the checkpoint holds offsets and commits: Spark would start "
                "a new query with a new id over the old positions",
                _metadata_repair(location, sink_query_id)))
    except CorruptCheckpointFileError as exc:
        found.append(Finding.of(exc))
    for log in LOGS:
        for name in sorted(store.list(log)):
            where = _where(location, f"{log}/{name}")
            if name.isdigit():
                reader = read_offsets if log == "offsets" else read_commit
                try:
                    reader(location, int(name))
                except CorruptCheckpointFileError as exc:
                    found.append(Finding.of(exc))
            elif _TEMP.match(name):
                found.append(Finding("warning", where, "is a temporary file left by an "
                                     "interrupted write (Spark ignores it)",
                                     "delete it once no query runs on this checkpoint"))
    return found


def _check_log_entry(location: str, log: str, path: Path) -> list[Finding]:
    name = path.name
    if name.isdigit() and path.is_file():
        reader = read_offsets if log == "offsets" else read_commit
        try:
            reader(location, int(name))
        except CorruptCheckpointFileError as exc:
            return [Finding.of(exc)]
        return []
    if _TEMP.match(name):
        return [Finding("warning", str(path),
                        "is a temporary file left by an interrupted write (Spark ignores it)",
                        "delete it once no query runs on this checkpoint")]
    match = re.fullmatch(r"\.(\d+)\.crc", name)
    if match:
        if not (path.parent / match.group(1)).exists():
            return [_stray_crc(path, f"{log}/{match.group(1)}")]
        return []
    if name.startswith(".") and name.endswith(".crc") and (path.parent / name[1:-4]).exists():
        return []  # the checksum of a file reported on its own
    return [Finding("warning", str(path),
                    f"is not a batch file of {log}/ (its name is not a batch number; Spark "
                    "ignores it)", "move it out of the checkpoint directory")]


def _stray_crc(path: Path, data_file: str) -> Finding:
    return Finding(
        "error", str(path),
        f"is a checksum file whose data file {data_file} is missing (a deleted file whose "
        ".crc was left behind); Spark then fails to write the file again, with the misleading "
        '"Multiple streaming queries are concurrently using ..."',
        f"delete {path} (the checksum of a file that no longer exists)")


def preflight(location: str, sink_query_id: str | None = None) -> list[Finding]:
    """Before Spark starts on an existing checkpoint: raise
    :class:`CorruptCheckpointFileError` for the first file Spark would fail on (naming it,
    unlike Spark), log the harmless findings at WARNING and return them."""
    findings = check_files(location, sink_query_id)
    for finding in findings:
        if finding.severity == "error":
            raise CorruptCheckpointFileError(finding.path, finding.problem, finding.repair)
    for finding in findings:
        logger.warning(json.dumps({"event": "checkpoint_finding", **finding.to_json()}))
    return findings


@dataclass(frozen=True)
class EpochInput:
    """The input positions of one epoch, as Spark wrote them to ``offsets/N``.

    ``sources`` holds one parsed JSON value per source in the query's source order
    (``None`` for a source with no offset yet); ``digest`` identifies them.
    """

    epoch: int
    sources: tuple[Any, ...]
    digest: str

    @classmethod
    def of(cls, epoch: int, sources: list[Any]) -> EpochInput:
        canonical = json.dumps(sources, sort_keys=True, separators=(",", ":"))
        return cls(epoch, tuple(sources), hashlib.sha256(canonical.encode()).hexdigest())

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "sources": list(self.sources)}

    def describe(self) -> str:
        return describe_positions(self.to_json())


def describe_positions(record: dict[str, Any] | None) -> str:
    """The source positions of an input record (``{"sources": [...]}``) as compact JSON."""
    return json.dumps((record or {}).get("sources"), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class OffsetsEntry:
    """One parsed ``offsets/N`` file: its epoch, batch metadata, input and raw text."""

    epoch: int
    metadata: dict[str, Any]
    input: EpochInput
    text: str


def parse_offsets(text: str, epoch: int, where: str) -> OffsetsEntry:
    """Parse the text of ``offsets/<epoch>``; ``where`` names the file in errors."""
    fix = _repair_hint("offsets/")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0].strip() != VERSION_LINE:
        raise CorruptCheckpointFileError(
            where, f"does not start with the version line {VERSION_LINE!r}", fix)
    if len(lines) < 3:
        raise CorruptCheckpointFileError(
            where, "is truncated (incomplete log file: no source offsets after the batch "
            "metadata)", fix)
    try:
        metadata = json.loads(lines[1])
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointFileError(where, f"has unreadable batch metadata ({exc})",
                                         fix) from None
    sources: list[Any] = []
    for number, line in enumerate(lines[2:], start=3):
        if line.strip() == "-":
            sources.append(None)
            continue
        try:
            sources.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CorruptCheckpointFileError(
                where, f"line {number} is not a source offset ({exc})", fix) from None
    return OffsetsEntry(epoch, metadata if isinstance(metadata, dict) else {},
                        EpochInput.of(epoch, sources), text)


def read_offsets(location: str, epoch: int) -> OffsetsEntry | None:
    """``offsets/<epoch>`` of the checkpoint at ``location``, or ``None`` if absent."""
    relative = f"offsets/{epoch}"
    text = _read_text(location, relative)
    if text is None:
        return None
    return parse_offsets(text, epoch, _where(location, relative))


def restore_offsets(location: str, epoch: int, text: str) -> str:
    """Write ``text`` (an offsets entry recorded by the sink) back as ``offsets/<epoch>``
    (whole: a rename on a POSIX directory, one PUT on S3); returns where.

    Removes the stale ``.<epoch>.crc`` beside it (Hadoop would reject the new content).
    Run it while the query is stopped.
    """
    parse_offsets(text, epoch, f"the recorded offsets of epoch {epoch}")  # never write junk
    store = open_store(location)
    store.write(f"offsets/{epoch}", text.encode("utf-8"))
    store.delete(f"offsets/.{epoch}.crc")
    return store.describe(f"offsets/{epoch}")


END_OF_TIME_MS = 253402300799999
"""The event-time watermark of a drained job's final epoch: 9999-12-31T23:59:59.999Z in ms.

Spark multiplies watermark milliseconds by 1000 (microseconds) in comparisons; this value
stays far from ``Long.MAX_VALUE`` after that conversion, so nothing overflows."""


def append_end_of_time_epoch(location: str) -> int | None:
    """Log one more epoch that reads nothing and carries the watermark at the end of time.

    After a drained run ended with last committed epoch N (query stopped), this writes
    ``offsets/N+1`` with the source offsets of ``offsets/N`` (start = end: no input) and
    ``batchWatermarkMs`` = :data:`END_OF_TIME_MS`. The next start replays N+1 as an
    uncommitted batch (Spark's normal recovery) with that watermark, so every window and
    every event-time timer still waiting fires, and the sink commits the output as N+1.

    Returns N+1, or ``None`` when there is nothing to do: no committed epoch yet, or the
    last one already carries the end-of-time watermark. Idempotent: a crash after the write
    leaves ``offsets/N+1`` uncommitted, and the restarted query replays it with the same
    watermark. Raises :class:`CorruptCheckpointFileError` if ``offsets/N`` is unreadable,
    and ``RuntimeError`` if an uncommitted epoch is already logged (the query must have
    been stopped after a clean commit; restart it to finish that epoch first).
    """
    pending = uncommitted_epoch(location)
    last = last_committed_epoch(location)
    if pending is not None:
        entry = read_offsets(location, pending)
        if entry is not None and entry.metadata.get("batchWatermarkMs") == END_OF_TIME_MS:
            return pending  # already written before a crash: the replay will commit it
        raise RuntimeError(
            f"cannot advance the watermark of {location}: epoch {pending} is logged but not "
            "committed; restart the job to finish it, then drain again")
    if last is None:
        return None
    entry = read_offsets(location, last)
    if entry is None:
        raise CorruptCheckpointFileError(
            _where(location, f"offsets/{last}"), "is missing for a committed epoch",
            _repair_hint("offsets/"))
    if entry.metadata.get("batchWatermarkMs") == END_OF_TIME_MS:
        return None
    lines = entry.text.split("\n")
    metadata = dict(entry.metadata, batchWatermarkMs=END_OF_TIME_MS)
    lines[1] = json.dumps(metadata, separators=(",", ":"))
    restore_offsets(location, last + 1, "\n".join(lines))
    return last + 1

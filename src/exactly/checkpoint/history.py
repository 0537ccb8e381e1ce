"""The checkpoint history store: JSON lines in rotating segments under the checkpoint
(:class:`HistoryStore`), or records and segments as immutable objects on S3
(:class:`ObjectHistoryStore`; :func:`open_history` picks).

Layout on a POSIX directory, under ``<checkpoint>/exactly-job/history/``::

    segment-000000000001.jsonl   oldest kept
    segment-000000000002.jsonl   ...
    segment-000000000007.jsonl   being appended to
    append.lock                  writers take it for one append (and its rotation)

One record is one line: a JSON object with at least ``kind`` (a string) and ``at`` (a Unix
time). Records of every writer of a job go here: the driver's listener (epochs, failures,
runs), ``exactly run``'s launcher (driver process deaths), savepoints and restores.

Guarantees:

* **Atomic appends.** A record is written with one ``write`` of the whole line under the
  lock and fsynced before the lock is released. Readers take no lock: they see whole lines,
  and ignore a last line without its newline (an append in progress).
* **A crash mid-append loses that record only.** A line left without its newline by a
  killed writer is cut off by the next append, under the lock; every complete line stays.
* **Bounded.** A segment is closed when the next line would take it over
  ``max_segment_bytes``; the oldest segments are deleted so that at most ``max_segments``
  remain. Readers skip a segment deleted while they read.
* **Damage is reported, not fatal.** A line that is not a JSON object with ``kind`` and
  ``at`` is skipped; :meth:`HistoryStore.read` returns it as a :class:`SkippedLine` (segment,
  line number, reason) for the caller to show.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.location import is_remote, job_dir, job_store
from exactly.checkpoint.store import LogStore
from exactly.errors import ConfigError
from exactly.fsutil import file_lock, fsync_dir
from exactly.logs import log_event

logger = logging.getLogger("exactly.monitoring")

#: ``<checkpoint>/exactly-job/history``
HISTORY_DIR = layout.HISTORY_DIR

#: defaults: 8 segments of 1 MiB, ~10,000 epochs of a job with a few stateful operators
MAX_SEGMENT_BYTES = 1 << 20
MAX_SEGMENTS = 8
_SEGMENT = re.compile(r"^segment-(\d{12})\.jsonl$")
#: on an object store: pack every 64 records into a segment, keep 160 segments (~10,000)
PACK_EVERY = 64
MAX_OBJECT_SEGMENTS = 160
_OBJECT_RECORD = re.compile(r"^r-\d{20}-[0-9a-f]{8}\.json$")
_OBJECT_SEGMENT = re.compile(r"^s-\d{20}-[0-9a-f]{8}-[0-9a-f]{8}\.jsonl$")
#: the field of a segment's line that names the record object it packs
_OBJECT_KEY = "_object"
#: listings a read of the object history tries before it returns what it has
READ_ATTEMPTS = 10


@dataclass(frozen=True)
class SkippedLine:
    """A line of the history that could not be read as a record."""

    segment: str
    line: int
    reason: str

    def describe(self) -> str:
        return f"{self.segment} line {self.line}: {self.reason}"


@dataclass
class HistoryRead:
    """What one read of the history found: the records in append order, and the lines it
    skipped."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[SkippedLine] = field(default_factory=list)


class HistoryStore:
    """Append-only, bounded history of one job, in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_segment_bytes: int = MAX_SEGMENT_BYTES,
                 max_segments: int = MAX_SEGMENTS) -> None:
        if max_segment_bytes < 1024:
            raise ConfigError(f"history: max_segment_bytes must be at least 1024, got "
                              f"{max_segment_bytes}")
        if max_segments < 1:
            raise ConfigError(f"history: max_segments must be at least 1, got {max_segments}")
        self.directory = Path(directory)
        self.max_segment_bytes = max_segment_bytes
        self.max_segments = max_segments

    # -- segments -------------------------------------------------------------------
    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        numbered = sorted((int(m.group(1)), n) for n in names if (m := _SEGMENT.match(n)))
        return [self.directory / name for _, name in numbered]

    @staticmethod
    def _segment_name(number: int) -> str:
        return f"segment-{number:012d}.jsonl"

    # -- writing --------------------------------------------------------------------
    def append(self, record: dict[str, Any]) -> None:
        """Append one record (a JSON object with ``kind`` and ``at``) durably.

        Raises ConfigError for a record that is not one, or not serializable as JSON; an
        OSError of the file system propagates (the caller decides whether history is worth
        failing for: exactly's listener logs it and goes on)."""
        line = _encode(record)
        self.directory.mkdir(parents=True, exist_ok=True)
        with file_lock(self.directory / "append.lock"):
            segments = self.segments()
            current = segments[-1] if segments else None
            size = _cut_torn_tail(current) if current is not None else 0
            created = current is None or (size > 0 and
                                           size + len(line) > self.max_segment_bytes)
            if created:
                # the oldest go first: a crash in between leaves fewer segments, never more
                for old in segments[:max(0, len(segments) - self.max_segments + 1)]:
                    old.unlink(missing_ok=True)
                number = _number(current) + 1 if current is not None else 1
                current = self.directory / self._segment_name(number)
            assert current is not None
            fd = os.open(current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                _write_all(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_dir(self.directory)

    # -- reading --------------------------------------------------------------------
    def read(self) -> HistoryRead:
        """Every record still kept, oldest first, and the lines skipped as damaged."""
        result = HistoryRead()
        for segment in self.segments():
            for number, line in _lines(segment):
                record, reason = _parse(line)
                if record is None:
                    result.skipped.append(SkippedLine(segment.name, number, reason))
                else:
                    result.records.append(record)
        return result


def history_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/exactly-job/history`` of a local checkpoint."""
    return job_dir(checkpoint) / HISTORY_DIR


def open_history(checkpoint: str | os.PathLike[str]) -> HistoryStore | ObjectHistoryStore:
    """The history of the checkpoint ``checkpoint``: segments appended in place on a POSIX
    directory, immutable objects on S3."""
    if is_remote(checkpoint):
        return ObjectHistoryStore(job_store(checkpoint))
    return HistoryStore(history_dir(checkpoint))


def append_now(checkpoint: str | os.PathLike[str], entry: dict[str, Any]) -> bool:
    """Append ``entry`` (a record with ``kind``; ``at`` defaults to now) to a checkpoint's
    history at once, from the calling thread: for events off the epoch path (savepoints,
    restores, failures seen by the supervisor or the launcher). A history that cannot be
    written is logged and skipped (False); the caller's work goes on."""
    try:
        open_history(checkpoint).append({"at": time.time(), **entry})
        return True
    except Exception as exc:
        log_event(logger, "history_not_recorded", logging.WARNING, error=type(exc).__name__,
                  detail=str(exc)[:300], kind=entry.get("kind"))
        return False


class ObjectHistoryStore:
    """The history on an object store, where nothing is appended to: every record is an
    object of its own, and records are packed into segment objects written whole.

    Under ``<checkpoint>/exactly-job/history/``::

        r-<time ns>-<random>.json           one record, written once by whoever appends it
        s-<time ns>-<random>-<own>.jsonl    a segment: records up to and including the
                                            record r-<time ns>-<random>, one line each

    Guarantees, as for :class:`HistoryStore`: a record is visible whole or not at all (a PUT
    is atomic); a writer killed mid-append loses that record only; readers take no lock and
    see the records in time order while the job runs. Every ``pack_every`` records the
    appender that finds them packs them into a segment (each line carries its record's
    object name, so two packers racing lose or duplicate nothing: readers keep one record
    per name), then deletes the packed record objects; at most ``max_segments`` segments are
    kept. Objects never change once written, so a reader caches them by name.
    """

    def __init__(self, store: LogStore, *, pack_every: int = PACK_EVERY,
                 max_segments: int = MAX_OBJECT_SEGMENTS) -> None:
        if pack_every < 1 or max_segments < 1:
            raise ConfigError("history: pack_every and max_segments must be at least 1")
        self.store = store
        self.pack_every = pack_every
        self.max_segments = max_segments
        self._cache: dict[str, bytes] = {}
        self._last = HistoryRead()
        self._listed: set[str] = set()
        self._appended = 0  #: records this store appended

    def describe(self) -> str:
        return self.store.describe(HISTORY_DIR)

    def _names(self) -> tuple[list[str], list[str]]:
        """``(segments, records)``: object names, oldest first."""
        names = self.store.list(HISTORY_DIR)
        segments = sorted(n for n in names if _OBJECT_SEGMENT.match(n))
        records = sorted(n for n in names if _OBJECT_RECORD.match(n))
        return segments, records

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as an object of its own; pack the records when there are
        ``pack_every`` of them. The records are counted (one LIST) at this store's first
        append and every ``pack_every`` appends after, not at every append, so unpacked
        records stay below ``pack_every`` times the number of writers plus one. Raises
        ConfigError for a record that is not one; the store's errors propagate."""
        line = _encode(record)
        name = f"r-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        self.store.write(f"{HISTORY_DIR}/{name}", line)
        self._appended += 1
        if self._appended % self.pack_every != 1 and self.pack_every > 1:
            return
        segments, loose = self._names()  # every record object not packed (and deleted) yet
        if len(loose) >= self.pack_every:
            self._pack(loose, segments)

    def _pack(self, loose: list[str], segments: list[str]) -> None:
        lines = []
        for name in loose:
            data = self._get(name)
            if data is None:
                continue
            record, _ = _parse(data.rstrip(b"\n"))
            if record is not None:
                lines.append(_encode({**record, _OBJECT_KEY: name}))
        # a name of its own (two packers that saw the same newest record may have packed
        # different records: a late PUT is listed by one and not yet by the other)
        segment = f"s-{_key(loose[-1])}-{uuid.uuid4().hex[:8]}.jsonl"
        if not self.store.create(f"{HISTORY_DIR}/{segment}", b"".join(lines)):
            return
        for name in loose:
            self.store.delete(f"{HISTORY_DIR}/{name}")
        for old in sorted({*segments, segment})[:-self.max_segments]:
            self.store.delete(f"{HISTORY_DIR}/{old}")

    def _get(self, name: str) -> bytes | None:
        if name not in self._cache:
            data = self.store.read(f"{HISTORY_DIR}/{name}")
            if data is None:
                return None  # packed and deleted since it was listed
            self._cache[name] = data
        return self._cache[name]

    def read(self) -> HistoryRead:
        """Every record still kept, oldest first, and the lines skipped as damaged.

        An object listed and gone when read was packed into a segment (or a segment aged
        out) meanwhile: the read starts over from a new listing, so a reader never misses a
        record that was packed while it read. An object of the last read that a listing
        lacks but that still exists (a store whose listings are only weakly consistent
        under concurrent writes, as S3Proxy's file system backend: S3 lists strongly) also
        starts it over, so one reader's reads never lose a record."""
        for attempt in range(READ_ATTEMPTS):
            result, complete = self._read_once()
            if complete:
                self._last = result
                return result
            time.sleep(0.02 * (attempt + 1))
        return self._last  # the store changed under every attempt: the last whole read

    def _read_once(self) -> tuple[HistoryRead, bool]:
        segments, records = self._names()
        result, seen = HistoryRead(), set()
        found: list[tuple[str, dict[str, Any]]] = []  # (object name, record)
        listed = set(segments) | set(records)
        for name in self._listed - listed:  # packed or aged out since, or a listing that
            if self.store.exists(f"{HISTORY_DIR}/{name}"):  # missed it (weakly consistent
                return result, False  # stores): then list again
        for segment in segments:
            data = self._get(segment)
            if data is None:
                return result, False
            for number, line in enumerate(data.split(b"\n")[:-1], start=1):
                record, reason = _parse(line)
                if record is None:
                    result.skipped.append(SkippedLine(segment, number, reason))
                    continue
                name = str(record.pop(_OBJECT_KEY, ""))
                if name not in seen:
                    seen.add(name)
                    found.append((name, record))
        for name in records:
            if name in seen:
                continue
            data = self._get(name)
            if data is None:
                return result, False  # packed since the listing: it is in a newer segment
            record, reason = _parse(data.rstrip(b"\n"))
            if record is None:
                result.skipped.append(SkippedLine(name, 1, reason))
            else:
                seen.add(name)
                found.append((name, record))
        # in the order they were appended (a record object's name starts with its time): a
        # record listed late (a slow PUT, a weak listing) may be packed after newer ones
        result.records = [record for _, record in sorted(found, key=lambda f: _key(f[0]))]
        self._cache = {n: d for n, d in self._cache.items() if n in listed}
        self._listed = listed
        return result, True


def _key(name: str) -> str:
    """The time-and-random part of a record's name; of a segment's, that of the newest
    record it packs."""
    return name[2:2 + 29]


def _encode(record: dict[str, Any]) -> bytes:
    _check_record(record)
    try:
        return (json.dumps(record, separators=(",", ":"), allow_nan=False,
                           default=_plain) + "\n").encode()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"history: record is not JSON-serializable: {exc}") from None


def _plain(value: Any) -> Any:
    """JSON for the few non-JSON values records carry: paths and enum members."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _check_record(record: Any) -> None:
    if not isinstance(record, dict):
        raise ConfigError(f"history: a record is a dict, got {type(record).__name__}")
    if not isinstance(record.get("kind"), str) or not record["kind"]:
        raise ConfigError("history: a record needs a non-empty string 'kind'")
    at = record.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise ConfigError("history: a record needs 'at', a Unix time in seconds")


def _number(segment: Path) -> int:
    match = _SEGMENT.match(segment.name)
    assert match is not None
    return int(match.group(1))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _cut_torn_tail(segment: Path) -> int:
    """Truncate ``segment`` after its last newline (a line a killed writer left unfinished);
    returns the size it keeps. Called under the append lock."""
    try:
        size = segment.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(segment, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size
        # scan back for the last complete line; lines are short, read in blocks
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            block = f.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return keep


def _lines(segment: Path) -> Iterator[tuple[int, bytes]]:
    """Complete lines of a segment with their numbers (a last line without newline -- an
    append in progress -- is left out); nothing for a segment deleted meanwhile."""
    try:
        data = segment.read_bytes()
    except FileNotFoundError:
        return
    # the part after the last newline is an append in progress (or nothing)
    yield from enumerate(data.split(b"\n")[:-1], start=1)


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]})"
    try:
        _check_record(record)
    except ConfigError as exc:
        return None, str(exc).removeprefix("history: ")
    return record, ""

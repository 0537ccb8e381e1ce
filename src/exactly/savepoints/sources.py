"""Source uids: which savepoint position each source of a restored job resumes from.

Spark's offset log (``offsets/N``) holds one line per source, in the order of the query's
sources, and ``sources/<i>/`` holds the metadata of source number ``i``; Spark refuses to
start when the number of lines differs from the number of sources, and a line ``-`` means
"no offset": that source starts from its configured start. A savepoint records each source's
uid (``exactly.uid(name, spark.readStream...load())``) next to its position;
:func:`map_sources` pairs the savepoint's sources with the job's, and
:func:`remap_offsets` writes an offset log entry in the job's order. No Spark here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exactly.errors import SavepointError

#: the offset log's line for a source without an offset (Spark's ``OffsetSeq`` format)
NO_OFFSET = "-"
#: header lines of an offset log entry before the sources' lines: version, metadata
_HEADER_LINES = 2


@dataclass(frozen=True)
class SourceRef:
    """A source of a job or a savepoint: its number, format name and uid (None: unnamed).
    ``format`` None means not recorded (a savepoint that did not record the names)."""

    index: int
    format: str | None
    uid: str | None

    @property
    def label(self) -> str:
        if self.uid is not None:
            return repr(self.uid)
        return f"#{self.index} ({self.format or 'unknown format'})"


@dataclass
class SourceMap:
    """For each job source (by number): the savepoint source it resumes from, or None for
    a new source (it starts from its configured start); the savepoint sources dropped."""

    resumed_from: list[int | None]
    saved_count: int
    dropped: list[SourceRef] = field(default_factory=list)
    new: list[SourceRef] = field(default_factory=list)

    @property
    def identity(self) -> bool:
        """Whether the checkpoint's offsets can be copied as they are."""
        return self.resumed_from == list(range(self.saved_count))

    def describe(self) -> dict[str, Any]:
        return {"sources": [f"#{j}->#{i}" if j is not None else f"new->#{i}"
                            for i, j in enumerate(self.resumed_from)],
                "source_positions_from": list(self.resumed_from),
                "sources_dropped": [s.label for s in self.dropped],
                "sources_new": [s.label for s in self.new]}


def saved_sources(manifest_sources: list[dict[str, Any]],
                  names: list[str] | None) -> list[SourceRef]:
    """The savepoint's sources from its manifest (``sources`` entries, ``job.sources``
    names); a savepoint taken before sources had uids has none (matched by number)."""
    return [SourceRef(int(s.get("index", i)),
                      names[i] if names is not None and i < len(names) else None,
                      s.get("uid"))
            for i, s in enumerate(manifest_sources)]


def _duplicates(refs: list[SourceRef], where: str) -> None:
    uids = [s.uid for s in refs if s.uid is not None]
    twice = sorted({u for u in uids if uids.count(u) > 1})
    if twice:
        raise SavepointError(f"source uid {twice[0]!r} is given to more than one source of "
                             f"{where}; every source uid must be unique in a job (read each "
                             "source once, or give each reader its own uid)")


def map_sources(saved: list[SourceRef], job: list[SourceRef], *,
                allow_non_restored_state: bool = False) -> SourceMap:
    """Pair the savepoint's sources with the job's: by uid; a savepoint source without a
    uid by its number, with the job source at that number (which may have a uid the
    savepoint does not know: the job named its sources after the savepoint was taken).

    A paired source must read the same format. A job source paired with none is new: it
    starts from its configured start; it must have a uid (an unnamed extra source is
    another job's savepoint). A savepoint source paired with none is refused, naming it,
    unless ``allow_non_restored_state`` (its position is dropped). Raises SavepointError
    for a uid given twice, a uid that now names another format, an unnamed new source or a
    removed source; nothing is decided on a guess."""
    _duplicates(job, "the job")
    _duplicates(saved, "the savepoint")
    by_uid = {s.uid: s for s in saved if s.uid is not None}
    resumed: list[int | None] = [None] * len(job)
    taken: set[int] = set()
    for i, src in enumerate(job):
        if src.uid is not None and src.uid in by_uid:
            resumed[i] = by_uid[src.uid].index
    for i in range(len(job)):
        if resumed[i] is None and i < len(saved) and saved[i].uid is None \
                and i not in resumed:
            resumed[i] = i
    for i, src in enumerate(job):
        j = resumed[i]
        if j is None:
            continue
        old = saved[j]
        if old.format is not None and src.format is not None and old.format != src.format:
            if old.uid is not None and old.uid == src.uid:
                raise SavepointError(
                    f"source {old.label} read {old.format} in the savepoint and reads "
                    f"{src.format} in the job: a uid must keep naming the same source; give "
                    "the new source another uid")
            resumed[i] = None  # unnamed and another format: not the same source
            continue
        taken.add(j)
    new = [job[i] for i, j in enumerate(resumed) if j is None]
    unnamed = [s for s in new if s.uid is None]
    if unnamed:
        raise SavepointError(
            f"the job's source {unnamed[0].label} matches no source of the savepoint "
            f"({', '.join(s.label for s in saved) or 'none'}): it was taken from another "
            "job, or the job adds a source. Give a new source a uid "
            "(exactly.uid(\"name\", spark.readStream...load())) and it starts from its "
            "configured start")
    dropped = [s for s in saved if s.index not in taken]
    if dropped and not allow_non_restored_state:
        raise SavepointError(
            f"the savepoint holds the position of source {dropped[0].label}, which the job "
            "no longer reads (sources are matched by uid, unnamed ones by number): restore "
            "with --allow-non-restored-state to drop its position, or keep the source")
    return SourceMap(resumed, len(saved), dropped, new)


def remap_offsets(text: str, source_map: SourceMap) -> str:
    """An offset log entry (``v1``, metadata, one line per savepoint source) with one line
    per job source instead, in the job's order: the resumed source's line, or ``-`` for a
    new one. Raises SavepointError when the entry has another number of sources than the
    savepoint recorded."""
    lines = text.rstrip("\n").split("\n")
    header, offsets = lines[:_HEADER_LINES], lines[_HEADER_LINES:]
    if len(offsets) != source_map.saved_count:
        raise SavepointError(
            f"an offset log entry of the savepoint holds {len(offsets)} source position(s), "
            f"its manifest {source_map.saved_count}: the savepoint is damaged (take another)")
    body = [offsets[j] if j is not None else NO_OFFSET for j in source_map.resumed_from]
    return "\n".join(header + body)

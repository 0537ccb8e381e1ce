"""The anomaly checker: what readers saw of a job's output while faults hit it, with each
anomaly named (Jepsen-style), not only counts of missing and duplicated ids.

A **history** collects observations from readers running beside the job
(:mod:`exactly.testing.nemesis.observers`). A reader either polls the whole output
(:meth:`History.snapshot`: a table, the file sink's directory, a Delta version) or streams
records, seeing each once (:meth:`History.seen`: a Kafka consumer). Each row is
``Row(id, epoch, key, value)``; ``epoch`` is None when the target does not record it (the
write-ahead sink's rows, Kafka records), and the checker then takes the input's assignment
(``epoch_of``) where the test knows it.

:func:`check` judges a history against the **truth at the end**: the ids the input holds and
the rows of the final committed output. It names:

* ``lost write``, ``duplicate``, ``unexpected`` in the final output -- from
  :func:`exactly.auditor.verify` when the caller passes its report (``audit``; it reads every
  target the sinks write, so this part is the same audit ``exactly verify`` gives a user),
  otherwise computed from ``final_rows``. ``verify`` sees only the final state: every other
  kind below needs the history, which is why this module exists;
* in the history, only from ``read_committed`` readers (what a consumer of an exactly-once
  sink is promised): a ``duplicate`` inside one snapshot or one stream, an ``aborted read``
  (a record the final output does not hold), a ``vanished`` record (seen, then gone from a
  later snapshot of the same reader), a ``torn epoch`` (part of an epoch, for readers of a
  sink that promises whole epochs), a ``value moved back`` (a key's version going back, for
  upsert targets), a ``wrong epoch`` (an id under two epochs, under an epoch the input did
  not assign it to, or an epoch whose ids changed between two snapshots);
* in a target's own record of its progress (:meth:`History.epoch_record`: an Iceberg table's
  ``exactly.epoch.<query>`` property, read with the snapshots it describes): an ``epoch
  record`` that names another epoch than the newest the reader saw committed in the same
  read, or that goes back. The sink sets both in one commit, so they disagree only when a
  commit was applied in part or something else changed one of them; the record is what a
  restarted sink goes by once the snapshots expire, so a wrong one skips or repeats an epoch
  later, even when this run's final output is right;
* a ``read_uncommitted`` reader (a Kafka consumer that also sees open and aborted
  transactions) proves nothing about the sink: what it saw beyond the final output is
  counted as ``uncommitted reads seen``, an observation, never an anomaly.

What each sink promises its readers (the connectors' docstrings, docs/postgres.md), so
which readers get ``whole_epochs``:

=================================  ===========================================================
file 2PC (``epoch-N`` dirs)        whole epochs (one directory rename per epoch)
Delta                              whole epochs (one Delta commit per epoch)
Iceberg                            whole epochs (one snapshot per epoch, its epoch in the
                                   summary); the progress property is set by the same
                                   metadata commit: ``epoch_record``
Kafka, ``read_committed``          whole epochs (one transaction per epoch); records carry no
                                   epoch: pass ``epoch_of``
PostgreSQL 2PC, view               whole epochs (``<table>_committed``: epochs up to the last
                                   whose every ``COMMIT PREPARED`` ran)
PostgreSQL 2PC, plain table        whole tasks, not epochs (prepared transactions commit one at
                                   a time): no ``whole_epochs``
write-ahead into PostgreSQL        whole epochs (one load transaction per epoch); rows carry no
                                   epoch: pass ``epoch_of``
PostgreSQL upsert (idempotent)     no atomicity (each task's upserts are visible when it ends);
                                   a key's value never moves back to an older epoch's, and the
                                   table converges: check with ``upsert=True``
=================================  ===========================================================

Counts are exact, examples capped (``examples``). The unit each kind counts is named in
:class:`Anomaly`. A reader's error (a poll that failed while the target was partitioned or
paused) is recorded in the history and reported, not counted as an anomaly: faults make
reads fail; what a read returned is what is judged.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from exactly.auditor.report import VerifyReport

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATIONS = (READ_COMMITTED, READ_UNCOMMITTED)
#: the name the final output takes in examples
FINAL = "final output"


class Anomaly(enum.Enum):
    """A kind of anomaly; ``label`` names it, its docstring defines it (and what one counts)."""

    LOST_WRITE = ("lost write", "an input id missing from the final committed output "
                                "(counts ids)")
    DUPLICATE = ("duplicate", "an id more than once in the final output, in one snapshot or "
                              "in one stream of a read_committed reader (counts (where, id))")
    UNEXPECTED = ("unexpected", "an id in the final output that the input does not hold "
                                "(counts ids)")
    ABORTED_READ = ("aborted read", "a read_committed reader saw a record the final output "
                                    "does not hold (counts (reader, id))")
    VANISHED = ("vanished", "a read_committed reader saw a record and a later snapshot of the "
                            "same reader no longer held it (counts (reader, id))")
    TORN_EPOCH = ("torn epoch", "a reader of a whole-epoch sink saw some but not all ids of an "
                                "epoch (counts (reader, epoch))")
    VALUE_MOVED_BACK = ("value moved back", "a key of an upsert target showed a version, then "
                                            "an older one (counts (reader, key))")
    WRONG_EPOCH = ("wrong epoch", "a record committed under another epoch than its own: an id "
                                  "under two epochs or under one the input did not assign it "
                                  "to, or an epoch's ids changed (counts ids / (reader, epoch))")
    EPOCH_RECORD = ("epoch record", "a target's own record of the newest epoch it holds (an "
                                    "Iceberg table's exactly.epoch.<query> property) named "
                                    "another epoch than the commits read with it, or went back "
                                    "(counts (reader, query, recorded, shown))")

    def __init__(self, label: str, definition: str) -> None:
        self.label = label
        self.__doc__ = definition

    @property
    def definition(self) -> str:
        return str(self.__doc__)


class Row(NamedTuple):
    """One record as a reader saw it. ``key`` (upsert targets) defaults to the id for the
    moved-back check; ``value`` orders versions of a key within one epoch."""

    id: Any
    epoch: int | None = None
    key: Any = None
    value: Any = None


@dataclass(frozen=True)
class EpochRecord:
    """What a target recorded as the newest epoch of ``query`` it holds (``recorded``), and
    the newest epoch of that query among the commits read in the same read (``shown``);
    None: no record, no commit of the query."""

    reader: str
    query: str
    recorded: int | None
    shown: int | None
    at: str | None = None
    time: float = 0.0


@dataclass(frozen=True)
class Observation:
    """What one reader saw at once: the whole output (``stream`` False) or records new to
    it (``stream`` True). ``seq`` orders observations across readers; ``at`` says what was
    read (a table version, ...)."""

    seq: int
    reader: str
    isolation: str
    stream: bool
    rows: tuple[Row, ...]
    at: str | None = None
    time: float = 0.0


class History:
    """Observations of every reader, in the order they arrived; safe to feed from threads.

    A snapshot equal to the same reader's previous one is counted as a poll but not stored
    (it proves nothing new), so a reader may poll fast for a long run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observations: list[Observation] = []
        self._last: dict[str, tuple[Row, ...]] = {}
        self._raw: dict[str, tuple[Any, ...]] = {}  # each reader's last snapshot as given
        self._records: list[EpochRecord] = []
        self._last_record: dict[tuple[str, str], tuple[int | None, int | None]] = {}
        self.polls: Counter[str] = Counter()
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.error_counts: Counter[str] = Counter()

    def snapshot(self, reader: str, isolation: str, rows: Iterable[Any], *,
                 at: str | None = None) -> None:
        """``reader`` saw the whole output as ``rows`` (``Row`` or tuples of its fields)."""
        self._add(reader, isolation, False, rows, at)

    def seen(self, reader: str, isolation: str, rows: Iterable[Any], *,
             at: str | None = None) -> None:
        """``reader`` (a stream) saw ``rows`` for the first time, in this order."""
        self._add(reader, isolation, True, rows, at)

    def epoch_record(self, reader: str, query: str, recorded: int | None, shown: int | None,
                     *, at: str | None = None) -> None:
        """``reader`` read the target's record of the newest epoch of ``query`` it holds
        (``recorded``) together with the commits it describes, whose newest epoch of the query
        is ``shown``. Stored when it differs from the reader's previous record of the query."""
        with self._lock:
            key = (reader, query)
            if self._last_record.get(key) == (recorded, shown):
                return
            self._last_record[key] = (recorded, shown)
            self._records.append(EpochRecord(reader, query, recorded, shown, at, time.time()))

    def epoch_records(self) -> list[EpochRecord]:
        """Every stored epoch record, oldest first (a copy)."""
        with self._lock:
            return list(self._records)

    def error(self, reader: str, exc: BaseException, *, keep: int = 20) -> None:
        """A read of ``reader`` failed with ``exc`` (the first ``keep`` are kept as text)."""
        with self._lock:
            self.error_counts[reader] += 1
            if len(self.errors[reader]) < keep:
                self.errors[reader].append(f"{type(exc).__name__}: {exc}"[:300])

    def _add(self, reader: str, isolation: str, stream: bool, rows: Iterable[Any],
             at: str | None) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation {isolation!r}: use one of {ISOLATIONS}")
        given = tuple(rows)
        with self._lock:
            self.polls[reader] += 1
            if not stream and self._raw.get(reader) == given:  # cheap: no conversion
                return
        frozen = tuple(r if isinstance(r, Row) else Row(*r) for r in given)
        with self._lock:
            if stream and not frozen:
                return
            if not stream:
                self._raw[reader] = given
                if self._last.get(reader) == frozen:
                    return
                self._last[reader] = frozen
            self._observations.append(Observation(len(self._observations), reader, isolation,
                                                  stream, frozen, at, time.time()))

    def observations(self) -> list[Observation]:
        """Every stored observation, oldest first (a copy)."""
        with self._lock:
            return list(self._observations)

    def last(self, reader: str) -> tuple[Row, ...] | None:
        """The newest snapshot of ``reader`` (None before its first)."""
        with self._lock:
            return self._last.get(reader)

    def stream(self, reader: str) -> list[Row]:
        """Every record the stream ``reader`` saw, in order."""
        with self._lock:
            return [r for o in self._observations if o.reader == reader for r in o.rows]


@dataclass
class Report:
    """The checker's verdict: ``ok`` when no anomaly of any kind was found."""

    anomalies: dict[Anomaly, list[str]]
    counts: dict[Anomaly, int]
    stats: dict[str, int] = field(default_factory=dict)
    reader_errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def render(self) -> str:
        """A short text table: each kind, its count and its first example; then the stats."""
        width = max(len(a.label) for a in Anomaly)
        lines = [f"{'anomaly':<{width}}  {'count':>6}  example"]
        for kind in Anomaly:
            first = self.anomalies[kind][0] if self.anomalies[kind] else ""
            lines.append(f"{kind.label:<{width}}  {self.counts[kind]:>6}  {first}".rstrip())
        lines.append(", ".join(f"{k}: {v}" for k, v in self.stats.items()))
        for reader, errors in self.reader_errors.items():
            lines.append(f"{reader} read errors: {len(errors)} kept, e.g. {errors[0]}")
        lines.append("verdict: " + ("no anomaly" if self.ok else "ANOMALIES"))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: per kind its count and examples, the stats and the reader errors."""
        return {"ok": self.ok,
                "anomalies": {k.label: {"count": self.counts[k], "examples": self.anomalies[k]}
                              for k in Anomaly},
                "stats": dict(self.stats), "reader_errors": dict(self.reader_errors)}


class _Findings:
    def __init__(self, examples: int) -> None:
        self.cap = examples
        self.units: dict[Anomaly, set[Hashable]] = {k: set() for k in Anomaly}
        self.examples: dict[Anomaly, list[str]] = {k: [] for k in Anomaly}
        self.fixed: dict[Anomaly, int] = {}

    def add(self, kind: Anomaly, unit: Hashable, text: str) -> None:
        if unit in self.units[kind]:
            return
        self.units[kind].add(unit)
        if len(self.examples[kind]) < self.cap:
            self.examples[kind].append(text)

    def report(self, stats: dict[str, int], errors: dict[str, list[str]]) -> Report:
        counts = {k: self.fixed.get(k, 0) + len(self.units[k]) for k in Anomaly}
        return Report(self.examples, counts, stats, errors)


def check(history: History, *, expected_ids: Iterable[Any], final_rows: Iterable[Any],
          whole_epochs: bool | Collection[str], epoch_of: Mapping[Any, int] | None = None,
          upsert: bool = False, audit: VerifyReport | None = None,
          examples: int = 10, share_of: Mapping[Any, int] | None = None) -> Report:
    """Name every anomaly of ``history`` against the truth at the end.

    ``expected_ids``: the ids the final output must hold (every input id once the input is
    drained). ``final_rows``: the final committed output (``Row`` or tuples), read after the
    job ended. ``whole_epochs``: True when every reader's target promises whole epochs, or
    the names of the readers that read such a target (see the module docstring). ``epoch_of``:
    the input's epoch of each id, when the test knows it (one input file per epoch).
    ``share_of``: the share each id is published in, for a target that promises whole shares
    of epochs rather than whole epochs (the Kafka sink with ``exactly.kafka.publishShares``
    > 1): a torn epoch is then part of a share of an epoch, and a reader may see some shares
    of an epoch without the others.
    ``upsert``: the target holds one row per key that later epochs overwrite (ids may move
    to newer epochs; versions are checked instead). ``audit``: ``exactly verify``'s report of
    the same output; when given, lost, duplicated and unexpected ids in the final state are
    its findings. Never raises for what it finds; ValueError for an unknown isolation.
    """
    final = [r if isinstance(r, Row) else Row(*r) for r in final_rows]
    run = _Check(history, set(expected_ids), final, whole_epochs, epoch_of or {}, upsert,
                 _Findings(examples), share_of or {})
    run.final_state(audit)
    run.history()
    return run.found.report(run.stats, {r: list(e) for r, e in history.errors.items()})


def _unit_name(unit: Any) -> str:
    """``epoch 3``, or ``epoch 3 share 1`` for a share."""
    return f"epoch {unit[0]} share {unit[1]}" if isinstance(unit, tuple) else f"epoch {unit}"


class _Check:
    def __init__(self, history: History, expected: set[Any], final: list[Row],
                 whole_epochs: bool | Collection[str], epoch_of: Mapping[Any, int],
                 upsert: bool, found: _Findings, share_of: Mapping[Any, int]) -> None:
        self.observations = history.observations()
        self.share_of = share_of
        self.history_ = history
        self.expected, self.final, self.epoch_of, self.upsert = expected, final, epoch_of, upsert
        self.whole = whole_epochs
        self.found = found
        self.final_ids = Counter(r.id for r in final)
        self.final_has_epochs = any(r.epoch is not None for r in final)
        #: epoch (or (epoch, share), with ``share_of``) -> its committed ids
        self.complete: dict[Any, set[Any]] = defaultdict(set)
        if self.final_has_epochs:
            for r in final:
                if r.epoch is not None:
                    self.complete[r.epoch].add(r.id)
        else:
            for id_, epoch in epoch_of.items():
                self.complete[self._unit(id_, epoch)].add(id_)
        self.stats: dict[str, int] = {
            "observations": len(self.observations),
            "polls": sum(history.polls.values()),
            "records observed": sum(len(o.rows) for o in self.observations),
            "uncommitted reads seen": 0, "epoch reads unchecked": 0,
            "epoch records": len(history.epoch_records()),
            "reader errors": sum(history.error_counts.values())}

    def whole_for(self, reader: str) -> bool:
        return self.whole if isinstance(self.whole, bool) else reader in self.whole

    def epoch(self, row: Row) -> Any:
        """The row's epoch, or (epoch, share) for a target of whole shares: the unit a reader
        sees whole; None when unknown."""
        if row.epoch is not None:
            return row.epoch
        epoch = self.epoch_of.get(row.id)
        return None if epoch is None else self._unit(row.id, epoch)

    def _unit(self, id_: Any, epoch: int) -> Any:
        share = self.share_of.get(id_)
        return epoch if share is None else (epoch, share)

    # -- the final state ----------------------------------------------------------------
    def final_state(self, audit: VerifyReport | None) -> None:
        found = self.found
        if audit is not None:
            for kind, finding, what in ((Anomaly.LOST_WRITE, audit.missing, "missing"),
                                        (Anomaly.DUPLICATE, audit.duplicated, "duplicated"),
                                        (Anomaly.UNEXPECTED, audit.unexpected, "unexpected")):
                found.fixed[kind] = finding.count
                found.examples[kind] = [f"{what} in {audit.output}: {row}"
                                        for row in finding.sample[:found.cap]]
            return
        for id_ in _sorted(self.expected - self.final_ids.keys()):
            found.add(Anomaly.LOST_WRITE, id_, f"id {id_}: in the input, not in the {FINAL}")
        for id_ in _sorted(i for i, n in self.final_ids.items() if n > 1):
            found.add(Anomaly.DUPLICATE, (FINAL, id_),
                      f"id {id_}: {self.final_ids[id_]} times in the {FINAL}")
        for id_ in _sorted(self.final_ids.keys() - self.expected):
            found.add(Anomaly.UNEXPECTED, id_, f"id {id_}: in the {FINAL}, not in the input")

    # -- the history ----------------------------------------------------------------------
    def history(self) -> None:
        streams: dict[str, list[Observation]] = defaultdict(list)
        snapshots: dict[str, list[Observation]] = defaultdict(list)
        for obs in self.observations:
            (streams if obs.stream else snapshots)[obs.reader].append(obs)
        for reader, observed in snapshots.items():
            committed = [o for o in observed if o.isolation == READ_COMMITTED]
            self.uncommitted([o for o in observed if o.isolation == READ_UNCOMMITTED], False)
            self.snapshot_reader(reader, committed)
        for reader, observed in streams.items():
            committed = [o for o in observed if o.isolation == READ_COMMITTED]
            self.uncommitted([o for o in observed if o.isolation == READ_UNCOMMITTED], True)
            self.stream_reader(reader, committed)
        if self.upsert:
            self.moved_back(snapshots, streams)
        else:
            self.epochs_of_ids()
        self.epoch_records()

    def epoch_records(self) -> None:
        """A target's record of its newest epoch must name the newest epoch of the commits
        read with it, and never go back."""
        newest: dict[tuple[str, str], EpochRecord] = {}
        for record in self.history_.epoch_records():
            where = f" ({record.at})" if record.at else ""
            if record.recorded != record.shown:
                self.found.add(Anomaly.EPOCH_RECORD,
                               (record.reader, record.query, record.recorded, record.shown),
                               f"{record.reader}: the target records epoch {record.recorded} "
                               f"of query {record.query} as its newest, its commits' newest is "
                               f"{record.shown}{where}")
            key = (record.reader, record.query)
            before = newest.get(key)
            if (before is not None and before.recorded is not None
                    and record.recorded is not None and record.recorded < before.recorded):
                self.found.add(Anomaly.EPOCH_RECORD,
                               (record.reader, record.query, record.recorded, "back"),
                               f"{record.reader}: the record of query {record.query} went back "
                               f"from epoch {before.recorded} to {record.recorded}{where}")
            if record.recorded is not None:
                newest[key] = record

    def uncommitted(self, observed: list[Observation], stream: bool) -> None:
        """Records a read_uncommitted reader saw beyond the final output (each time once
        more than the final holds it): counted, not an anomaly."""
        if not observed:
            return
        if stream:
            seen = Counter(r.id for o in observed for r in o.rows)
        else:
            seen = Counter({r.id: 1 for o in observed for r in o.rows})
        self.stats["uncommitted reads seen"] += sum((seen - self.final_ids).values())

    def snapshot_reader(self, reader: str, observed: list[Observation]) -> None:
        found = self.found
        whole = self.whole_for(reader)
        ever: dict[Any, int] = {}  # id -> seq of the first snapshot holding it
        epochs_seen: dict[int, tuple[frozenset[Any], int]] = {}  # epoch -> first whole ids
        for obs in observed:
            ids = Counter(r.id for r in obs.rows)
            for id_ in _sorted(i for i, n in ids.items() if n > 1):
                found.add(Anomaly.DUPLICATE, (reader, id_),
                          f"{reader}: id {id_} {ids[id_]} times in snapshot #{obs.seq}")
            self.aborted(reader, obs, ids)
            for id_ in _sorted(i for i in ever if i not in ids):
                found.add(Anomaly.VANISHED, (reader, id_),
                          f"{reader}: id {id_} seen in snapshot #{ever[id_]}, gone in "
                          f"#{obs.seq}")
            for id_ in ids:
                ever.setdefault(id_, obs.seq)
            if whole:
                self.epochs_whole(reader, obs, epochs_seen)

    def epochs_whole(self, reader: str, obs: Observation,
                     epochs_seen: dict[int, tuple[frozenset[Any], int]]) -> None:
        """Torn epochs in one snapshot; and an epoch (as the rows name it) whose ids differ
        from what an earlier snapshot showed whole."""
        by_epoch: dict[Any, set[Any]] = defaultdict(set)
        named: set[int] = set()
        for r in obs.rows:
            epoch = self.epoch(r)
            if epoch is None:
                self.stats["epoch reads unchecked"] += 1
                continue
            by_epoch[epoch].add(r.id)
            if r.epoch is not None:
                named.add(epoch)
        for epoch, ids in sorted(by_epoch.items()):
            if self.torn(reader, epoch, ids, f"snapshot #{obs.seq}"):
                continue
            if epoch not in named or self.upsert:  # upserts move keys to newer epochs
                continue
            before = epochs_seen.setdefault(epoch, (frozenset(ids), obs.seq))
            if before[0] != ids:
                self.found.add(Anomaly.WRONG_EPOCH, (reader, "epoch", epoch),
                               f"{reader}: epoch {epoch} held {_few(before[0])} in snapshot "
                               f"#{before[1]}, {_few(ids)} in #{obs.seq}")

    def torn(self, reader: str, epoch: Any, ids: set[Any], where: str) -> bool:
        complete = self.complete.get(epoch)
        if complete is None:
            self.stats["epoch reads unchecked"] += 1
            return False
        missing = complete - ids
        if missing and ids & complete:
            self.found.add(Anomaly.TORN_EPOCH, (reader, epoch),
                           f"{reader}: {len(ids & complete)} of {_unit_name(epoch)}'s "
                           f"{len(complete)} ids in {where}, missing {_few(missing)}")
            return True
        return False

    def stream_reader(self, reader: str, observed: list[Observation]) -> None:
        found = self.found
        ids: Counter[Any] = Counter()
        for obs in observed:
            ids.update(r.id for r in obs.rows)
        for id_ in _sorted(i for i, n in ids.items() if n > 1):
            found.add(Anomaly.DUPLICATE, (reader, id_),
                      f"{reader}: id {id_} read {ids[id_]} times in its stream")
        for obs in observed:
            self.aborted(reader, obs, Counter(r.id for r in obs.rows))
        if observed and self.whole_for(reader):
            by_epoch: dict[Any, set[Any]] = defaultdict(set)
            for obs in observed:
                for r in obs.rows:
                    epoch = self.epoch(r)
                    if epoch is None:
                        self.stats["epoch reads unchecked"] += 1
                    else:
                        by_epoch[epoch].add(r.id)
            for epoch, seen in sorted(by_epoch.items()):
                self.torn(reader, epoch, seen, "its whole stream")

    def aborted(self, reader: str, obs: Observation, ids: Counter[Any]) -> None:
        for id_ in _sorted(i for i in ids if i not in self.final_ids):
            self.found.add(Anomaly.ABORTED_READ, (reader, id_),
                           f"{reader}: id {id_} read (#{obs.seq}), not in the {FINAL}")

    def epochs_of_ids(self) -> None:
        """An id under two epochs, or under one the input did not assign it to (append
        targets: an id's epoch is fixed once committed)."""
        under: dict[Any, set[int]] = defaultdict(set)
        rows = [(obs.reader, r) for obs in self.observations
                if obs.isolation == READ_COMMITTED for r in obs.rows]
        rows += [(FINAL, r) for r in self.final]
        for where, r in rows:
            if r.epoch is None:
                continue
            under[r.id].add(r.epoch)
            assigned = self.epoch_of.get(r.id)
            if assigned is not None and assigned != r.epoch:
                self.found.add(Anomaly.WRONG_EPOCH, r.id,
                               f"id {r.id}: under epoch {r.epoch} in the {where}, the input "
                               f"assigned it to epoch {assigned}")
        for id_ in _sorted(i for i, e in under.items() if len(e) > 1):
            self.found.add(Anomaly.WRONG_EPOCH, id_,
                           f"id {id_}: seen under epochs {sorted(under[id_])}")

    def moved_back(self, snapshots: dict[str, list[Observation]],
                   streams: dict[str, list[Observation]]) -> None:
        """Per reader and key, each version must be at least the newest seen before; the
        final output must hold at least the newest any reader saw."""
        newest_seen: dict[Any, tuple[Row, str]] = {}
        for reader, observed in [*snapshots.items(), *streams.items()]:
            newest: dict[Any, Row] = {}
            for obs in observed:
                if obs.isolation != READ_COMMITTED:
                    continue
                for r in obs.rows:
                    key = r.id if r.key is None else r.key
                    before = newest.get(key)
                    if before is not None and _older(r, before):
                        self.found.add(Anomaly.VALUE_MOVED_BACK, (reader, key),
                                       f"{reader}: key {key} at {_version(before)}, then "
                                       f"{_version(r)} (#{obs.seq})")
                        continue
                    newest[key] = r
            for key, r in newest.items():
                kept = newest_seen.get(key)
                if kept is None or _older(kept[0], r):
                    newest_seen[key] = (r, reader)
        for r in self.final:
            key = r.id if r.key is None else r.key
            kept = newest_seen.get(key)
            if kept is not None and _older(r, kept[0]):
                self.found.add(Anomaly.VALUE_MOVED_BACK, (FINAL, key),
                               f"key {key}: {kept[1]} saw {_version(kept[0])}, the {FINAL} "
                               f"holds {_version(r)}")


def _older(row: Row, than: Row) -> bool:
    """Whether ``row`` is an older version than ``than``: by epoch when both carry one and
    they differ, else by value (values that do not compare are not ordered)."""
    if row.epoch is not None and than.epoch is not None and row.epoch != than.epoch:
        return row.epoch < than.epoch
    if row.value is None or than.value is None:
        return False
    try:
        return bool(row.value < than.value)
    except TypeError:
        return False


def _version(row: Row) -> str:
    return f"epoch {row.epoch} value {row.value!r}"


def _sorted(values: Iterable[Any]) -> list[Any]:
    items = list(values)
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def _few(ids: Iterable[Any], shown: int = 5) -> str:
    items = _sorted(ids)
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return "{" + ", ".join(map(repr, items[:shown])) + "}" + more

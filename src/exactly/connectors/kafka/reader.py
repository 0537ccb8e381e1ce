"""Kafka as a replayable source on PySpark's Python data source API (``exactly.kafka``).

Unlike Spark's built-in Kafka source (:mod:`exactly.connectors.kafka.source`), this reader
asks exactly's admission control (:mod:`exactly.connectors.admission`) in every
``latestOffset``: the supervisor's min pause between epochs and epoch sizing apply to Kafka.

Options (``spark.readStream.format("exactly.kafka")``, case-insensitive, keys named in
:mod:`exactly.options`; any other name is refused with the closest known one):

``kafka.bootstrap.servers``  required
``subscribe``                comma-separated topic names, required
``startingOffsets``          ``earliest`` (default) | ``latest`` | JSON
                             ``{"topic": {"0": 12}}`` naming every partition (-2 = earliest,
                             -1 = latest); used only when the checkpoint has no offsets yet
``maxOffsetsPerTrigger``     at most this many offsets per epoch over all partitions
``failOnDataLoss``           ``true`` (default): fail when records to be read were deleted
                             (retention, ``DeleteRecords``); ``false``: skip them
``kafka.<librdkafka option>``  passed to the consumers; ``kafka.isolation.level`` defaults to
                             ``read_committed``
``kafka.group.id``           the consumer group the epochs' end offsets are committed to, for
                             lag tools; default ``exactly-<subscribe>``
                             (:func:`~exactly.connectors.kafka.source.read_exactly_kafka` gives
                             ``exactly-<job name>`` in an ``exactly run`` job)
``exactly.kafka.commitGroupOffsets``  ``true`` (default) | ``false``: commit to the group
``exactly.kafka.commitTimeoutMs``  the longest one group commit may wait (default 5000)
``exactly.kafka.readTimeoutMs``  fail when fetching end offsets or reading a range makes no
                             progress for this long (default 120000)

Columns: ``key binary, value binary, topic string, partition int, offset long,
timestamp timestamp, timestampType int`` (Spark's Kafka source; ``timestampType`` 0 =
create time, 1 = log append time).

Guarantees. An offset is ``{"topic": {"partition": next offset to read}}``; Spark writes an
epoch's end offsets to its offset log before the epoch runs, and ``read`` returns exactly the
records in ``[start, end)`` of each partition, so a replay reads the same records. The end is
the high watermark under ``read_uncommitted`` and the last stable offset under
``read_committed``: every transaction below it is decided, so aborted records (and
transaction markers, which occupy offsets) are never delivered, and a replay after a crash
sees the same committed records.
``maxOffsetsPerTrigger`` and the admission row budget count offsets, so an epoch holds at most
that many records. Failures: an unreachable broker is retried for ``readTimeoutMs``, then the
query fails with :class:`KafkaSourceError`; deleted records fail it with the same error when
``failOnDataLoss`` is true.

Consumer group offsets, for lag tools only (:mod:`exactly.connectors.kafka.group_offsets`):
once an epoch is complete (Spark's commit log holds it), its end offsets are committed to the
group. Spark asks ``latestOffset(start, ...)`` for epoch n+1 only after writing epoch n's
commit log entry, and ``start`` is epoch n's end, so the reader commits ``start`` there (its
own ``commit(end)`` comes one epoch later still, and never for the last epoch before the input
drains). The ``start`` of a new query's first epoch (its initial offsets) is not committed.
The group's offsets are never read: positions come from the checkpoint only. A failed commit
is logged and retried on the next trigger, never fatal; one waits at most
``commitTimeoutMs``. Under Spark's async progress tracking (which Spark allows only with its
own sinks) the commit log is written after the next epoch starts, so the group may show an
epoch that a crash would replay.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from exactly import options as opt
from exactly.connectors.admission import current_admission
from exactly.connectors.kafka.broker import is_transient
from exactly.connectors.kafka.group_offsets import GroupOffsets
from exactly.errors import ConfigError, ExactlyError
from exactly.retry import retry_call

#: ``{"topic": {"partition": next offset to read}}``, as in Spark's offset log
Offsets = dict[str, dict[str, int]]

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")
SPARK_SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType())])
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])

#: every option name the reader knows, besides ``kafka.<librdkafka option>``
READER_OPTIONS = frozenset({opt.KAFKA_BOOTSTRAP, opt.SUBSCRIBE, opt.STARTING_OFFSETS,
                            opt.MAX_OFFSETS_PER_TRIGGER, opt.FAIL_ON_DATA_LOSS,
                            opt.KAFKA_ISOLATION_LEVEL, opt.KAFKA_READ_TIMEOUT_MS,
                            opt.KAFKA_COMMIT_GROUP_OFFSETS, opt.KAFKA_COMMIT_TIMEOUT_MS})
#: options of Spark's built-in Kafka source that this reader does not have
SPARK_ONLY_OPTIONS = ("subscribePattern", "assign", "endingOffsets", "includeHeaders",
                      "minOffsetsPerTrigger", "maxTriggerDelay", "startingTimestamp",
                      "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
                      "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
                      "kafkaConsumer.pollTimeoutMs", "minPartitions", "maxRecordsPerPartition",
                      "groupIdPrefix")
#: librdkafka settings the reader owns: positions live in Spark's offset log only
_RESERVED = {"enable.auto.commit": "positions live in Spark's offset log; completed epochs are "
                                   f"committed to the group (see {opt.KAFKA_COMMIT_GROUP_OFFSETS})",
             "auto.offset.reset": f"use {opt.STARTING_OFFSETS} and {opt.FAIL_ON_DATA_LOSS}"}
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_EARLIEST, _LATEST = -2, -1
_BATCH = 10_000  # records per Arrow batch
_POLL_S = 0.1  # between checks of the position (it passes markers without a message)
_WHERE = "exactly.kafka source"


class KafkaSourceError(ExactlyError):
    """The broker cannot give the reader what it needs; the message names cause and fix."""


@dataclass(frozen=True)
class KafkaReaderOptions:
    """The parsed, checked options of one ``exactly.kafka`` reader (module docstring)."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: str | Offsets = opt.DEFAULT_STARTING_OFFSETS
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    isolation_level: str = opt.DEFAULT_ISOLATION_LEVEL
    read_timeout_s: float = opt.DEFAULT_READ_TIMEOUT_MS / 1000
    #: ``kafka.*`` options without the prefix (bootstrap and isolation level included)
    consumer_conf: dict[str, str] = field(default_factory=dict)
    #: the consumer group completed epochs are committed to; None: no commits
    commit_group: str | None = None
    commit_timeout_s: float = opt.DEFAULT_COMMIT_GROUP_TIMEOUT_MS / 1000

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaReaderOptions:
        """Parse ``options`` (any key case); ConfigError naming the fix for a wrong one."""
        given = {str(k).lower(): str(v) for k, v in options.items()}
        check_option_names(given)
        bootstrap = given.get(opt.KAFKA_BOOTSTRAP.lower(), "").strip()
        if not bootstrap:
            raise ConfigError(f"{_WHERE}: set option {opt.KAFKA_BOOTSTRAP}, e.g. "
                              f".option('{opt.KAFKA_BOOTSTRAP}', 'host:9092')")
        topics = tuple(t.strip() for t in given.get(opt.SUBSCRIBE.lower(), "").split(",")
                       if t.strip())
        if not topics:
            raise ConfigError(f"{_WHERE}: set option {opt.SUBSCRIBE} to the topic names, "
                              f"comma-separated, e.g. .option('{opt.SUBSCRIBE}', 'orders')")
        conf = {k[len(opt.KAFKA_PREFIX):]: v for k, v in given.items()
                if k.startswith(opt.KAFKA_PREFIX)}
        conf.setdefault("isolation.level", opt.DEFAULT_ISOLATION_LEVEL)
        isolation = conf["isolation.level"].lower()
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(f"{_WHERE}: {opt.KAFKA_ISOLATION_LEVEL}={isolation!r} is not "
                              f"one of {' | '.join(ISOLATION_LEVELS)}")
        conf["isolation.level"] = isolation
        group = conf.get("group.id")
        if group is not None and not group.strip():
            raise ConfigError(f"{_WHERE}: {opt.KAFKA_GROUP_ID} is empty; name the consumer "
                              "group lag tools should show, or remove the option")
        commits = _bool(given, opt.KAFKA_COMMIT_GROUP_OFFSETS, True)
        return cls(
            bootstrap=bootstrap, topics=topics,
            starting=parse_starting_offsets(
                given.get(opt.STARTING_OFFSETS.lower(), opt.DEFAULT_STARTING_OFFSETS), topics),
            max_offsets_per_trigger=_positive_int(given, opt.MAX_OFFSETS_PER_TRIGGER),
            fail_on_data_loss=_bool(given, opt.FAIL_ON_DATA_LOSS, True),
            isolation_level=isolation,
            read_timeout_s=(_positive_int(given, opt.KAFKA_READ_TIMEOUT_MS)
                            or opt.DEFAULT_READ_TIMEOUT_MS) / 1000,
            consumer_conf=conf,
            commit_group=(group or default_group(topics)) if commits else None,
            commit_timeout_s=(_positive_int(given, opt.KAFKA_COMMIT_TIMEOUT_MS)
                              or opt.DEFAULT_COMMIT_GROUP_TIMEOUT_MS) / 1000)


def default_group(topics: tuple[str, ...]) -> str:
    """The consumer group of a reader given no ``kafka.group.id``: ``exactly-<topics>``."""
    return "exactly-" + ",".join(topics)


def job_group(job_name: str) -> str:
    """The consumer group of the reader of the job named ``job_name``: ``exactly-<name>``."""
    return f"exactly-{job_name}"


def check_option_names(options: Mapping[str, str]) -> None:
    """Refuse an option the reader does not know, suggesting the closest known name."""
    known = {name.lower(): name for name in READER_OPTIONS}
    spark_only = {name.lower(): name for name in SPARK_ONLY_OPTIONS}
    for key in options:
        lowered = key.lower()
        if lowered in known:
            continue
        if lowered.startswith(opt.KAFKA_PREFIX):
            setting = lowered[len(opt.KAFKA_PREFIX):]
            if setting in _RESERVED:
                raise ConfigError(f"{_WHERE}: option {key} is not supported: "
                                  f"{_RESERVED[setting]}; remove it")
            continue
        if lowered in spark_only:
            raise ConfigError(f"{_WHERE}: {spark_only[lowered]} is an option of Spark's "
                              "built-in Kafka source, not of exactly.kafka; remove it or read "
                              "with exactly.connectors.kafka.source.read_kafka")
        close = difflib.get_close_matches(lowered, list(known), n=1, cutoff=0.6)
        hint = (f"did you mean {known[close[0]]}?" if close
                else f"known options: {', '.join(sorted(READER_OPTIONS))}, "
                     f"{opt.KAFKA_PREFIX}<librdkafka option>")
        raise ConfigError(f"{_WHERE}: unknown option {key}; {hint}")


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{_WHERE}: {name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(f"{_WHERE}: {name} must be at least 1, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise ConfigError(f"{_WHERE}: {name}={raw!r} is not true or false")
    return raw.strip().lower() == "true"


def parse_starting_offsets(raw: str, topics: tuple[str, ...]) -> str | Offsets:
    """``earliest`` | ``latest`` | ``{"topic": {"partition": offset}}`` (topics subscribed)."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        parsed = {str(t): {str(int(p)): int(o) for p, o in parts.items()}
                  for t, parts in data.items()}
    except (ValueError, TypeError, AttributeError):
        raise ConfigError(f"{_WHERE}: {opt.STARTING_OFFSETS}={raw!r} is not earliest, latest "
                          'or JSON like {"orders": {"0": 12, "1": -2}}') from None
    unknown = sorted(set(parsed) - set(topics))
    if unknown:
        raise ConfigError(f"{_WHERE}: {opt.STARTING_OFFSETS} names topics {unknown} that "
                          f"{opt.SUBSCRIBE} does not")
    for t, parts in parsed.items():
        for p, o in parts.items():
            if o < _EARLIEST:
                raise ConfigError(f"{_WHERE}: {opt.STARTING_OFFSETS} {t}[{p}]={o}: give an "
                                  "offset >= 0, -2 (earliest) or -1 (latest)")
    return parsed


def check_read_schema(schema: StructType | None) -> None:
    """Refuse a user-given schema other than the Kafka columns (the reader's is fixed)."""
    if schema is None:
        return
    given = [(f.name, f.dataType) for f in schema.fields]
    if given != [(f.name, f.dataType) for f in SPARK_SCHEMA.fields]:
        raise ConfigError(f"{_WHERE}: its columns are fixed ({SCHEMA}); drop "
                          ".schema(...) and cast key/value in a select")


# -- budget -----------------------------------------------------------------------------
def split_budget(backlog: Mapping[tuple[str, int], int], budget: int,
                 rotation: int = 0) -> dict[tuple[str, int], int]:
    """Share ``budget`` offsets among partitions with a ``backlog`` (max-min fair).

    Every partition gets an equal share, capped by its backlog; what a short partition leaves
    goes to the others. When the budget covers at least one offset for each partition with a
    backlog, each gets at least one. The last few offsets that cannot be shared evenly go to
    consecutive partitions starting at ``rotation`` (mod their number): callers pass a value
    that moves on every epoch (the sum of start offsets), so no partition waits forever.
    """
    grant = {k: 0 for k in backlog}
    active = [k for k in sorted(backlog) if backlog[k] > 0]
    left = max(0, budget)
    while left > 0 and active:
        share = left // len(active)
        if share == 0:
            first = rotation % len(active)
            for k in (active[first:] + active[:first])[:left]:
                grant[k] += 1
            break
        for k in active:
            take = min(share, backlog[k] - grant[k])
            grant[k] += take
            left -= take
        active = [k for k in active if grant[k] < backlog[k]]
    return grant


# -- broker access ----------------------------------------------------------------------
def _get(offsets: Mapping[str, Mapping[str, int]], topic: str, partition: int) -> int | None:
    value = offsets.get(topic, {}).get(str(partition))
    return None if value is None else int(value)


def _as_offsets(ends: Mapping[tuple[str, int], int], topics: tuple[str, ...]) -> Offsets:
    offsets: Offsets = {t: {} for t in topics}
    for (t, p), end in sorted(ends.items()):
        offsets.setdefault(t, {})[str(p)] = end
    return offsets


@dataclass(frozen=True)
class KafkaPartition(InputPartition):
    """Offsets ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader over Kafka topics; options and guarantees in the module docstring."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = KafkaReaderOptions.from_options(options)
        self._consumer: Any = None  # driver side: metadata and watermarks (created lazily)
        self._target: Offsets | None = None  # availableNow: the end fixed at its start
        self._latest: Offsets | None = None  # the newest end seen, for reportLatestOffset
        self._initial: Offsets | None = None  # initialOffset's answer: no epoch ended there
        self._group: GroupOffsets | None = None  # created at the first commit

    # -- driver side ----------------------------------------------------------------------
    def _client_conf(self) -> dict[str, Any]:
        # a throw-away group unless kafka.group.id names one (e.g. for ACLs): nothing joins
        # it (partitions are assigned) and these consumers commit nothing (GroupOffsets does)
        return {"group.id": f"exactly-reader-{uuid.uuid4().hex}",
                **self.options.consumer_conf, "bootstrap.servers": self.options.bootstrap,
                "enable.auto.commit": False, "enable.auto.offset.store": False}

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self._client_conf())
        return self._consumer

    def _drop_client(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):  # a broken client is dropped anyway
                consumer.close()

    def _broker(self, what: str, fn: Any) -> Any:
        """``fn(consumer)`` retried on transient errors for ``readTimeoutMs``."""
        try:
            return retry_call(lambda: fn(self._client()), what=what, transient=is_transient,
                              seconds=self.options.read_timeout_s, maximum=2.0,
                              before_retry=self._drop_client)
        except ExactlyError:
            raise
        except Exception as exc:
            raise KafkaSourceError(
                f"{_WHERE}: {what} on {self.options.bootstrap} failed: {exc}. Check "
                f"{opt.KAFKA_BOOTSTRAP}, the kafka.* security settings and that the broker is "
                f"up (retried for {opt.KAFKA_READ_TIMEOUT_MS}="
                f"{self.options.read_timeout_s * 1000:.0f})") from exc

    def watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(low watermark, end) of every partition of the subscribed topics.

        The end is what a consumer with the reader's isolation level can read up to:
        ``Consumer.get_watermark_offsets`` asks the broker with the consumer's
        ``isolation.level``, so under ``read_committed`` it is the last stable offset (an
        open transaction holds it back), under ``read_uncommitted`` the high watermark. A
        subscribed topic that does not exist yet has no partitions.
        """
        timeout = min(30.0, self.options.read_timeout_s)

        def fetch(consumer: Any) -> dict[tuple[str, int], tuple[int, int]]:
            from confluent_kafka import KafkaError, TopicPartition

            found: dict[tuple[str, int], tuple[int, int]] = {}
            for topic in self.options.topics:
                meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
                if meta is None or (meta.error is not None
                                    and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    continue
                if meta.error is not None:
                    raise KafkaSourceError(f"{_WHERE}: topic {topic}: {meta.error}")
                for p in sorted(meta.partitions):
                    low, end = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                              timeout=timeout, cached=False)
                    found[(topic, p)] = (int(low), int(end))
            return found

        return dict(self._broker("fetch end offsets", fetch))

    def initialOffset(self) -> Offsets:
        self._initial = self._initial_offsets()
        return self._initial

    def _initial_offsets(self) -> Offsets:
        marks = self.watermarks()
        starting = self.options.starting
        offsets: Offsets = {t: {} for t in self.options.topics}
        if isinstance(starting, str):
            for (t, p), (low, end) in marks.items():
                offsets[t][str(p)] = low if starting == "earliest" else end
            return offsets
        for t in self.options.topics:
            wanted = starting.get(t, {})
            mine = sorted(p for (topic, p) in marks if topic == t)
            missing = [p for p in mine if str(p) not in wanted]
            if missing:
                raise ConfigError(f"{_WHERE}: {opt.STARTING_OFFSETS} must give every "
                                  f"partition of {t}; missing {missing} (use -2 for earliest, "
                                  "-1 for latest)")
            for p in mine:
                low, end = marks[(t, p)]
                value = wanted[str(p)]
                value = low if value == _EARLIEST else end if value == _LATEST else value
                if value < low:
                    self._data_lost(t, p, value, low)
                    value = low
                offsets[t][str(p)] = value
        return offsets

    def _data_lost(self, topic: str, partition: int, start: int, low: int) -> None:
        if self.options.fail_on_data_loss:
            raise KafkaSourceError(
                f"{_WHERE}: {topic}[{partition}] offsets {start}..{low - 1} were deleted "
                f"(retention or DeleteRecords) before they were read; the partition now starts "
                f"at {low}. Set {opt.FAIL_ON_DATA_LOSS}=false to skip them, or raise the "
                "topic's retention")

    def _went_back(self, topic: str, partition: int, start: int, end: int) -> None:
        if self.options.fail_on_data_loss:
            raise KafkaSourceError(
                f"{_WHERE}: {topic}[{partition}] ends at offset {end}, before the {start} "
                "already read (topic deleted and re-created?). Set "
                f"{opt.FAIL_ON_DATA_LOSS}=false to go on from {end}, or start a new "
                "checkpoint")

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def _current_ends(self, start: Offsets | None = None) -> dict[tuple[str, int], int]:
        """The end of every partition now; with ``start``, fail on records deleted unread."""
        ends = {}
        for (t, p), (low, end) in self.watermarks().items():
            if start is not None:
                begin = _get(start, t, p)
                begin = 0 if begin is None else begin  # a new partition starts at 0
                if begin < low:
                    self._data_lost(t, p, begin, low)
            ends[(t, p)] = end
        return ends

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        if start != self._initial:  # Spark wrote the commit log of the epoch ending at start
            self._commit_group(start)
        budget = current_admission().row_budget(bounded_run=self._target is not None)
        if budget == 0:  # paused or closed: no epoch now
            return start
        if self._target is not None:  # availableNow: nothing beyond the end fixed at start
            stops = {(t, int(p)): int(e) for t, parts in self._target.items()
                     for p, e in parts.items()}
        else:
            stops = self._current_ends(start)
        self._latest = _as_offsets(stops, self.options.topics)
        begins = {k: _get(start, *k) or 0 for k in stops}
        for (t, p), stop in stops.items():
            if stop < begins[(t, p)]:
                self._went_back(t, p, begins[(t, p)], stop)
        caps = [b for b in (budget, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
                if b is not None]
        if caps:
            backlog = {k: max(0, stops[k] - begins[k]) for k in stops}
            grant = split_budget(backlog, min(caps), rotation=sum(begins.values()))
            stops = {k: begins[k] + grant[k] if backlog[k] else stops[k] for k in stops}
        return _as_offsets(stops, self.options.topics)

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _as_offsets(self._current_ends(), self.options.topics)

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaPartition]:
        found = []
        for t, parts in end.items():
            for p, stop in parts.items():
                begin = _get(start, t, int(p)) or 0
                if int(stop) > begin:
                    found.append(KafkaPartition(t, int(p), begin, int(stop)))
        return found

    def commit(self, end: Offsets) -> None:
        # positions live in Spark's offset log; the group (for lag tools) has this epoch's
        # end already (latestOffset committed it), unless Spark's order differs
        self._commit_group(end, forward_only=True)

    def _commit_group(self, offsets: Offsets, *, forward_only: bool = False) -> None:
        """Commit a completed epoch's end to the group, when commits are on (never raises)."""
        group = self.options.commit_group
        if group is None:
            return
        if self._group is None:
            self._group = GroupOffsets(
                group, {**self.options.consumer_conf, "bootstrap.servers": self.options.bootstrap},
                self.options.commit_timeout_s)
        self._group.commit(offsets, forward_only=forward_only)

    def stop(self) -> None:
        self._drop_client()
        if self._group is not None:
            self._group.close()

    # -- executor side --------------------------------------------------------------------
    def read(self, partition: KafkaPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """The records of ``partition``'s range, as Arrow batches, in offset order.

        Stops when the consumer's position reaches ``end`` (aborted records and transaction
        markers occupy offsets but are not delivered). Fails with :class:`KafkaSourceError`
        when the position does not move for ``readTimeoutMs``, and when the range's start
        was deleted and ``failOnDataLoss`` is true.
        """
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        conf = {**self._client_conf(),
                "auto.offset.reset": "error" if self.options.fail_on_data_loss else "earliest"}
        consumer = Consumer(conf)
        tp = TopicPartition(partition.topic, partition.partition, partition.start)
        where = f"{partition.topic}[{partition.partition}]"
        try:
            consumer.assign([tp])
            position = partition.start
            deadline = time.monotonic() + self.options.read_timeout_s
            last_error = ""
            while position < partition.end:
                rows = _Rows()
                moved = position
                for msg in consumer.consume(min(_BATCH, partition.end - position), _POLL_S):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._AUTO_OFFSET_RESET:
                            raise KafkaSourceError(
                                f"{_WHERE}: {where} offsets from {position} were deleted "
                                "(retention or DeleteRecords) before they were read: "
                                f"{err.str()}. Set {opt.FAIL_ON_DATA_LOSS}=false to skip "
                                "them, or raise the topic's retention")
                        if err.fatal():
                            raise KafkaSourceError(f"{_WHERE}: reading {where}: {err.str()}")
                        if err.code() != KafkaError._PARTITION_EOF:  # the client retries
                            last_error = f" (last error: {err.str()})"
                        continue
                    offset = msg.offset() or 0
                    if offset >= partition.end or offset < position:
                        continue
                    rows.add(msg, partition.partition)
                    moved = max(moved, offset + 1)
                if len(rows):
                    yield rows.batch()
                (now,) = consumer.position([TopicPartition(partition.topic,
                                                           partition.partition)])
                moved = max(moved, int(now.offset))  # past aborted records and markers
                if moved > position:
                    position = moved
                    deadline = time.monotonic() + self.options.read_timeout_s
                elif time.monotonic() > deadline:
                    raise KafkaSourceError(
                        f"{_WHERE}: {where} could not be read from offset {position} to "
                        f"{partition.end} within {self.options.read_timeout_s:.0f}s of no "
                        f"progress{last_error}; check that the broker is up and the partition "
                        f"has a leader, or raise {opt.KAFKA_READ_TIMEOUT_MS}")
        finally:
            consumer.close()


class _Rows:
    """Columns of one Arrow batch, filled message by message."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.types: list[int] = []
        self.topic = ""
        self.partition = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, msg: Any, partition: int) -> None:
        self.topic, self.partition = msg.topic(), partition
        self.keys.append(msg.key())
        self.values.append(msg.value())
        self.offsets.append(msg.offset() or 0)
        kind, millis = msg.timestamp()
        # confluent_kafka: 0 = not available, 1 = create time, 2 = log append time;
        # Spark's timestampType is Kafka's id: -1 = none, 0 = create time, 1 = log append time
        self.timestamps.append(millis * 1000 if kind else None)
        self.types.append(kind - 1)

    def batch(self) -> pa.RecordBatch:
        n = len(self.offsets)
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()), pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32())], schema=ARROW_SCHEMA)

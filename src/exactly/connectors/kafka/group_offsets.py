"""Consumer-group offsets of exactly's Kafka reader, for the tools that watch lag.

Lag tools (``kafka-consumer-groups.sh --describe``, Burrow, Grafana's Kafka panels) read a
consumer group's committed offsets. exactly's reader (:mod:`exactly.connectors.kafka.reader`)
takes its positions from Spark's checkpoint only; :class:`GroupOffsets` copies the end
offsets of completed epochs into a group so those tools see the job. The group's offsets are
never read back: nothing here can move a position.

A commit is an ``AlterConsumerGroupOffsets`` request from an admin client (the offset commit
of a member-less group, what ``kafka-consumer-groups.sh --reset-offsets`` sends), answered
within a bound (``exactly.kafka.commitTimeoutMs``). It fails when the group has live members
(someone else consumes with that group id), when an ACL forbids it, or when the broker does
not answer in time; a failure is logged (event ``kafka_group_commit_failed``, once per kind of
error until a commit succeeds again, then ``kafka_group_commit_recovered``), never raised, and
the same offsets are offered again on the next call.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from exactly.connectors.kafka.broker import is_transient
from exactly.logs import ensure_console, log_event
from exactly.retry import retry_call

logger = logging.getLogger("exactly.connectors.kafka.group_offsets")

#: ``{"topic": {"partition": offset}}``, as in Spark's offset log
Offsets = Mapping[str, Mapping[str, int]]

#: librdkafka properties only a consumer takes (scope "C" in librdkafka's CONFIGURATION.md,
#: 2.x; each checked to make an admin client log ``CONFWARN ... is a consumer property``).
#: The reader's ``kafka.*`` options are consumer settings; the admin client gets the rest.
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms",
    "heartbeat.interval.ms", "group.protocol.type", "group.protocol", "group.remote.assignor",
    "coordinator.query.interval.ms", "max.poll.interval.ms", "enable.auto.commit",
    "auto.commit.enable", "auto.commit.interval.ms", "enable.auto.offset.store",
    "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms",
    "fetch.queue.backoff.ms", "fetch.message.max.bytes", "max.partition.fetch.bytes",
    "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms", "offset.store.method",
    "offset.store.path", "offset.store.sync.interval.ms", "isolation.level",
    "enable.partition.eof", "check.crcs", "auto.offset.reset", "consume.callback.max.messages",
})


def flat(offsets: Offsets) -> dict[tuple[str, int], int]:
    """``{(topic, partition): offset}`` of a ``{"topic": {"partition": offset}}`` mapping."""
    return {(str(t), int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def is_kafka_error(exc: BaseException) -> bool:
    """A KafkaException carrying a KafkaError (its text is the error itself)."""
    from confluent_kafka import KafkaError, KafkaException

    return isinstance(exc, KafkaException) and bool(exc.args) and isinstance(exc.args[0],
                                                                              KafkaError)


class GroupOffsets:
    """Commits positions to one consumer group, for lag tools; never raises.

    ``conf`` holds the client settings (``bootstrap.servers`` and the reader's ``kafka.*``
    options without the prefix); consumer-only ones are left out of the admin client.
    :meth:`commit` waits at most ``timeout_s`` for the group's answer.
    """

    def __init__(self, group: str, conf: Mapping[str, Any], timeout_s: float) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self._conf = {k: v for k, v in conf.items() if k not in CONSUMER_ONLY}
        self._admin: Any = None
        #: the offsets the group holds, as far as this process knows
        self._committed: dict[tuple[str, int], int] | None = None
        self._failures = 0
        self._last_error = ""
        #: milliseconds of the latest answered commits, for measurements
        self.durations_ms: deque[float] = deque(maxlen=1000)

    def commit(self, offsets: Offsets, *, forward_only: bool = False) -> bool:
        """Commit ``offsets`` to the group unless the group already holds them.

        ``forward_only``: commit only when no partition would go back (Spark's own
        ``commit(end)`` may name an older epoch than the one already committed). Returns
        whether the group holds ``offsets`` now; a failure is logged, not raised.
        """
        wanted = flat(offsets)
        if not wanted or wanted == self._committed:
            return bool(wanted)
        if forward_only and self._committed is not None and any(
                o < self._committed.get(k, -1) for k, o in wanted.items()):
            return False
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        error = ""
        try:  # a coordinator loading or moving answers again in a moment: retried quietly
            retry_call(lambda: self._send(wanted, deadline), what="commit group offsets",
                       transient=is_transient, seconds=self.timeout_s, maximum=0.5,
                       level=logging.DEBUG, log=logger, group=self.group)
        except concurrent.futures.TimeoutError:
            error = f"no answer within {self.timeout_s:g}s (exactly.kafka.commitTimeoutMs)"
        except Exception as exc:  # never fatal: the group only feeds lag tools
            error = (str(exc.args[0]) if is_kafka_error(exc)
                     else f"{type(exc).__name__}: {exc}")
        if error:
            self._failed(error, wanted)
            return False
        self.durations_ms.append((time.perf_counter() - started) * 1000)
        if self._failures:
            log_event(logger, "kafka_group_commit_recovered", group=self.group,
                      failed_commits=self._failures)
        self._failures, self._last_error = 0, ""
        self._committed = wanted
        return True

    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self._conf)
        return self._admin

    def _send(self, wanted: dict[tuple[str, int], int], deadline: float) -> None:
        """One commit, answered by ``deadline``; KafkaException with the error of the first
        partition the group refused."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

        request = ConsumerGroupTopicPartitions(
            self.group, [TopicPartition(t, p, o) for (t, p), o in sorted(wanted.items())])
        left = max(0.1, deadline - time.monotonic())
        futures = self._client().alter_consumer_group_offsets([request], request_timeout=left)
        result = futures[self.group].result(timeout=left + 1)
        for tp in result.topic_partitions:
            if tp.error is not None:
                raise KafkaException(tp.error)

    def _failed(self, error: str, wanted: dict[tuple[str, int], int]) -> None:
        self._failures += 1
        if error == self._last_error:  # the same cause again: logged when it began
            return
        self._last_error = error
        self._admin = None  # a client that timed out may hold a broken connection
        ensure_console()  # Spark's source-runner worker: make the warning reach stderr
        log_event(logger, "kafka_group_commit_failed", logging.WARNING, group=self.group,
                  error=error, offsets={f"{t}[{p}]": o for (t, p), o in sorted(wanted.items())},
                  effect="lag tools show the group's previous offsets; positions come from "
                         "the checkpoint and are unaffected; retried on the next trigger",
                  fix="stop other consumers using this group id, grant the job Read on the "
                      "group, or set exactly.kafka.commitGroupOffsets=false")

    def close(self) -> None:
        """Drop the admin client (nothing is in flight: :meth:`commit` waits for answers)."""
        self._admin = None

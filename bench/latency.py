"""Shared parts of the visibility-latency benchmarks: a Kafka input fed at a fixed rate whose
records the broker stamps when it appends them, and a reader that records when each record
id first became visible to it.

* :func:`create_input` - an input topic with ``message.timestamp.type=LogAppendTime``: each
  record's timestamp is the broker's append time, so the latency is measured from the moment
  the input existed (a producer starved of CPU on a busy machine does not count).
* :class:`RateProducer` - produces ids ``0, 1, 2 ...`` (the record's value, as text) at a
  fixed rate, spread over the partitions; warm-up records carry negative ids.
* :class:`ProducerProcess` - the same in a process of its own.
* :class:`FirstSeen` - a reader polling in its own thread every ``poll_s``: a subclass's
  :meth:`FirstSeen.poll` returns the rows it found new as ``(id, append time in s)``; the
  time the poll returned is recorded per id the first time the id is seen, and every row
  read is kept (for the check by id). A lister that reads files after listing them sets
  :attr:`FirstSeen.visible_at` to when its listing came back, and that time is recorded.
  The poll interval plus the time a poll takes is the resolution
  (:meth:`FirstSeen.resolution_ms`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from exactly.testing.kafka_broker import create_topic, quiet_conf

PARTITIONS = 2


def create_input(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    """An input topic whose records the broker timestamps on append (LogAppendTime)."""
    create_topic(bootstrap, topic, partitions, **{"message.timestamp.type": "LogAppendTime"})


class RateProducer:
    """Produces the ids ``0, 1, ...`` into ``topic`` at ``rate`` records/s (value = the id as
    text, partition = id mod partitions); :meth:`warm` produces negative ids."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.partitions = partitions
        self.sent = 0
        self._warm = 0
        # batched a little (5 ms): one request per record loads a busy broker, and the
        # latency starts at the broker's append anyway. Idempotent: a retry after a timeout
        # on a loaded broker would otherwise append a record twice (seen: 13 ids twice in
        # an input, which the check by id then blames on the sink)
        self._p = Producer({**quiet_conf(bootstrap), "linger.ms": 5,
                            "enable.idempotence": True})

    def warm(self) -> None:
        """One warm-up record per partition (ids -1, -2, ...), delivered before returning."""
        for part in range(self.partitions):
            self._warm += 1
            self._p.produce(self.topic, str(-self._warm).encode(), partition=part)
        self._p.flush(10)

    def run(self, rate: int, seconds: float, tick: Callable[[], None] | None = None) -> float:
        """Produce at ``rate`` records/s for ``seconds``; returns the achieved rate. ``tick``
        runs about every 100 ms (e.g. to check the query is alive)."""
        start = time.time()
        last_tick = start
        while (now := time.time()) - start < seconds:
            due = int((now - start) * rate)
            while self.sent < due:
                i = self.sent
                try:
                    self._p.produce(self.topic, str(i).encode(), partition=i % self.partitions)
                except BufferError:
                    self._p.poll(0.01)
                    continue
                self.sent += 1
            self._p.poll(0)
            if tick is not None and now - last_tick > 0.1:
                tick()
                last_tick = now
            time.sleep(0.002)
        remaining = self._p.flush(180)  # a loaded broker may lag
        if remaining:
            raise RuntimeError(f"{remaining} input records not delivered to {self.topic}")
        return self.sent / (time.time() - start)  # the delivery included


def _produce_child(bootstrap: str, topic: str, rate: int, seconds: float, go: Any,
                   result: Any) -> None:
    producer = RateProducer(bootstrap, topic)
    go.wait()
    try:
        achieved = producer.run(rate, seconds)
        result.put((producer.sent, achieved, None))
    except Exception as exc:  # reported by the parent
        result.put((producer.sent, 0.0, repr(exc)))


class ProducerProcess:
    """A :class:`RateProducer` in a process of its own (no GIL shared with the driver's
    Python code: exactly's commits run there), started by :meth:`go` and waited for by
    :meth:`join`."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding a JVM
        self._go = ctx.Event()
        self._result = ctx.Queue()
        self._proc = ctx.Process(target=_produce_child, daemon=True,
                                 args=(bootstrap, topic, rate, seconds, self._go,
                                       self._result))
        self._proc.start()

    def go(self) -> None:
        self._go.set()

    def join(self, tick: Callable[[], None] | None = None,
             timeout: float = 600) -> tuple[int, float]:
        """(records sent, achieved rate); ``tick`` runs every 100 ms meanwhile."""
        import queue

        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                sent, achieved, error = self._result.get(timeout=0.1)
                break
            except queue.Empty:
                if tick is not None:
                    tick()
        else:
            self._proc.kill()
            raise RuntimeError(f"the input producer did not finish in {timeout:.0f} s")
        self._proc.join(10)
        if error is not None:
            raise RuntimeError(f"the input producer failed: {error}")
        return sent, achieved

    def kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()


class FirstSeen:
    """Records per id the first time :meth:`poll` returned it, polling in a thread of its own
    every ``poll_s`` seconds from :meth:`start` to :meth:`stop`. Subclasses implement
    :meth:`poll`; a poll that raises is counted in ``errors`` and retried."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self.first: dict[int, float] = {}  # id -> time first seen
        self.stamp: dict[int, float] = {}  # id -> append time of its input record
        self.ids: list[int] = []  # every row read (an id twice = seen twice)
        self.polls = 0
        self.poll_time = 0.0
        self.errors: list[str] = []  # the first 20 failed polls' errors
        self.failed_polls = 0
        #: set by :meth:`poll` to when what it returns was seen (default: when it returned)
        self.visible_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def poll(self) -> Iterable[tuple[int, float]]:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (called in the reader's thread when it stops)."""

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.time()
                self.visible_at = None
                try:
                    rows = list(self.poll())
                except Exception as exc:  # the target may not exist yet
                    self.failed_polls += 1
                    if len(self.errors) < 20:
                        self.errors.append(repr(exc))
                    rows = []
                done = time.time()
                seen = self.visible_at or done
                for i, ts in rows:
                    self.ids.append(i)
                    if i not in self.first:
                        self.first[i] = seen
                        self.stamp[i] = ts
                self.polls += 1
                self.poll_time += done - began
                self._stop.wait(self.poll_s)
        finally:
            self.close()

    def start(self) -> FirstSeen:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def seen_warm(self) -> bool:
        return any(i < 0 for i in list(self.first))

    def seen_all(self, count: int) -> bool:
        return all(i in self.first for i in range(count))

    def delays_ms(self, count: int) -> list[float]:
        """Visible - appended, in ms, of the ids ``0 .. count-1`` seen."""
        return [(self.first[i] - self.stamp[i]) * 1000 for i in range(count) if i in self.first]

    def resolution_ms(self) -> float:
        """The mean time between two polls: the interval plus a poll's own time."""
        return (self.poll_s + self.poll_time / self.polls) * 1000 if self.polls else float("nan")


def wait_for(condition: Callable[[], bool], timeout: float, step: float = 0.05,
             alive: Callable[[], Any] | None = None) -> bool:
    """Poll ``condition`` until true or ``timeout``; ``alive`` runs each step (may raise)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        if alive is not None:
            alive()
        time.sleep(step)
    return condition()

"""Publishing an epoch while its tasks still run: the staged rows stream into the open transaction.

Without this, the epoch's transaction is filled only after every task returned: the tasks
stage their rows (Arrow IPC files), then the driver reads them all back and produces them,
so the publish adds to the tasks' time instead of overlapping it. In the ``foreachBatch``
path (``start_query``), the driver calls :meth:`KafkaSink.start_early_publish
<exactly.connectors.kafka.sink.KafkaSink.start_early_publish>` before it runs the epoch's
tasks; an :class:`EpochStream` thread then

1. unless the epoch marker says the epoch is already published, begins the epoch's Kafka
   transaction on the run's producer (the suspect-producer rule applies as for a publish:
   a producer that timed out a request or lost a connection is replaced first) and puts the
   epoch's marker into it, so that the commit after the intent is a single request;
2. polls the epoch's staging directory for this run's task attempts and produces every
   complete Arrow record batch of their staged files into the open transaction as soon as
   it is written (:class:`StagedTail`: on a local or shared directory a file is read while
   it grows, message by message; on object storage an object appears whole when its task's
   pre-commit completes, and is read then).

Nothing of it is visible to ``read_committed`` readers: the transaction commits only in
``publish_epoch``, after the commit intent named every handle. There, the stream is stopped
and checked (:meth:`EpochStream.finish`): every attempt the intent names is read to its end
(what the thread had not produced yet is produced now), and when the transaction holds rows
of an attempt the intent does not name (a failed, retried or speculative task attempt), or
a staged file does not hold the rows its handle names, the transaction is aborted and the
epoch is published from the intent's files as before. Presumed abort holds: a driver that
dies before the intent leaves an open transaction that the next run's ``init_transactions``
fences and aborts (or the broker, after ``transaction.timeout.ms``); the epoch is then
replayed and published by the next run.

Crash point ``kafka.streaming`` (:data:`STREAMING`): in the stream thread, after the first
staged rows went into the open transaction (flushed to the broker's log), while the tasks
still run and before any intent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.logs import log_event
from exactly.protocol.contract import Handle
from exactly.protocol.faults import maybe_crash, register_point
from exactly.protocol.staging import Stage, StagedFile, StagingArea

logger = logging.getLogger("exactly.connectors.kafka.streaming")

STREAMING = register_point(
    "kafka.streaming", on_driver=True,
    description="the epoch's Kafka transaction opened before the intent, the first staged "
                "rows produced into it (and flushed) while the epoch's tasks still run")

#: how often the stream thread looks for new staged rows: a local directory, object storage
POLL_LOCAL_S = 0.01
POLL_REMOTE_S = 0.2
#: the share of ``transaction.timeout.ms`` an early transaction may stay open before the
#: stream aborts it itself and leaves the epoch to the full publish: the broker would abort
#: it at the timeout and fence the producer (the publish would fail instead of falling back)
MAX_OPEN_SHARE = 0.5

_MAGIC = b"ARROW1"
#: the IPC end-of-stream marker the file writer puts before the footer
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class UnstreamableFile(Exception):
    """A staged file holds a message this reader does not stream (e.g. a dictionary)."""


class StagedTail:
    """One staged Arrow IPC file, read as it grows: each call to :meth:`read_new` returns
    the record batches written completely since the last call.

    The IPC file format writes its messages one after the other and the footer last, so
    every prefix of the file is a prefix of the final file: a message read whole from a
    prefix is the final message, and a partial one fails to parse and is read again later.
    The file is complete when the end-of-stream marker follows the last message and the file
    ends with the footer's magic. On object storage the file is read only once it exists
    (its upload completed: whole).
    """

    def __init__(self, staged: StagedFile) -> None:
        self.staged = staged
        self.local = isinstance(staged.fs, pafs.LocalFileSystem)
        self.offset = 8  # past the leading magic and its padding
        self.schema: pa.Schema | None = None
        self.rows = 0
        self.complete = False

    def _read(self) -> bytes | None:
        if self.local:
            try:
                with open(self.staged.path, "rb") as f:
                    f.seek(self.offset)
                    return f.read()
            except FileNotFoundError:
                return None
        if not self.staged.exists():
            return None
        with self.staged.open() as source:
            source.seek(self.offset)
            return source.read()

    def read_new(self) -> list[pa.RecordBatch]:
        """The record batches completely written since the last call (none once complete).

        Raises FileNotFoundError when the file was there and is gone, UnstreamableFile for
        a message other than the schema and record batches."""
        if self.complete:
            return []
        data = self._read()
        if data is None:
            if self.offset > 8:
                raise FileNotFoundError(str(self.staged))
            return []
        buf = pa.py_buffer(data)
        reader = pa.BufferReader(buf)
        batches: list[pa.RecordBatch] = []
        consumed = 0
        while True:
            try:
                message = pa.ipc.read_message(reader)
            except (EOFError, pa.ArrowInvalid, OSError):
                break
            if message is None:
                break
            consumed = reader.tell()
            if message.type == "schema":
                self.schema = pa.ipc.read_schema(message)
            elif message.type == "record batch" and self.schema is not None:
                batch = pa.ipc.read_record_batch(message, self.schema)
                batches.append(batch)
                self.rows += batch.num_rows
            else:
                raise UnstreamableFile(f"{self.staged}: IPC message {message.type!r}")
        rest = data[consumed:]
        if rest.startswith(_EOS) and rest.endswith(_MAGIC):
            self.complete = True
        self.offset += consumed
        return batches


@dataclass
class StreamedAttempt:
    """What the stream produced of one task attempt's staged file."""

    tail: StagedTail
    produced_rows: int = 0


@dataclass
class EpochStream:
    """The stream of one epoch's staged rows into the run's open transaction (module doc).

    ``session`` is the run's :class:`~exactly.connectors.kafka.publisher.PublishSession`.
    """

    session: Any
    stage: Stage
    options: KafkaSinkOptions
    run_id: str
    epoch: int
    attempts: dict[str, StreamedAttempt] = field(default_factory=dict)
    #: the producer whose transaction holds the streamed rows (None: nothing begun)
    producer: Any = None
    #: why the stream stopped early (the publish then goes the full way)
    error: BaseException | None = None
    already_published: bool = False
    #: when the early transaction took the epoch marker (``time.monotonic()``; 0: not
    #: begun). ``begin_transaction`` is local to librdkafka: the broker's transaction, and
    #: its timeout, start with the first partition added to it, the marker's
    began: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"exactly-kafka-stream-{self.epoch}")
        self._thread.start()

    def _run(self) -> None:
        session = self.session
        poll_s = POLL_LOCAL_S if isinstance(self.stage, StagingArea) else POLL_REMOTE_S
        with session.busy:
            try:
                self.producer = session.begin_streamed(self.epoch)
                if self.producer is None:
                    self.already_published = True
                    return
                self.began = time.monotonic()
                crashed_once = False
                while True:
                    stopping = self._stop.is_set()
                    if self.too_old():
                        session.abort_open()
                        raise TimeoutError(
                            f"the early transaction of epoch {self.epoch} was open for "
                            f"{time.monotonic() - self.began:.0f}s, over "
                            f"{MAX_OPEN_SHARE:.0%} of transaction.timeout.ms; the epoch is "
                            "published after its tasks instead")
                    produced = self._poll()
                    if produced and not crashed_once:
                        crashed_once = True
                        maybe_crash(self.options.fault, STREAMING, self.epoch,
                                    before=lambda: self.producer.flush(30))
                    if stopping:
                        return
                    if not produced:
                        self._stop.wait(poll_s)
            except BaseException as exc:  # the publish falls back to the full path
                self.error = exc
                log_event(logger, "stream_stopped", logging.INFO, epoch=self.epoch,
                          error=f"{type(exc).__name__}: {exc}")
            finally:
                session.last_used = time.monotonic()

    def _poll(self) -> int:
        """Produce what the attempts staged since the last poll; the rows produced."""
        produced = 0
        for directory in self.stage.run_attempts(self.epoch, self.run_id):
            attempt = self._attempt(directory)
            if attempt.tail.complete:
                continue
            try:
                produced += self._produce_new(attempt)
            except FileNotFoundError:  # an aborted attempt removed its directory
                continue
        return produced

    def _attempt(self, directory: str) -> StreamedAttempt:
        """The attempt staged in ``directory``, followed from the first time it is seen."""
        attempt = self.attempts.get(directory)
        if attempt is None:
            staged = self.stage.file_in(directory, self.stage.data_name)
            attempt = self.attempts[directory] = StreamedAttempt(StagedTail(staged))
        return attempt

    def _produce_new(self, attempt: StreamedAttempt) -> int:
        """Produce the attempt's record batches written since the last read into the open
        transaction; the rows produced. Raises as :meth:`StagedTail.read_new`."""
        from exactly.connectors.kafka.publisher import produce_batch

        rows = 0
        for batch in attempt.tail.read_new():
            produce_batch(self.producer, batch, self.options.topic)
            attempt.produced_rows += batch.num_rows
            rows += batch.num_rows
        return rows

    def too_old(self) -> bool:
        """The early transaction has been open too long to be committed safely (see
        :data:`MAX_OPEN_SHARE`)."""
        limit = self.options.transaction_timeout_ms / 1000 * MAX_OPEN_SHARE
        return bool(self.began) and time.monotonic() - self.began > limit

    def stop(self) -> None:
        """Stop the thread (after one last poll) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, handles: Sequence[Handle]) -> int | None:
        """Stop the thread and complete the transaction's rows to exactly ``handles``' staged
        files; the rows it then holds, or None when it cannot (nothing begun, the stream
        failed, an attempt the intent does not name is in it, a file does not hold its
        handle's rows): the caller aborts it and publishes the full way."""
        self.stop()
        if self.producer is None or self.error is not None or self.too_old():
            return None
        wanted = {h.payload.dir: h for h in handles if h.payload.file}
        extra = [d for d, a in self.attempts.items() if d not in wanted and a.produced_rows]
        if extra:
            log_event(logger, "stream_has_other_attempts", logging.WARNING, epoch=self.epoch,
                      attempts=extra)
            return None
        rows = 0
        for directory, handle in wanted.items():
            attempt = self._attempt(directory)
            try:
                self._produce_new(attempt)
            except (FileNotFoundError, UnstreamableFile) as exc:
                log_event(logger, "stream_incomplete", logging.WARNING, epoch=self.epoch,
                          attempt=directory, error=str(exc))
                return None
            if not attempt.tail.complete or attempt.produced_rows != handle.rows:
                log_event(logger, "stream_incomplete", logging.WARNING, epoch=self.epoch,
                          attempt=directory, rows=attempt.produced_rows, expected=handle.rows,
                          complete=attempt.tail.complete)
                return None
            rows += attempt.produced_rows
        return rows

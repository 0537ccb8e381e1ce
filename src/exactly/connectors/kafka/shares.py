"""Publishing an epoch in shares (``exactly.kafka.publishShares=N``), each exactly once.

With N = 1 (the default) the driver's one producer publishes the whole epoch in one
transaction (:mod:`exactly.connectors.kafka.publisher`). With N > 1 the epoch's staged
files are split into N shares, and share i is published by its own transactional producer
``<prefix>-<query id>-<i>`` in one transaction that also sets its own epoch marker (the
offset of ``<marker topic>[0]`` for the group ``<prefix>-<query id>-epochs-<i>``). Each
share is decided by its own marker, as the whole epoch is decided by the one marker with
N = 1: after a crash anywhere, a share whose marker is past the epoch is not published
again, any other is (its producer's ``init_transactions`` first fences and settles what a
predecessor left open).

* **Which share a file is in**: the task's partition modulo N. N is the one the tasks
  wrote the epoch with: each staged pre-commit's payload carries it, so the intent names it
  and a recovery publishes an epoch in the shares it began in, whatever N the new run has
  (a rescale of N never splits an epoch in flight anew).
* **Where shares are published**: through ``start_query`` (``foreachBatch``) the driver
  runs them as a Spark job of N one-row tasks on the executors: the driver's Python
  process produces nothing. Where the commit runs without a Spark session (the Python data
  source writer of ``writeStream.format("exactly.kafka")``, a cancel's clean-up) the
  committing process publishes the shares one after the other: the same transactions, the
  same guarantee, no spread.
* **What a reader sees**: each share whole or not at all (``read_committed``), the shares of
  an epoch one after the other, as the subtasks of a Flink checkpoint commit one after the
  other. A reader may see share 0 of epoch e before share 1 of epoch e, never a part of a
  share, never a record twice.
* **Every share commits its marker every epoch**, also when it holds no rows (a
  transaction with the marker only), so "epoch e is published" is "every share's marker is
  past e".

Fault point ``kafka.in_share`` (:data:`IN_SHARE`): in a share's task, its records produced
into its open transaction and flushed, before the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from exactly.errors import FencedError
from exactly.logs import log_event
from exactly.protocol.contract import Handle
from exactly.protocol.faults import register_point
from exactly.protocol.staging import StagedPayload

if TYPE_CHECKING:
    from exactly.connectors.kafka.options import KafkaSinkOptions
    from exactly.protocol.staging import Stage

logger = logging.getLogger("exactly.kafka")

IN_SHARE = register_point(
    "kafka.in_share", on_driver=False,
    description="a share's records produced into its open Kafka transaction and flushed, "
                "before its commit (in the share's task)")

_RESULT = pa.schema([("share", pa.int32()), ("rows", pa.int64()), ("files", pa.int32())])
_RESULT_DDL = "share int, rows long, files int"


@dataclass(frozen=True)
class KafkaPayload(StagedPayload):
    """A Kafka pre-commit: the staged file and the number of shares its epoch is published
    in (``exactly.kafka.publishShares`` when the task wrote it)."""

    shares: int = 1


def epoch_shares(handles: Sequence[Handle], default: int) -> int:
    """The number of shares the epoch of ``handles`` is published in: what its pre-commits
    recorded (an intent written before shares existed: 1), ``default`` for none."""
    found = {getattr(h.payload, "shares", 1) for h in handles}
    if len(found) > 1:  # one run writes every pre-commit of an epoch: never seen
        raise ValueError(f"the pre-commits of one epoch name different share counts {found}")
    return found.pop() if found else default


def share_of(handle: Handle, shares: int) -> int:
    """The share a task's pre-commit is published in."""
    return handle.partition % shares


def split(handles: Iterable[Handle], shares: int) -> list[list[Handle]]:
    """The handles of each share, 0..shares-1, in partition order."""
    out: list[list[Handle]] = [[] for _ in range(shares)]
    for handle in sorted(handles, key=lambda h: h.partition):
        out[share_of(handle, shares)].append(handle)
    return out


def publish_share(options: KafkaSinkOptions, stage: Stage, query_id: str, epoch: int,
                  share: int, shares: int, handles: Sequence[Handle]) -> int:
    """Publish share ``share`` of epoch ``epoch`` exactly once with its own producer: open
    it (``init_transactions`` fences an older producer of the share and settles what it left
    open), unless its marker is past the epoch produce the share's staged rows and the
    marker in one transaction. Returns the rows in the share's files. Raises what
    :meth:`PublishSession.publish` raises."""
    from exactly.connectors.kafka.publisher import PublishSession

    files = [f for f in map(stage.staged_file, handles) if f is not None]
    session = PublishSession(options, query_id, share=share, shares=shares,
                             crash_point=IN_SHARE)
    try:
        session.publish(epoch, files)
    except Exception:
        session.close()  # aborts what it holds open (a process killed here aborts nothing)
        raise
    session.close()
    return sum(h.payload.rows for h in handles)


def publish_in_process(options: KafkaSinkOptions, stage: Stage, query_id: str, epoch: int,
                       parts: list[list[Handle]]) -> None:
    """Every share of the epoch from this process, one after the other."""
    for share, handles in enumerate(parts):
        publish_share(options, stage, query_id, epoch, share, len(parts), handles)


def publish_on_executors(spark: Any, options: KafkaSinkOptions, stage: Stage, query_id: str,
                         epoch: int, parts: list[list[Handle]]) -> None:
    """Every share of the epoch as one task each of a Spark job in ``spark``.

    A share's task that fails fails the job (after Spark's own task retries): the error is
    raised here, FencedError when a share's producer was fenced by a newer one."""
    shares = len(parts)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for share in batch.column(0).to_pylist():
                rows = publish_share(options, stage, query_id, epoch, int(share), shares,
                                     parts[int(share)])
                yield pa.RecordBatch.from_pylist(
                    [{"share": int(share), "rows": rows, "files": len(parts[int(share)])}],
                    schema=_RESULT)

    job = spark.range(0, shares, 1, shares).mapInArrow(run, _RESULT_DDL)
    try:
        done = job.toArrow()
    except Exception as exc:
        if "FencedError" in str(exc):
            raise FencedError(f"epoch {epoch}: a share's producer of query {query_id} was "
                              f"fenced by a newer one: {_first_line(exc)}") from exc
        raise
    published = sorted(done.column("share").to_pylist())
    if published != list(range(shares)):  # a task that returned nothing: never seen
        raise RuntimeError(f"epoch {epoch}: the publish job answered for shares {published} "
                           f"of {shares}")
    log_event(logger, "epoch_shares_published", epoch=epoch, shares=shares,
              rows=sum(done.column("rows").to_pylist()))


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "FencedError" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


def shares_watermark(options: KafkaSinkOptions, query_id: str, timeout: float = 30) -> int:
    """One past the last epoch every share of ``query_id`` published (0: none, or the query
    never published in shares). The share count is the one share 0's last marker names."""
    from exactly.connectors.kafka.publisher import read_marker, read_marker_record

    first, metadata = read_marker_record(options, query_id, timeout, share=0)
    shares = metadata.get("shares")
    if not first or not isinstance(shares, int) or shares < 1:
        return 0
    return min([first, *(read_marker(options, query_id, timeout, share=i)
                         for i in range(1, shares))])


def published_through(options: KafkaSinkOptions, query_id: str, timeout: float = 30) -> int:
    """One past the last epoch of ``query_id`` the target holds whole: by the one producer
    or by every share (a query may have run with either between restarts)."""
    from exactly.connectors.kafka.publisher import read_marker

    return max(read_marker(options, query_id, timeout), shares_watermark(options, query_id,
                                                                          timeout))


def share_ids(options: KafkaSinkOptions, query_id: str, timeout: float = 30) -> list[str]:
    """The transactional ids of every share the query's markers name (share 0's count), for
    fencing a superseded query."""
    from exactly.connectors.kafka.publisher import read_marker_record

    _, metadata = read_marker_record(options, query_id, timeout, share=0)
    shares = metadata.get("shares")
    count = shares if isinstance(shares, int) and shares > 1 else 0
    return [options.transactional_id(query_id, i) for i in range(count)]


__all__ = ["IN_SHARE", "KafkaPayload", "epoch_shares", "publish_in_process",
           "publish_on_executors", "publish_share", "published_through", "share_ids",
           "share_of", "shares_watermark", "split"]

"""``exactly demo --sink kafka``: Kafka -> stateful job -> Kafka under random crashes, audited.

It produces ``events`` input records with unique ids into a fresh input topic, runs
:mod:`exactly.demos.kafka_job` (the ``exactly.kafka`` transactional sink) under a random
crash schedule drawn from every driver protocol point, ``in_write`` and the Kafka sink's own
``kafka.in_transaction`` point, restarting after each crash until the input is drained, then reads
the output topic with a ``read_committed`` consumer and audits it: every id exactly once, and
per key the running sequence numbers exactly 1..n (the job's state was applied once). The
``read_uncommitted`` view (which also shows records of aborted transactions) is reported too.

The broker is ``EXACTLY_KAFKA_BOOTSTRAP`` when set, else one started here for the run.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from exactly.auditor import AuditSpec, KafkaLocation, VerifyReport, run_audit
from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.demos.console import ConsoleProgress, DemoResult
from exactly.protocol.faults import DRIVER_POINTS, FaultPoint, FaultSpec
from exactly.testing.chaos import Attempt, run_with_crashes
from exactly.testing.kafka_broker import broker_or_configured, create_topic, quiet_conf

KEYS = 20


def produce_events(bootstrap: str, topic: str, events: int, seed: int = 0,
                   start: int = 0) -> None:
    """``events`` JSON records ``{"id", "key", "amount"}`` with ids start..start+events-1."""
    from confluent_kafka import Producer

    producer = Producer({**quiet_conf(bootstrap), "linger.ms": 20, "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    rng = random.Random(seed)
    for i in range(start, start + events):
        key = f"k{i % KEYS:02d}"
        value = json.dumps({"id": i, "key": key, "amount": round(rng.uniform(1, 100), 2)})
        while True:
            try:
                producer.produce(topic, value.encode(), key.encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError(f"could not deliver the input events to {topic}")


#: the job's state as the batch truth: key k's records carry seq 1..n, n its input events
EXPECTED_SEQ = ("SELECT key, unnest(range(1, count(*) + 1)) AS seq FROM input GROUP BY key")


@dataclass
class KafkaAudit:
    """What a consumer of the output topic saw: ``report`` audits the ids against the input
    topic, ``state`` the (key, seq) pairs against the batch truth :data:`EXPECTED_SEQ`."""

    isolation_level: str
    report: VerifyReport
    state: VerifyReport

    @property
    def seq_errors(self) -> int:
        """(key, seq) pairs missing, repeated or unexpected: state applied wrongly."""
        s = self.state
        return s.missing.count + s.duplicated.count + s.unexpected.count

    @property
    def records(self) -> int:
        return self.report.found_rows

    @property
    def ok(self) -> bool:
        return self.report.ok and self.state.ok


def audit_output(bootstrap: str, input_topic: str, topic: str,
                 isolation_level: str = "read_committed") -> KafkaAudit:
    """``exactly verify`` on the output topic, read with ``isolation_level``: every input id
    once, and every key's running count (seq) 1..n exactly once."""
    source, target = KafkaLocation(bootstrap, input_topic), KafkaLocation(bootstrap, topic)
    ids = run_audit(AuditSpec(output=target, input=source, isolation=isolation_level))
    state = run_audit(AuditSpec(output=target, input=source, isolation=isolation_level,
                                keys=("key", "seq"), expect=EXPECTED_SEQ))
    return KafkaAudit(isolation_level, ids, state)


def chaos_schedule(epochs: int, crashes: int | None,
                   rng: random.Random | None) -> list[FaultSpec]:
    """Crash points at distinct epochs 1.., in protocol order for ``crashes=None`` (every
    driver point, the Kafka sink's ``kafka.in_transaction``, then ``in_write``), else
    ``crashes`` random points; at most ``epochs - 1`` of them."""
    points: list[str] = [p.value for p in DRIVER_POINTS] + [IN_TRANSACTION,
                                                            FaultPoint.IN_WRITE.value]
    if crashes is not None:
        assert rng is not None
        points = [rng.choice(points) for _ in range(crashes)]
    points = points[:max(epochs - 1, 1)]
    return [FaultSpec(point, epoch) for epoch, point in enumerate(points, start=1)]


@dataclass
class ChaosRun:
    attempts: list[Attempt]
    committed: KafkaAudit
    uncommitted: KafkaAudit
    broker_restarts: int = 0
    fired: list[str] = field(default_factory=list)
    #: the job's transactional id prefix
    prefix: str = ""


def run_chaos(bootstrap: str, workdir: Path, *, events: int, epochs: int, sink: str = "exactly",
              schedule: Sequence[FaultSpec], mode: str = "exactly_once",
              restart_broker: Callable[[], None] | None = None,
              restart_broker_after_epoch: int | None = None,
              on_line: Callable[[Attempt, dict], None] | None = None,
              on_start: Callable[[Attempt], None] | None = None,
              on_end: Callable[[Attempt], None] | None = None,
              checkpoint: str | None = None,
              env: dict[str, str] | None = None, writer: str = "start_query",
              publish_shares: int = 1) -> ChaosRun:
    """Produce the input, run the job under ``schedule`` until drained, audit the output.

    ``writer`` (``start_query`` | ``datasource``, for ``sink="exactly"``): where the sink
    commits, see :mod:`exactly.demos.kafka_job`.
    ``publish_shares``: the sink's ``exactly.kafka.publishShares``.
    ``checkpoint`` defaults to ``<workdir>/checkpoint`` (an ``s3a://`` URI puts it, and the
    sink's log and staging beside it, on object storage; ``env`` then carries the ``AWS_*``
    settings to the job). ``restart_broker`` is called once, in the first attempt that
    reports an epoch ``>= restart_broker_after_epoch`` after the schedule is exhausted (a
    broker crash while the job runs).
    """
    name = uuid.uuid4().hex[:8]
    input_topic, output_topic = f"in-{name}", f"out-{name}"
    create_topic(bootstrap, input_topic, 2)
    create_topic(bootstrap, output_topic, 2)
    produce_events(bootstrap, input_topic, events)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    command = [sys.executable, "-m", "exactly.demos.kafka_job", "--bootstrap", bootstrap,
               "--input", input_topic, "--output", output_topic,
               "--checkpoint", checkpoint or str(workdir / "checkpoint"), "--sink", sink,
               "--writer", writer, "--mode", mode,
               "--prefix", f"demo-{name}",
               "--max-offsets-per-trigger", str(math.ceil(events / epochs)),
               "--publish-shares", str(publish_shares)]
    restarts = 0

    def line(attempt: Attempt, event: dict) -> None:
        nonlocal restarts
        if on_line is not None:
            on_line(attempt, event)
        if (restart_broker is not None and restarts == 0 and event.get("event") == "epoch"
                and attempt.armed is None and restart_broker_after_epoch is not None
                and event["epoch"] >= restart_broker_after_epoch):
            restarts += 1
            restart_broker()

    attempts = run_with_crashes(command, schedule, env=env, on_line=line, on_start=on_start,
                                on_end=on_end, timeout=900)
    committed = audit_output(bootstrap, input_topic, output_topic, "read_committed")
    uncommitted = audit_output(bootstrap, input_topic, output_topic, "read_uncommitted")
    fired = [str((a.fired or {}).get("point")) for a in attempts if a.crashed]
    return ChaosRun(attempts, committed, uncommitted, restarts, fired, f"demo-{name}")


def run_demo(events: int, crashes: int, seed: int, workdir: Path,
             console: Console | None = None) -> DemoResult:
    """Same contract as :func:`exactly.demos.files.run_demo`, with Kafka input and output."""
    console = console or Console()
    epochs = max(2, min(20, math.ceil(events / 500)))
    schedule = chaos_schedule(epochs, crashes, random.Random(seed))
    planned = [s.render() for s in schedule]
    workdir.mkdir(parents=True, exist_ok=True)
    with broker_or_configured(workdir / "broker") as bootstrap:
        where = ("configured broker" if os.environ.get("EXACTLY_KAFKA_BOOTSTRAP")
                 else "a local broker started for the demo")
        console.print(f"[bold]exactly demo --sink kafka[/]: {events} events -> {epochs} epochs "
                      f"on {where} ({bootstrap}); {len(schedule)} crash(es) planned: "
                      + (", ".join(planned) or "none"))
        progress = ConsoleProgress(console)
        run = run_chaos(bootstrap, workdir / "job", events=events, epochs=epochs,
                        schedule=schedule, **progress.hooks())
    print_views(run, console)
    return DemoResult(run.attempts, run.committed.report, files=0, epochs_expected=epochs)


def print_views(run: ChaosRun, console: Console) -> None:
    """The read_committed and read_uncommitted views of the output, side by side."""
    table = Table(title="output topic as consumers see it")
    for column in ("consumer", "records", "distinct ids", "missing", "duplicated ids",
                   "state (seq) errors"):
        table.add_column(column)
    for audit in (run.committed, run.uncommitted):
        r = audit.report
        table.add_row(audit.isolation_level, str(audit.records),
                      str(r.expected_keys - r.missing.count + r.unexpected.count),
                      str(r.missing.count), str(r.duplicated.count), str(audit.seq_errors))
    console.print(table)
    console.print("read_uncommitted also shows records of transactions that were aborted "
                  "(a crash inside a publish); read_committed consumers never see them.")

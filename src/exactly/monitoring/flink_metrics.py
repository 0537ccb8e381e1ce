"""Prometheus metrics of a job under Flink's names, computed from its checkpoint history.

One collector for both endpoints: ``exactly run --metrics-port`` (:mod:`exactly.monitoring.
endpoint`) and ``exactly ui``'s ``/metrics`` (:mod:`exactly.monitoring.server`). Every value
is computed at scrape time from :func:`exactly.monitoring.overview.load` -- the history, the
restart history and the job's status file, the same source ``exactly checkpoints --json``
shows -- so the numbers survive driver restarts and agree with the CLI and the dashboard.

Names follow Flink's Prometheus reporter (``flink_<scope>_<name>``, labels ``job_id`` and
``job_name``; operator metrics add ``operator_name``), in Flink's units: milliseconds for
durations and timestamps, bytes for sizes. exactly's own metrics use the ``exactly_job_``
prefix with the same conventions. :data:`METRICS` lists every name with its meaning and
source (the docs' table and the Grafana dashboard's test read it).

Failure behaviour: a job whose overview cannot be computed is left out of a scrape (the
caller's source decides); a value the history does not hold (no completed checkpoint yet, a
source without a latest offset) is left out, never reported as 0.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exactly.monitoring.overview import Loaded

JOB = "flink_jobmanager_job_"
TASK = "flink_taskmanager_job_task_"
OPERATOR = "flink_taskmanager_job_task_operator_"
OWN = "exactly_job_"
#: seconds a per-second rate looks back, as Flink's meters (``MeterView``'s 60 s)
METER_S = 60.0
#: job states in which the job is over: Flink's uptime and downtime are -1 then
ENDED = ("stopped", "failed", "cancelled", "lost")


@dataclass(frozen=True)
class Spec:
    """One metric: its full name, what it measures, where the value comes from, and its
    labels besides ``job_id`` and ``job_name``. Every metric is a gauge: Flink's reporter
    exposes its counters (``numRecordsIn``...) as gauges too, without ``_total``."""

    name: str
    meaning: str
    source: str
    labels: tuple[str, ...] = ()


METRICS: tuple[Spec, ...] = (
    Spec(f"{JOB}lastCheckpointDuration", "end-to-end duration of the latest completed "
         "checkpoint (epoch), ms", "`epoch.duration_ms` (Spark's `triggerExecution`)"),
    Spec(f"{JOB}lastCheckpointSize", "bytes the latest completed checkpoint added (Flink: "
         "checkpointed size, incremental)", "`epoch.checkpoint.new_bytes`"),
    Spec(f"{JOB}lastCheckpointFullSize", "full checkpoint size on disk after it, bytes",
         "`epoch.checkpoint.full_bytes`"),
    Spec(f"{JOB}lastCompletedCheckpointId", "epoch id of the latest completed checkpoint",
         "`epoch.epoch`"),
    Spec(f"{JOB}lastCheckpointRestoreTimestamp", "when the job last restored from a "
         "checkpoint or savepoint (Unix ms); -1 if never", "`run` records that resume, "
         "`restore` records"),
    Spec(f"{JOB}numberOfCompletedCheckpoints", "completed checkpoints (epochs) in the history",
         "`counts.completed`"),
    Spec(f"{JOB}numberOfFailedCheckpoints", "failed checkpoints in the history",
         "`counts.failed` (`epoch_failed` records)"),
    Spec(f"{JOB}numberOfInProgressCheckpoints", "checkpoints in progress (0 or 1)",
         "`counts.in_progress` (an offsets entry without its commit)"),
    Spec(f"{JOB}totalNumberOfCheckpoints", "checkpoints triggered", "`counts.triggered`"),
    Spec(f"{JOB}numRestarts", "restarts after failures: of the query in its driver, of a "
         "new driver process (a tolerated failed checkpoint restarts the query too)",
         "`counts.restarts` (restart history)"),
    Spec(f"{JOB}uptime", "ms the job has been running without interruption: since its last "
         "query start; 0 while it is down, -1 once it ended", "`run` records, restart "
         "history, job status"),
    Spec(f"{JOB}downtime", "ms of the current outage (since the failure that stopped it); 0 "
         "while it runs, -1 once it ended", "restart history, job status"),
    Spec(f"{TASK}numRecordsIn", "rows read by the job's completed epochs in the history "
         "(an epoch replayed after a failure counts once; Flink's counter, as a gauge)",
         "sum of `epoch.rows_in`"),
    Spec(f"{TASK}numRecordsOut", "rows written by the job's completed epochs in the history",
         "sum of `epoch.rows_out`"),
    Spec(f"{TASK}numRecordsInPerSecond", "rows in per second over the last 60 s (the rows "
         "of the epochs that ended in it / 60, as Flink's meters: 0 once the job idles)",
         "`epoch.rows_in`, `epoch.end_at`"),
    Spec(f"{TASK}numRecordsOutPerSecond", "rows out per second, likewise", "`epoch.rows_out`, "
         "`epoch.end_at`"),
    Spec(f"{OPERATOR}pendingRecords", "records the source has not read yet: its latest "
         "offset minus the latest epoch's end offset, summed over partitions",
         "`epoch.sources[].latest_offset` minus `end_offset` (Spark's progress)",
         labels=("operator_name",)),
    Spec(f"{OPERATOR}KafkaSourceReader_KafkaConsumer_records_lag_max", "the most offsets "
         "behind latest of the source's partitions", "`epoch.sources[].metrics."
         "maxOffsetsBehindLatest` (Spark's Kafka source)", labels=("operator_name",)),
    Spec(f"{OWN}lastCheckpointSinkCommitDuration", "exactly's commit of the latest completed "
         "epoch: intent, commits, publish, ms", "`epoch.parts_ms.sink_commit` (the sink's "
         "commit log)"),
    Spec(f"{OWN}lastCheckpointSinkPreCommitDuration", "the slowest task's pre-commit of the "
         "latest completed epoch, ms", "`epoch.parts_ms.sink_pre_commit`"),
    Spec(f"{OWN}lastCheckpointPartDuration", "each part of the latest completed epoch's "
         "duration, ms (`part`: planning, source_offsets, source_batch, offsets_log, "
         "processing, sink_pre_commit, sink_commit, commit_log)", "`epoch.parts_ms`",
         labels=("part",)),
    Spec(f"{OWN}lastCheckpointRecordsIn", "rows in of the latest completed epoch",
         "`epoch.rows_in`"),
    Spec(f"{OWN}lastCheckpointRecordsOut", "rows out of the latest completed epoch",
         "`epoch.rows_out`"),
    Spec(f"{OWN}lastCheckpointCompletionTimestamp", "when the latest completed epoch ended "
         "(Unix ms); alert on `time() * 1000 - this`", "`epoch.end_at`"),
    Spec(f"{OWN}numberOfRestoredCheckpoints", "restores: restarts resuming from the "
         "checkpoint and savepoint restores", "`counts.restored`"),
    Spec(f"{OWN}numberOfSavepoints", "savepoints taken", "`counts.savepoints`"),
    Spec(f"{OWN}spareDriverReady", "1 while a warm spare driver is ready to take the job "
         "over at the next restart, 0 while the job runs without one (absent once it ended)",
         "`spare.state`"),
)

_BY_NAME = {spec.name: spec for spec in METRICS}


def metric_names() -> set[str]:
    """Every metric name the collector can expose."""
    return {spec.name for spec in METRICS}


class FlinkCollector:
    """A prometheus_client collector of every job ``source()`` returns as ``(job_id,
    loaded)``; ``now`` is the clock of uptime and downtime (seconds)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, Loaded]]],
                 now: Callable[[], float] = time.time) -> None:
        self.source = source
        self.now = now

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for spec in METRICS:
            labels = ["job_id", "job_name", *spec.labels]
            short = spec.name.rsplit("_", 1)[-1]
            families[spec.name] = GaugeMetricFamily(spec.name, f"{short}: {spec.meaning}",
                                                    labels=labels)
        for job_id, loaded in self.source():
            name = loaded.overview.name or loaded.overview.checkpoint.rstrip("/").rsplit(
                "/", 1)[-1]
            for metric, extra, value in job_values(loaded, self.now()):
                families[metric].add_metric([job_id, name, *extra], value)
        yield from families.values()


def job_values(loaded: Loaded, now: float) -> list[tuple[str, tuple[str, ...], float]]:
    """``(metric name, extra label values, value)`` of one job at time ``now``."""
    view = loaded.overview
    found: list[tuple[str, tuple[str, ...], float]] = []

    def put(metric: str, value: float | None, *extra: str) -> None:
        assert metric in _BY_NAME, metric
        if value is not None:
            found.append((metric, extra, float(value)))

    counts = view.counts
    put(f"{JOB}numberOfCompletedCheckpoints", counts["completed"])
    put(f"{JOB}numberOfFailedCheckpoints", counts["failed"])
    put(f"{JOB}numberOfInProgressCheckpoints", counts["in_progress"])
    put(f"{JOB}totalNumberOfCheckpoints", counts["triggered"])
    put(f"{JOB}numRestarts", counts["restarts"])
    put(f"{OWN}numberOfRestoredCheckpoints", counts["restored"])
    put(f"{OWN}numberOfSavepoints", counts["savepoints"])
    if view.spare is not None:
        put(f"{OWN}spareDriverReady", 1.0 if view.spare["state"] == "ready" else 0.0)
    uptime, downtime = up_and_down(loaded, now)
    put(f"{JOB}uptime", uptime)
    put(f"{JOB}downtime", downtime)
    restore = view.latest.get("restore")
    put(f"{JOB}lastCheckpointRestoreTimestamp",
        round(restore["at"] * 1000) if restore and restore.get("at") is not None else -1)

    epochs = completed_epochs(loaded.records)
    put(f"{TASK}numRecordsIn", sum(r.get("rows_in") or 0 for r in epochs))
    put(f"{TASK}numRecordsOut", sum(r.get("rows_out") or 0 for r in epochs))
    latest = view.latest.get("completed")
    if latest is None:
        return found
    put(f"{JOB}lastCheckpointDuration", latest.get("duration_ms"))
    put(f"{JOB}lastCheckpointSize", latest.get("new_bytes"))
    put(f"{JOB}lastCheckpointFullSize", latest.get("full_bytes"))
    put(f"{JOB}lastCompletedCheckpointId", latest["epoch"])
    put(f"{OWN}lastCheckpointRecordsIn", latest.get("rows_in"))
    put(f"{OWN}lastCheckpointRecordsOut", latest.get("rows_out"))
    end_at = latest.get("end_at")
    put(f"{OWN}lastCheckpointCompletionTimestamp",
        round(end_at * 1000) if end_at is not None else None)
    recent = [r for r in epochs if now - METER_S < (r.get("end_at") or 0.0) <= now]
    put(f"{TASK}numRecordsInPerSecond",
        sum(r.get("rows_in") or 0 for r in recent) / METER_S)
    put(f"{TASK}numRecordsOutPerSecond",
        sum(r.get("rows_out") or 0 for r in recent) / METER_S)
    record: dict[str, Any] = next(
        (r for r in reversed(epochs) if r.get("epoch") == latest["epoch"]), {})
    parts = record.get("parts_ms") or {}
    put(f"{OWN}lastCheckpointSinkCommitDuration", parts.get("sink_commit"))
    put(f"{OWN}lastCheckpointSinkPreCommitDuration", parts.get("sink_pre_commit"))
    for part, millis in parts.items():
        put(f"{OWN}lastCheckpointPartDuration", millis, str(part))
    for index, source in enumerate(record.get("sources") or []):
        # Spark's description of a Python source ends with the object's hash, new in every
        # driver: without it the label stays the same across restarts
        operator = re.sub(r"@[0-9a-f]+$", "", str(source.get("description") or "")) or (
            f"source-{index}")
        put(f"{OPERATOR}pendingRecords",
            pending_records(source.get("latest_offset"), source.get("end_offset")), operator)
        behind = (source.get("metrics") or {}).get("maxOffsetsBehindLatest")
        put(f"{OPERATOR}KafkaSourceReader_KafkaConsumer_records_lag_max",
            _number(behind), operator)
    return found


def completed_epochs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history's ``epoch`` records, one per epoch (the last one recorded: an epoch
    replayed after a failure is recorded again), in order of their end."""
    last: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.get("kind") == "epoch" and isinstance(record.get("epoch"), int):
            last[record["epoch"]] = record
    return sorted(last.values(), key=lambda r: (r.get("end_at") or 0.0, r["epoch"]))


def up_and_down(loaded: Loaded, now: float) -> tuple[float, float]:
    """Flink's ``uptime`` and ``downtime`` in ms at ``now``: a running job is up since its
    last query start (the history's last ``run`` record), unless a restart-history failure
    came after it (then it is down since that failure, or its ``since``); a job that ended
    is -1/-1; one starting for the first time is 0/0."""
    view = loaded.overview
    if view.status in ENDED:
        return -1.0, -1.0
    starts = [float(r["at"]) for r in loaded.records if r.get("kind") == "run"]
    failures = [float(e.get("since") or e["at"]) for e in view.restarts
                if e.get("event") == "failure" and e.get("at") is not None
                and e.get("action") != "standby"]
    started = max(starts, default=None)
    failed = max(failures, default=None)
    if failed is not None and (started is None or failed > started):
        return 0.0, max(0.0, round((now - failed) * 1000))
    if started is None or view.status != "running":
        return 0.0, 0.0
    return max(0.0, round((now - started) * 1000)), 0.0


def pending_records(latest: Any, end: Any) -> float | None:
    """Latest minus end offset, summed over the numbers both hold at the same place
    (Spark's Kafka offsets ``{"topic": {"0": 42}}``, a plain number, any nesting); None
    when there is nothing to compare (a source that reports no latest offset)."""
    total = _difference(_parsed(latest), _parsed(end))
    return None if total is None else max(0.0, total)


def _difference(latest: Any, end: Any) -> float | None:
    if isinstance(latest, dict) and isinstance(end, dict):
        parts = [_difference(latest[k], end[k]) for k in latest if k in end]
        found = [p for p in parts if p is not None]
        return sum(found) if found else None
    a, b = _number(latest), _number(end)
    return None if a is None or b is None else a - b


def _parsed(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None

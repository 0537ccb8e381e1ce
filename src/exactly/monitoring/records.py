"""The records of a job's checkpoint history, built from what Spark and the sinks report.

Kinds (every record also has ``at``, a Unix time, and ``query_id``):

``run``
    A start of the query: Spark's ``run_id``, the epoch it resumes after, the job's
    checkpoint configuration, the sink, the Spark and exactly versions.
``epoch``
    A completed epoch (checkpoint): its id, trigger and end times, end-to-end duration and
    its parts, rows in and out, rates, state per operator, checkpoint size on disk (new this
    epoch and full), the sink's commit statistics.
``epoch_failed``
    An epoch that did not complete: its id, the cause (one line) and the failure's kind
    (``query``, ``checkpoint-timeout``, ``process``).
``run_end``
    The query stopped (``outcome``: ``stopped`` or ``failed``) after its last epoch.
``savepoint`` / ``restore``
    A savepoint taken of this checkpoint; a restore into it (from a savepoint or a retained
    checkpoint).
"""

from __future__ import annotations

import os
from dataclasses import fields
from datetime import datetime
from enum import Enum
from typing import Any

#: Spark's parts of an epoch (``durationMs``) under the names the history uses
SPARK_PARTS = {"queryPlanning": "planning", "latestOffset": "source_offsets",
               "getBatch": "source_batch", "walCommit": "offsets_log",
               "commitOffsets": "commit_log"}
#: the fields of the sink's completion record (its commit log) an epoch record keeps
SINK_STATS = ("rows", "handles", "already_committed", "pre_commit_ms", "commit_ms", "run_id")
#: state metrics that measure bytes on disk or in memory, per backend
_STATE_BYTES = ("stateOnCurrentVersionSizeBytes", "rocksdbTotalSizeSstFiles",
                "rocksdbSstFileSize")


def parse_spark_time(text: str | None) -> float | None:
    """Spark's progress ``timestamp`` (ISO 8601, UTC, ``Z``) as a Unix time."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ran(progress: dict[str, Any]) -> bool:
    """Whether a progress report is of an epoch that ran (idle reports carry the next
    epoch's id and no ``addBatch`` time)."""
    return "addBatch" in (progress.get("durationMs") or {})


def state_operators(progress: dict[str, Any], backend: str | None) -> list[dict[str, Any]]:
    """One entry per stateful operator: rows, bytes, partitions, backend."""
    found = []
    for index, op in enumerate(progress.get("stateOperators") or []):
        metrics = op.get("customMetrics") or {}
        state_bytes = next((int(metrics[k]) for k in _STATE_BYTES if k in metrics), None)
        found.append({
            "index": index, "operator": op.get("operatorName"),
            "rows": op.get("numRowsTotal"), "rows_updated": op.get("numRowsUpdated"),
            "rows_removed": op.get("numRowsRemoved"),
            "rows_dropped_by_watermark": op.get("numRowsDroppedByWatermark"),
            "memory_bytes": op.get("memoryUsedBytes"), "state_bytes": state_bytes,
            "commit_ms": op.get("commitTimeMs"), "partitions": op.get("numStateStoreInstances"),
            "backend": backend,
        })
    return found


def epoch_record(progress: dict[str, Any], *, ended_at: float,
                 completion: dict[str, Any] | None, new_bytes: int | None,
                 full_bytes: int | None, backend: str | None) -> dict[str, Any]:
    """The ``epoch`` record of a completed epoch from Spark's progress report, the sink's
    completion record (or None for a sink without a commit log) and the checkpoint's sizes.

    ``parts_ms`` splits ``duration_ms`` (Spark's ``triggerExecution``): planning, the
    sources' offsets and batch, the offsets log, processing (the tasks: read, transform,
    state, write), the sink's pre-commit (the slowest task's) and commit (both from the
    sink's own log) and Spark's commit log; ``state_commit_ms`` is the tasks' state-store
    commit time, summed."""
    durations = {k: int(v) for k, v in (progress.get("durationMs") or {}).items()}
    sink_pre_commit = _millis(completion, "pre_commit_ms")
    sink_commit = _millis(completion, "commit_ms")
    parts: dict[str, float] = {name: durations[key] for key, name in SPARK_PARTS.items()
                               if key in durations}
    add_batch = durations.get("addBatch")
    if add_batch is not None:
        parts["processing"] = max(0.0, round(
            add_batch - (sink_pre_commit or 0.0) - (sink_commit or 0.0), 3))
    if sink_pre_commit is not None:
        parts["sink_pre_commit"] = round(sink_pre_commit, 3)
    if sink_commit is not None:
        parts["sink_commit"] = round(sink_commit, 3)
    state = state_operators(progress, backend)
    sink = (progress.get("sink") or {})
    record: dict[str, Any] = {
        "kind": "epoch", "at": ended_at, "status": "completed",
        "epoch": int(progress["batchId"]),
        "query_id": progress.get("id"), "spark_run_id": progress.get("runId"),
        "trigger_at": parse_spark_time(progress.get("timestamp")), "end_at": ended_at,
        "duration_ms": durations.get("triggerExecution"),
        "parts_ms": parts,
        "state_commit_ms": sum(op["commit_ms"] or 0 for op in state) if state else None,
        "rows_in": progress.get("numInputRows"),
        "rows_out": sink.get("numOutputRows") if sink.get("numOutputRows", -1) >= 0 else None,
        "input_rate": _finite(progress.get("inputRowsPerSecond")),
        "processing_rate": _finite(progress.get("processedRowsPerSecond")),
        "state": state,
        "checkpoint": {"new_bytes": new_bytes, "full_bytes": full_bytes},
        "sources": [{"description": s.get("description"), "rows": s.get("numInputRows"),
                     "end_offset": s.get("endOffset"), "latest_offset": s.get("latestOffset"),
                     "metrics": s.get("metrics") or {}}
                    for s in progress.get("sources") or []],
    }
    if completion is not None:
        record["sink"] = {k: completion.get(k) for k in
                          SINK_STATS}
        if record["rows_out"] is None:
            record["rows_out"] = completion.get("rows")
    return record


def failed_epoch(checkpoint: str | os.PathLike[str], epoch: int, *, failure: str,
                 cause: str, at: float, query_id: str | None = None,
                 trigger_at: float | None = None) -> dict[str, Any]:
    """The ``epoch_failed`` record of ``epoch`` of ``checkpoint``: ``failure`` is ``query``
    (the query failed), ``checkpoint-timeout`` (the supervisor cancelled it) or ``process``
    (the driver died); ``cause`` is one line. ``trigger_at`` defaults to when Spark logged
    the epoch's offsets (None when it had not)."""
    from exactly.checkpoint.spark_files import offsets_logged_at

    if trigger_at is None:
        trigger_at = offsets_logged_at(os.fspath(checkpoint), epoch)
    return {"kind": "epoch_failed", "at": at, "epoch": epoch, "failure": failure,
            "cause": cause, "trigger_at": trigger_at, "query_id": query_id}


def _millis(completion: dict[str, Any] | None, key: str) -> float | None:
    value = None if completion is None else completion.get(key)
    return None if value is None else float(value)


def config_summary(config: Any) -> dict[str, Any]:
    """A :class:`~exactly.config.CheckpointConfig` as the history keeps it: every setting as
    given (enum members as their values), plus the interval and the epoch target in
    seconds."""
    summary = {f.name: _json_value(getattr(config, f.name)) for f in fields(config) if f.init}
    summary["interval_s"] = config.interval_seconds
    summary["target_epoch_s"] = config.epoch_target_seconds
    return summary


def _json_value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None

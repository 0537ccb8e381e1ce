"""Every name exactly writes under a checkpoint (and beside a file sink's output), once.

A checkpoint (a local directory or ``s3a://bucket/prefix``) holds::

    metadata, offsets/, commits/, state/, sources/   Spark's own (exactly.checkpoint.spark_files)
    exactly-sink/        the commit log and lease of sinks without a directory of their own
    exactly-job/         what ``exactly run`` and the recorder keep about the job:
      job.json             the live run, its state and heartbeat (exactly.checkpoint.status)
      control/requests/    commands to the driver; control/answers/ its answers
      restarts.jsonl       the restart log on a POSIX directory; restarts/ (one object an
                           entry) on S3 (exactly.checkpoint.restarts)
      history/             the checkpoint history (exactly.checkpoint.history)
      driver-exit.json     the cause a driver left for its launcher
      admission.json       the pacer's admission of the next epoch
      restore.json         the savepoint restore that made this checkpoint
      retained/            a retained checkpoint a restore takes over
      operators.json       the job's stateful operators (savepoints)
      sink-leases.json     where the query's sinks keep their leases, for the driver to
                           release them when a run ends (exactly.checkpoint.sink_leases)

The file sink keeps its commit log beside its output, in ``<output>/_exactly``.
"""

from __future__ import annotations

from collections.abc import Mapping

from exactly.options import LOG_DIR

SINK_LOG_DIR = "exactly-sink"
JOB_DIR = "exactly-job"
OUTPUT_LOG_DIR = "_exactly"
JOB_STATUS = "job.json"
REQUESTS = "control/requests"
ANSWERS = "control/answers"
RESTART_LOG = "restarts.jsonl"
RESTART_OBJECTS = "restarts"
HISTORY_DIR = "history"
DRIVER_EXIT = "driver-exit.json"
ADMISSION = "admission.json"
RESTORE_MARKER = "restore.json"
RETAINED_DIR = "retained"
SINK_LEASES = "sink-leases.json"


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for a local path or a URI alike."""
    return "/".join([location.rstrip("/"), *parts])


def sink_log_location(checkpoint: str) -> str:
    """``<checkpoint>/exactly-sink``: the default commit log of a sink under ``checkpoint``
    (an ``s3a://`` checkpoint keeps it on S3 too)."""
    return join(checkpoint, SINK_LOG_DIR)


def with_sink_log_dir(checkpoint: str | None,
                      options: Mapping[str, str] | None) -> dict[str, str]:
    """``options`` plus ``exactly.logDir = <checkpoint>/exactly-sink`` unless they name a
    log directory of their own (the sinks that keep theirs beside their output ignore it)."""
    merged = dict(options or {})
    if checkpoint:
        if checkpoint.startswith("file:"):  # file:///p and file:/p are the local path /p
            checkpoint = "/" + checkpoint[len("file:"):].lstrip("/")
        merged.setdefault(LOG_DIR, sink_log_location(checkpoint))
    return merged

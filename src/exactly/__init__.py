"""exactly: Flink's end-to-end exactly-once model for PySpark Structured Streaming.

The names below are imported lazily, so Spark's Python workers that unpickle a sink do
not pay for the whole package.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from exactly.version import __version__  # noqa: F401  (re-exported)

_EXPORTS = {
    "CheckpointConfig": "exactly.config",
    "Mode": "exactly.config",
    "StateBackend": "exactly.config",
    "start_query": "exactly.ops.query",
    "ExactlyQuery": "exactly.ops.query",
    "spark_session": "exactly.spark.session",
    "register": "exactly.spark.formats",
    "verify": "exactly.auditor",
    "TwoPhaseCommitSink": "exactly.protocol.contract",
    "Handle": "exactly.protocol.contract",
    "Job": "exactly.ops.job",
    "run_job": "exactly.ops.driver",
    "restart_strategy": "exactly.ops.restart",
    "FixedDelay": "exactly.ops.restart",
    "FailureRate": "exactly.ops.restart",
    "ExponentialDelay": "exactly.ops.restart",
    "NoRestart": "exactly.ops.restart",
    "uid": "exactly.savepoints.operators",
    "TransientError": "exactly.errors",
}

__all__ = [
    "CheckpointConfig",
    "ExactlyQuery",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
    "Handle",
    "Job",
    "Mode",
    "NoRestart",
    "StateBackend",
    "TransientError",
    "TwoPhaseCommitSink",
    "register",
    "restart_strategy",
    "run_job",
    "spark_session",
    "start_query",
    "uid",
    "verify",
]

if TYPE_CHECKING:
    from exactly.auditor import verify
    from exactly.config import CheckpointConfig, Mode, StateBackend
    from exactly.errors import TransientError
    from exactly.ops.driver import run_job
    from exactly.ops.job import Job
    from exactly.ops.query import ExactlyQuery, start_query
    from exactly.ops.restart import (
        ExponentialDelay,
        FailureRate,
        FixedDelay,
        NoRestart,
        restart_strategy,
    )
    from exactly.protocol.contract import Handle, TwoPhaseCommitSink
    from exactly.savepoints.operators import uid
    from exactly.spark.formats import register
    from exactly.spark.session import spark_session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'exactly' has no attribute {name!r}")
    return getattr(import_module(module), name)

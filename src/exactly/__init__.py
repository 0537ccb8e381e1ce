"""exactly: Flink's end-to-end exactly-once model for PySpark Structured Streaming.

The names below are imported lazily, so Spark's Python workers that unpickle a sink do
not pay for the whole package.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointConfig": "exactly.config",
    "Mode": "exactly.config",
    "StateBackend": "exactly.config",
    "start_query": "exactly.spark.runner",
    "ExactlyQuery": "exactly.spark.runner",
    "spark_session": "exactly.spark.session",
    "register": "exactly.spark.formats",
    "verify": "exactly.audit",
    "TwoPhaseCommitSink": "exactly.protocol.contract",
    "Handle": "exactly.protocol.contract",
}

__all__ = [
    "CheckpointConfig",
    "ExactlyQuery",
    "Handle",
    "Mode",
    "StateBackend",
    "TwoPhaseCommitSink",
    "register",
    "spark_session",
    "start_query",
    "verify",
]

if TYPE_CHECKING:
    from exactly.audit import verify
    from exactly.config import CheckpointConfig, Mode, StateBackend
    from exactly.protocol.contract import Handle, TwoPhaseCommitSink
    from exactly.spark.formats import register
    from exactly.spark.runner import ExactlyQuery, start_query
    from exactly.spark.session import spark_session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'exactly' has no attribute {name!r}")
    return getattr(import_module(module), name)

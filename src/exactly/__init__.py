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
    "start_query": "exactly.runner",
    "ExactlyQuery": "exactly.runner",
    "spark_session": "exactly.session",
    "register": "exactly.datasources",
    "verify": "exactly.audit",
    "TwoPhaseCommitSink": "exactly.sinks.twophase",
    "Handle": "exactly.sinks.twophase",
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
    from exactly.datasources import register
    from exactly.runner import ExactlyQuery, start_query
    from exactly.session import spark_session
    from exactly.sinks.twophase import Handle, TwoPhaseCommitSink


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'exactly' has no attribute {name!r}")
    return getattr(import_module(module), name)

"""Error types a user can catch. Every message names the cause and the fix."""

from __future__ import annotations


class ExactlyError(Exception):
    """Base class of every error raised by exactly."""


class ConfigError(ExactlyError, ValueError):
    """A checkpoint or sink setting is invalid; raised before anything runs."""


class NotSupportedYetError(ConfigError):
    """A setting from Flink's vocabulary that exactly declares but does not implement yet."""


class SourceNotReplayableError(ExactlyError):
    """An exactly-once query reads a source that cannot replay an epoch."""


class FencedError(ExactlyError):
    """Another live instance owns this query's sink; this instance must not commit."""


class OwnershipError(ExactlyError):
    """The sink's target already belongs to a different streaming query."""


class DataLossError(ExactlyError):
    """A pre-commit named by a durable commit intent can no longer be committed.

    This is the one failure that means lost data (Flink: a failing ``recoverAndCommit``):
    the protocol never raises it for a crash; it means someone removed staged data.
    """


class MalformedRecordError(ExactlyError):
    """An input row cannot be parsed; names the file and the line."""

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


class CorruptFileError(ExactlyError):
    """A protocol file exists but cannot be read; names the file, the problem and the repair."""

    def __init__(self, path: str, problem: str, repair: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.repair = repair
        super().__init__(f"{self.path} {problem}. Safe repair: {repair}.")

    def __reduce__(self):  # picklable across processes despite the 3-argument constructor
        return (type(self), (self.path, self.problem, self.repair))


class CorruptCheckpointFileError(CorruptFileError):
    """A file of Spark's own checkpoint (``metadata``, ``offsets/N``, ``commits/N``, a
    ``.crc``) is damaged; found before Spark fails on it without naming it."""


class ReplannedEpochError(ExactlyError):
    """Spark asks to commit an epoch number that the sink already committed, but over
    different input positions (e.g. after ``offsets/N`` was deleted and Spark re-planned N).

    Discarding the call would lose the new part of the input and committing it would
    duplicate the shared part, so the sink refuses and commits nothing; the message names
    both positions and the repair.
    """


class SavepointError(ExactlyError):
    """A savepoint cannot be used as asked: incomplete, corrupt, from a newer exactly, of
    another job, or not restorable into this job (the message names which and the fix)."""


class AuditInputError(ConfigError):
    """``exactly verify`` cannot read what it was asked to compare: a table, topic, file,
    column or query that does not exist or does not parse (the CLI exits with 2)."""


class JobBuildError(ExactlyError):
    """``build(spark)`` of a job file raised: an error in the job (or what it reads while it
    builds) that a restart does not fix, so ``exactly run`` fails at once and says why.
    Raise :class:`TransientError` from the original error for one a restart can fix."""


class TransientError(ExactlyError):
    """Raise it (``raise TransientError("...") from exc``) in a job's ``build(spark)`` for a
    failure that a restart can fix (a service that is not up yet): ``exactly run`` then
    starts the driver again as its restart strategy says, instead of failing the job."""

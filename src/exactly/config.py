"""Checkpoint configuration in Flink's vocabulary, validated before anything runs.

``CheckpointConfig`` holds every option the seeds name. Options exactly implements are
applied to the Spark query by :mod:`exactly.spark.runner`; options it declares but does not
implement yet raise :class:`~exactly.errors.NotSupportedYetError` when set to anything but
their default, so nothing is ever silently ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from exactly.errors import ConfigError, NotSupportedYetError


class Mode(str, Enum):
    """Delivery guarantee of a query's sink."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class StateBackend(str, Enum):
    """Where keyed state lives between epochs (Spark state store providers)."""

    HASHMAP = "hashmap"
    ROCKSDB = "rocksdb"


class ExternalizedCleanup(str, Enum):
    """What happens to the checkpoint when the query is cancelled."""

    RETAIN_ON_CANCELLATION = "retain_on_cancellation"
    DELETE_ON_CANCELLATION = "delete_on_cancellation"


STATE_STORE_PROVIDERS = {
    StateBackend.HASHMAP: (
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    ),
    StateBackend.ROCKSDB: (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?|m|min|minutes?|h|hours?)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0,
                 "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0,
                 "hours": 3600.0}


def parse_duration(value: str | float | int, *, name: str) -> float:
    """Parse ``"500ms"``, ``"2s"``, ``"1 min"`` or a number of seconds into seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration such as '2s', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(
                f"{name}: cannot read {value!r} as a duration; write it like '500ms', '2s' or "
                "'1min'"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds < 0:
        raise ConfigError(f"{name}: a duration cannot be negative, got {value!r}")
    return seconds


E = TypeVar("E", bound=Enum)


def parse_enum(enum_type: type[E], value: object, name: str) -> E:
    """``value`` as a member of ``enum_type``; a ConfigError lists the allowed values."""
    try:
        return enum_type(value.value if isinstance(value, Enum) else str(value).lower())
    except ValueError:
        allowed = " | ".join(str(m.value) for m in enum_type)
        raise ConfigError(f"{name}: {value!r} is not one of {allowed}") from None


@dataclass(frozen=True, init=False)
class CheckpointConfig:
    """How often and how a query checkpoints, in the seeds' (Flink's) names.

    Parameters
    ----------
    interval:
        Time between epoch starts (Spark's processing-time trigger), e.g. ``"2s"``.
    mode:
        ``exactly_once`` (sinks commit with the checkpoint) or ``at_least_once`` (sinks make
        data visible inside the task; a replay after a crash may duplicate).
    storage:
        ``"memory"`` (a temporary directory removed when the process exits: nothing survives
        a crash of the driver's machine) or a file-system path/URI that holds Spark's
        checkpoint (offset log, commit log, state).
    timeout, min_pause_between_checkpoints, tolerable_failed_checkpoints,
    aligned_checkpoint_timeout:
        Declared, not implemented yet: any value but the default is refused.
    max_concurrent_checkpoints:
        Always 1 on Spark: one epoch runs at a time.
    externalized_cleanup:
        ``retain_on_cancellation`` keeps the checkpoint when the query is cancelled;
        ``delete_on_cancellation`` removes it.
    unaligned:
        Flink's unaligned checkpoints. On Spark an epoch is a bulk-synchronous step, so the
        goal (bounded checkpoint time under backpressure) is met by epoch sizing; not
        implemented yet, but invalid combinations are reported first.
    state_backend:
        ``hashmap`` (Spark's HDFS-backed in-memory store) or ``rocksdb``.
    incremental:
        RocksDB changelog checkpointing (incremental checkpoints). Needs ``rocksdb``.
    checkpoints_after_tasks_finish:
        A final checkpoint when bounded input ends. Spark always commits the last epoch of
        a bounded (``availableNow``) run, so only ``True`` is accepted.

    Raises
    ------
    ConfigError
        On an invalid value or combination, naming the fix.
    NotSupportedYetError
        When an option that is not implemented yet is set to a non-default value.
    """

    interval: str | float
    mode: Mode
    storage: str
    timeout: str | float | None
    min_pause_between_checkpoints: str | float
    max_concurrent_checkpoints: int
    externalized_cleanup: ExternalizedCleanup
    tolerable_failed_checkpoints: int
    unaligned: bool
    aligned_checkpoint_timeout: str | float | None
    state_backend: StateBackend
    incremental: bool
    checkpoints_after_tasks_finish: bool
    interval_seconds: float = field(init=False, repr=False)

    def __init__(self, interval: str | float = "1s",
                 mode: Mode | str = Mode.EXACTLY_ONCE,
                 storage: str = "memory",
                 timeout: str | float | None = None,
                 min_pause_between_checkpoints: str | float = 0,
                 max_concurrent_checkpoints: int = 1,
                 externalized_cleanup: ExternalizedCleanup | str = (
                     ExternalizedCleanup.RETAIN_ON_CANCELLATION),
                 tolerable_failed_checkpoints: int = 0,
                 unaligned: bool = False,
                 aligned_checkpoint_timeout: str | float | None = None,
                 state_backend: StateBackend | str = StateBackend.HASHMAP,
                 incremental: bool = False,
                 checkpoints_after_tasks_finish: bool = True) -> None:
        # strings are accepted on the way in; the attributes are always the enum members
        set_ = object.__setattr__
        set_(self, "interval", interval)
        set_(self, "mode", parse_enum(Mode, mode, "mode"))
        set_(self, "storage", storage)
        set_(self, "timeout", timeout)
        set_(self, "min_pause_between_checkpoints", min_pause_between_checkpoints)
        set_(self, "max_concurrent_checkpoints", max_concurrent_checkpoints)
        set_(self, "externalized_cleanup",
             parse_enum(ExternalizedCleanup, externalized_cleanup, "externalized_cleanup"))
        set_(self, "tolerable_failed_checkpoints", tolerable_failed_checkpoints)
        set_(self, "unaligned", unaligned)
        set_(self, "aligned_checkpoint_timeout", aligned_checkpoint_timeout)
        set_(self, "state_backend", parse_enum(StateBackend, state_backend, "state_backend"))
        set_(self, "incremental", incremental)
        set_(self, "checkpoints_after_tasks_finish", checkpoints_after_tasks_finish)
        set_(self, "interval_seconds", parse_duration(interval, name="interval"))
        if self.interval_seconds <= 0:
            raise ConfigError("interval: must be greater than 0, e.g. '1s'")
        if not isinstance(self.storage, str) or not self.storage.strip():
            raise ConfigError("storage: give 'memory' or a directory path/URI for checkpoints")
        self._validate_combinations()
        self._refuse_unimplemented()

    # -- validation -----------------------------------------------------------------
    def _validate_combinations(self) -> None:
        if self.max_concurrent_checkpoints != 1:
            raise ConfigError(
                "max_concurrent_checkpoints: Spark runs one epoch (checkpoint) at a time; "
                f"got {self.max_concurrent_checkpoints}, set it to 1"
            )
        if self.unaligned and self.mode is not Mode.EXACTLY_ONCE:
            raise ConfigError(
                "unaligned checkpoints need mode='exactly_once' (in at_least_once mode "
                "barriers are never aligned); set mode='exactly_once' or unaligned=False"
            )
        if self.aligned_checkpoint_timeout is not None and not self.unaligned:
            raise ConfigError(
                "aligned_checkpoint_timeout only applies to unaligned checkpoints; set "
                "unaligned=True or drop aligned_checkpoint_timeout"
            )
        if self.incremental and self.state_backend is not StateBackend.ROCKSDB:
            raise ConfigError(
                "incremental checkpoints need state_backend='rocksdb' (the hashmap backend "
                "always writes full snapshots); set state_backend='rocksdb' or "
                "incremental=False"
            )
        if self.tolerable_failed_checkpoints < 0:
            raise ConfigError("tolerable_failed_checkpoints: must be 0 or more")

    def _refuse_unimplemented(self) -> None:
        def refuse(option: str, value: object, why: str) -> None:
            raise NotSupportedYetError(
                f"{option}={value!r} is not supported yet: {why}. Remove the option to use "
                "the default."
            )

        if self.timeout is not None:
            refuse("timeout", self.timeout, "epochs are not cancelled after a time limit")
        if parse_duration(self.min_pause_between_checkpoints,
                          name="min_pause_between_checkpoints") != 0:
            refuse("min_pause_between_checkpoints", self.min_pause_between_checkpoints,
                   "the trigger starts the next epoch as soon as the interval allows")
        if self.tolerable_failed_checkpoints != 0:
            refuse("tolerable_failed_checkpoints", self.tolerable_failed_checkpoints,
                   "a failed epoch fails the query, which the runner restarts")
        if self.unaligned:
            refuse("unaligned", True, "size epochs with the source's maxFilesPerTrigger / "
                   "maxRowsPerTrigger option instead")
        if not self.checkpoints_after_tasks_finish:
            refuse("checkpoints_after_tasks_finish", False,
                   "Spark always commits the final epoch of a bounded run")

    # -- derived values -------------------------------------------------------------
    @property
    def is_memory_storage(self) -> bool:
        return self.storage.strip().lower() == "memory"

    @property
    def state_store_provider(self) -> str:
        return STATE_STORE_PROVIDERS[self.state_backend]

    def spark_conf(self) -> dict[str, str]:
        """SQL settings that the query needs (state backend, changelog checkpointing)."""
        conf = {"spark.sql.streaming.stateStore.providerClass": self.state_store_provider}
        if self.state_backend is StateBackend.ROCKSDB:
            conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = (
                "true" if self.incremental else "false"
            )
        return conf

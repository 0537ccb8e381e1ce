"""Checkpoint configuration in Flink's vocabulary, validated before anything runs.

``CheckpointConfig`` holds every option the seeds name. The query-level ones (interval,
mode, storage, state backend) are applied by :mod:`exactly.ops.query`; the policies that
act between and around epochs (timeout, min pause, tolerable failed checkpoints, epoch
sizing) are enforced by the job supervisor (:mod:`exactly.ops.supervisor`, ``exactly run``);
``start_query`` refuses a config that sets them, so none is silently ignored. The one
option exactly cannot honour on Spark (``checkpoints_after_tasks_finish=False``) raises
:class:`~exactly.errors.NotSupportedYetError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, TypeVar

from exactly.errors import ConfigError, NotSupportedYetError


class Mode(str, Enum):
    """Delivery guarantee of a query's sink."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class StateBackend(str, Enum):
    """Where keyed state lives between epochs (Spark state store providers)."""

    HASHMAP = "hashmap"
    ROCKSDB = "rocksdb"

    @classmethod
    def of_provider(cls, provider: str) -> StateBackend:
        """The backend of a Spark state store provider class name."""
        return cls.ROCKSDB if "RocksDB" in provider else cls.HASHMAP


class ExternalizedCleanup(str, Enum):
    """What happens to the checkpoint when the query is cancelled."""

    RETAIN_ON_CANCELLATION = "retain_on_cancellation"
    DELETE_ON_CANCELLATION = "delete_on_cancellation"


#: the backend a new checkpoint gets when ``state_backend`` is not given (docs/performance.md)
NEW_CHECKPOINT_BACKEND = StateBackend.ROCKSDB

STATE_STORE_PROVIDERS = {
    StateBackend.HASHMAP: (
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    ),
    StateBackend.ROCKSDB: (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
}

#: shortest checkpoint timeout / epoch-sizing target accepted (Spark's own cost per epoch is
#: ~0.3 s on a small machine, docs/design.md section 9)
MIN_TIMEOUT_S = 1.0

#: Flink's time units (``TimeUtils``): every label, and the plural of the long ones
_UNIT_LABELS: dict[float, tuple[str, ...]] = {
    1e-9: ("ns", "nano", "nanosecond"),
    1e-6: ("us", "\u00b5s", "micro", "microsecond"),
    1e-3: ("ms", "milli", "millisecond"),
    1.0: ("s", "sec", "second"),
    60.0: ("m", "min", "minute"),
    3600.0: ("h", "hour"),
    86400.0: ("d", "day"),
}
_UNIT_SECONDS = {label: factor for factor, labels in _UNIT_LABELS.items() for base in labels
                 for label in ((base, base + "s") if len(base) > 2 else (base,))}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([^\d\s.]*)\s*$")


def parse_duration(value: str | float | int, *, name: str) -> float:
    """Seconds of a duration written as Flink writes them: a number and a unit, with or
    without a space, the unit in any case (``500ms``, ``2S``, ``1 min``, ``1d``,
    ``10 seconds``; units ``ns``, ``us``, ``ms``, ``s``, ``m``/``min``, ``h``, ``d`` and
    their long names, singular or plural). A number without a unit (or a Python ``int`` /
    ``float``) is seconds. Raises ConfigError naming ``name`` on anything else."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration such as '2s', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        if str(value).strip().startswith("-"):
            raise ConfigError(f"{name}: a duration cannot be negative, got {value!r}")
        match = _DURATION.match(str(value))
        unit = match.group(2).lower() if match else ""
        if not match or (unit and unit not in _UNIT_SECONDS):
            raise ConfigError(
                f"{name}: cannot read {value!r} as a duration; write a number and a unit "
                "(ms, s, min, h, d or their long names, e.g. '500ms', '2s', '1 min', '1d')"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS.get(unit, 1.0)
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
    timeout:
        An epoch still running this long after it started is cancelled (its Spark jobs
        cancelled; its pre-commits are aborted by the protocol on the restart) and counts as
        a failed checkpoint. At least :data:`MIN_TIMEOUT_S`: Spark alone spends ~0.3 s per
        epoch, so a shorter limit would cancel healthy epochs. Enforced by the supervisor.
    min_pause_between_checkpoints:
        The next epoch does not start until this long after the previous one completed
        (its commit log entry was written). Enforced by exactly's sources.
    tolerable_failed_checkpoints:
        Consecutive failed checkpoints (timeouts, failed epochs) that are retried at once
        without counting against the restart strategy; the next one fails the job over to
        it. On Spark an epoch is processing and snapshot at once, so a failed checkpoint is
        a failed epoch: its retry replays the epoch from the last complete one.
    target_epoch_duration, aligned_checkpoint_timeout, unaligned:
        Epoch sizing, exactly's form of unaligned checkpoints: sources admit per epoch only
        as many rows as recent epochs show can be processed within the target, so checkpoint
        time stays bounded under backpressure and after an outage. ``unaligned=True`` with
        ``aligned_checkpoint_timeout=T`` (the seeds' names) is the same as
        ``target_epoch_duration=T``; ``unaligned=True`` alone targets the interval. Needs
        ``exactly_once`` and one concurrent checkpoint, as unaligned checkpoints do.
    max_concurrent_checkpoints:
        Always 1 on Spark: one epoch runs at a time.
    externalized_cleanup:
        ``retain_on_cancellation`` keeps the checkpoint when the query is cancelled;
        ``delete_on_cancellation`` removes it.
    state_backend:
        ``hashmap`` (Spark's HDFS-backed in-memory store), ``rocksdb``, or ``None`` (the
        default; ``"auto"`` says the same): the backend the checkpoint already holds, and
        ``rocksdb`` for a new one (measured in docs/performance.md: equal to hashmap within
        15 % per epoch at 100 k keys, 1.9x faster at 1 M, 10x at 10 M, and its state is not
        on the JVM heap). A checkpoint keeps the backend it was started with; an explicit
        different backend is refused by ``start_query``, a savepoint restore can switch it.
    incremental:
        RocksDB changelog checkpointing (incremental checkpoints): ``True`` needs
        ``rocksdb``. ``None`` (the default) means on for RocksDB, off for hashmap. Spark
        accepts either setting on an existing RocksDB checkpoint.
    checkpoints_after_tasks_finish:
        A final checkpoint when bounded input ends. Spark always commits the last epoch of
        a bounded (``availableNow``) run, so only ``True`` is accepted.
    savepoint_dir:
        Where savepoints go when none is named (Flink's
        ``execution.checkpointing.savepoint-dir``): ``exactly savepoint CHECKPOINT``,
        ``exactly stop --savepoint``, ``exactly upgrade``. A local directory or
        ``s3://bucket/prefix``; ``None`` (the default): ``<storage>.savepoints`` beside the
        checkpoint. ``exactly run --savepoint-dir`` overrides it.
    history:
        Record every epoch, failure, restart, savepoint and restore in the checkpoint's
        history (``<storage>/exactly-job/history``, bounded): what ``exactly checkpoints``
        and ``exactly ui`` show. Written in the background, never on an epoch's commit path.

    Raises
    ------
    ConfigError
        On an invalid value or combination, naming the fix.
    NotSupportedYetError
        For ``checkpoints_after_tasks_finish=False``, which Spark cannot do.
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
    state_backend: StateBackend | None
    incremental: bool | None
    checkpoints_after_tasks_finish: bool
    target_epoch_duration: str | float | None
    history: bool
    savepoint_dir: str | None
    interval_seconds: float = field(init=False, repr=False)
    timeout_seconds: float | None = field(init=False, repr=False)
    min_pause_seconds: float = field(init=False, repr=False)
    epoch_target_seconds: float | None = field(init=False, repr=False)

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
                 state_backend: StateBackend | str | None = None,
                 incremental: bool | None = None,
                 checkpoints_after_tasks_finish: bool = True,
                 target_epoch_duration: str | float | None = None,
                 history: bool = True,
                 savepoint_dir: str | None = None) -> None:
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
        set_(self, "state_backend", None if state_backend in (None, "auto") else
             parse_enum(StateBackend, state_backend, "state_backend"))
        if incremental is not None and not isinstance(incremental, bool):
            raise ConfigError(f"incremental: give True, False or None, got {incremental!r}")
        set_(self, "incremental", incremental)
        set_(self, "checkpoints_after_tasks_finish", checkpoints_after_tasks_finish)
        set_(self, "target_epoch_duration", target_epoch_duration)
        if not isinstance(history, bool):
            raise ConfigError(f"history: give True or False, got {history!r}")
        set_(self, "history", history)
        if savepoint_dir is not None and (not isinstance(savepoint_dir, str)
                                          or not savepoint_dir.strip()):
            raise ConfigError("savepoint_dir: give a directory path or s3://bucket/prefix, "
                              f"or None for <storage>.savepoints (got {savepoint_dir!r})")
        set_(self, "savepoint_dir", savepoint_dir)
        set_(self, "interval_seconds", parse_duration(interval, name="interval"))
        if self.interval_seconds <= 0:
            raise ConfigError("interval: must be greater than 0, e.g. '1s'")
        if not isinstance(self.storage, str) or not self.storage.strip():
            raise ConfigError("storage: give 'memory' or a directory path/URI for checkpoints")
        set_(self, "timeout_seconds", None if timeout is None
             else parse_duration(timeout, name="timeout"))
        set_(self, "min_pause_seconds", parse_duration(min_pause_between_checkpoints,
                                                       name="min_pause_between_checkpoints"))
        self._validate_combinations()
        set_(self, "epoch_target_seconds", self._epoch_target())
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
        if self.incremental and self.state_backend is StateBackend.HASHMAP:
            raise ConfigError(
                "incremental checkpoints need state_backend='rocksdb' (the hashmap backend "
                "always writes full snapshots); set state_backend='rocksdb' or "
                "incremental=False"
            )
        tolerable = self.tolerable_failed_checkpoints
        if isinstance(tolerable, bool) or not isinstance(tolerable, int) or tolerable < 0:
            raise ConfigError("tolerable_failed_checkpoints: give a whole number, 0 or more "
                              f"(got {tolerable!r})")
        if self.timeout_seconds is not None and self.timeout_seconds < MIN_TIMEOUT_S:
            raise ConfigError(
                f"timeout: {self.timeout!r} is below the floor of {MIN_TIMEOUT_S:g}s; Spark "
                "alone spends ~0.3 s on every epoch, so healthy epochs would be cancelled. "
                "Give a timeout of at least 1s (Flink's default is 10min)"
            )
        if self.target_epoch_duration is not None and self.mode is not Mode.EXACTLY_ONCE:
            raise ConfigError(
                "target_epoch_duration (epoch sizing, exactly's unaligned checkpoints) needs "
                "mode='exactly_once'; set mode='exactly_once' or drop target_epoch_duration"
            )
        if (self.target_epoch_duration is not None and self.aligned_checkpoint_timeout
                is not None):
            raise ConfigError(
                "target_epoch_duration and aligned_checkpoint_timeout name the same setting "
                "(aligned_checkpoint_timeout is the seeds' alias); give only one"
            )

    def _epoch_target(self) -> float | None:
        """Seconds epoch sizing aims at, or None when epochs are not sized."""
        if self.target_epoch_duration is not None:
            target = parse_duration(self.target_epoch_duration, name="target_epoch_duration")
        elif self.aligned_checkpoint_timeout is not None:
            target = parse_duration(self.aligned_checkpoint_timeout,
                                    name="aligned_checkpoint_timeout")
        elif self.unaligned:
            target = self.interval_seconds
        else:
            return None
        if target < MIN_TIMEOUT_S:
            raise ConfigError(
                f"epoch sizing target {target:g}s is below {MIN_TIMEOUT_S:g}s: Spark alone "
                "spends ~0.3 s on every epoch. Give target_epoch_duration (or "
                "aligned_checkpoint_timeout) of at least 1s"
            )
        return target

    def _refuse_unimplemented(self) -> None:
        if not self.checkpoints_after_tasks_finish:
            raise NotSupportedYetError(
                "checkpoints_after_tasks_finish=False is not supported: Spark always commits "
                "the final epoch of a bounded run. Remove the option to use the default."
            )

    # -- derived values -------------------------------------------------------------
    @property
    def sizes_epochs(self) -> bool:
        """True when sources are asked to size epochs (``epoch_target_seconds`` is set)."""
        return self.epoch_target_seconds is not None

    def supervisor_policies(self) -> list[str]:
        """The settings given that act between epochs, which only exactly's supervisor
        applies (``exactly run``, ``run_job``): ``timeout``, ``tolerable_failed_checkpoints``,
        ``min_pause_between_checkpoints`` and epoch sizing, as ``name=value`` texts."""
        given = [("timeout", self.timeout is not None),
                 ("tolerable_failed_checkpoints", self.tolerable_failed_checkpoints > 0),
                 ("min_pause_between_checkpoints", self.min_pause_seconds > 0),
                 ("target_epoch_duration", self.target_epoch_duration is not None),
                 ("unaligned", self.unaligned),
                 ("aligned_checkpoint_timeout", self.aligned_checkpoint_timeout is not None)]
        return [f"{name}={getattr(self, name)!r}" for name, on in given if on]

    @property
    def needs_admission(self) -> bool:
        """True when exactly's sources must consult the supervisor's admission file."""
        return self.sizes_epochs or self.min_pause_seconds > 0

    def replace(self, **changes: Any) -> CheckpointConfig:
        """A copy with ``changes`` applied (constructor arguments), checked like a new one."""
        settings = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        unknown = set(changes) - set(settings)
        if unknown:
            raise ConfigError(f"CheckpointConfig has no setting {', '.join(sorted(unknown))}")
        return CheckpointConfig(**{**settings, **changes})

    @property
    def is_memory_storage(self) -> bool:
        return self.storage.strip().lower() == "memory"

    @property
    def backend(self) -> StateBackend:
        """The state backend of a new checkpoint: the one given, else ``rocksdb``."""
        return self.state_backend or NEW_CHECKPOINT_BACKEND

    @property
    def changelog(self) -> bool:
        """Whether RocksDB changelog checkpointing is on: as given, else on for RocksDB."""
        if self.incremental is not None:
            return self.incremental
        return self.backend is StateBackend.ROCKSDB

    def for_checkpoint(self, pinned: StateBackend | None, location: str) -> CheckpointConfig:
        """This config with the backend decided for the checkpoint at ``location``, which
        holds ``pinned`` (None: a new checkpoint, or one not readable here).

        Raises ConfigError when an explicit backend differs from ``pinned`` (Spark cannot
        restore state into another backend: a savepoint restore can) or when
        ``incremental=True`` meets a hashmap checkpoint."""
        if pinned is not None and self.state_backend not in (None, pinned):
            raise ConfigError(
                f"the checkpoint at {location} holds the {pinned.value} state backend; Spark "
                f"cannot restore it into {self.state_backend.value}. Keep "
                f"state_backend='{pinned.value}' (or None, which follows the checkpoint), "
                "restore a savepoint into a new checkpoint with the other backend "
                f"(`exactly run JOB --checkpoint NEW -s SAVEPOINT --state-backend "
                f"{self.state_backend.value}`, docs/savepoints.md), or start from a new "
                "checkpoint."
            )
        if pinned is StateBackend.HASHMAP and self.incremental:
            raise ConfigError(
                f"incremental=True needs RocksDB, and the checkpoint at {location} holds the "
                "hashmap state backend; drop incremental, or restore a savepoint into a new "
                "checkpoint with state_backend='rocksdb'"
            )
        decided = self.replace(state_backend=pinned or self.backend)
        return decided.replace(incremental=decided.changelog)

    @property
    def state_store_provider(self) -> str:
        """Spark's provider class of :attr:`backend`."""
        return STATE_STORE_PROVIDERS[self.backend]

    def spark_conf(self) -> dict[str, str]:
        """SQL settings that the query needs (state backend, changelog checkpointing), for
        :attr:`backend` (resolve an existing checkpoint's with :meth:`for_checkpoint`)."""
        conf = {"spark.sql.streaming.stateStore.providerClass": self.state_store_provider}
        if self.backend is StateBackend.ROCKSDB:
            conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = (
                "true" if self.changelog else "false"
            )
        return conf

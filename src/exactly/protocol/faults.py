"""Fault injection at named points of the commit protocol (docs/design.md section 3).

Points form an open registry: the protocol's own points (:class:`FaultPoint`) are registered
here, and a sink registers its own under its name (``register_point("kafka.in_transaction",
on_driver=True, ...)``). A fault is a :class:`FaultSpec`, armed only explicitly -- never by
the environment: the sink options ``exactly.fault`` (``POINT`` or ``POINT@EPOCH``: it fires
the first time the process reaches ``POINT`` in an epoch ``>= EPOCH``),
``exactly.faultMarker`` and ``exactly.faultAction``; the commands' flags ``--fault``,
``--fault-marker`` and ``--fault-action`` (``exactly run``, ``exactly pipeline``, the demo
jobs), which pass them on as those options; and the ``fault`` argument of the functions that
have points of their own (:func:`exactly.savepoints.take.take_savepoint`,
:func:`exactly.savepoints.restore.restore_into`). With a marker file set, a fault fires at
most once across restarts: the marker is created atomically just before the action and
records where it fired.

What firing does is the *action*. The default, ``kill`` (:func:`kill_process`), is a real
crash: SIGKILL. Driver points kill the driver's whole local process tree, as a crash of its
host would: the Spark driver JVM, the Python driver process that launched it, the PySpark
worker daemons and Python workers under the JVM, and every process carrying the job token
exactly gave the job (:func:`exactly.procs.local_job_pids`); ``in_write`` kills the
executor's Python worker inside ``write()``. ``pause:FILE`` (:func:`pause_while`) stalls at
the point while FILE exists: a hung driver. In-process protocol tests install
:func:`raise_simulated_crash` instead (:func:`fault_action`, the test kit's API), which raises
:class:`SimulatedCrash`: protocol code never catches it, so everything after the point is
skipped as a kill would skip it, and the test then "restarts" with a fresh committer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from exactly import options as opt
from exactly.errors import ConfigError
from exactly.procs import local_job_pids


class FaultPoint(str, Enum):
    """The protocol's own crash points (every sink passes through them)."""

    IN_WRITE = "in_write"  # executor, inside step 1
    BEFORE_INTENT = "before_intent"  # driver, before 2b
    AFTER_INTENT = "after_intent"  # driver, after 2b, no handle committed yet
    BETWEEN_COMMITS = "between_commits"  # driver, after the first handle commit (2c)
    AFTER_COMMITS = "after_commits"  # driver, every handle committed, not yet complete
    AFTER_COMPLETE = "after_complete"  # driver, after 2d, before Spark's commit log

    @property
    def on_driver(self) -> bool:
        return self is not FaultPoint.IN_WRITE


@dataclass(frozen=True)
class PointInfo:
    """A registered fault point: its name, the side it runs on, what it interrupts."""

    name: str
    on_driver: bool
    description: str


_POINTS: dict[str, PointInfo] = {}


def register_point(name: str, *, on_driver: bool, description: str) -> str:
    """Register a crash point (sinks use ``<sink>.<point>`` names); returns ``name``.

    Registering the same name twice with the same side is a no-op; a clash raises
    ConfigError.
    """
    known = _POINTS.get(name)
    if known is not None and known.on_driver != on_driver:
        raise ConfigError(f"fault point {name!r} is already registered on the other side")
    _POINTS[name] = PointInfo(name, on_driver, description)
    return name


def registered_points() -> dict[str, PointInfo]:
    """Every fault point known in this process, by name."""
    return dict(_POINTS)


for _point, _text in (
        (FaultPoint.IN_WRITE, "inside write(), after the task's first batch"),
        (FaultPoint.BEFORE_INTENT, "every task pre-committed, no intent yet"),
        (FaultPoint.AFTER_INTENT, "intent durable, no handle committed"),
        (FaultPoint.BETWEEN_COMMITS, "the first handle committed"),
        (FaultPoint.AFTER_COMMITS, "every handle committed and published, "
                                   "not recorded complete"),
        (FaultPoint.AFTER_COMPLETE, "recorded complete, before Spark's commit log")):
    register_point(_point.value, on_driver=_point.on_driver, description=_text)

DRIVER_POINTS = tuple(p for p in FaultPoint if p.on_driver)
FAULT_OPTION = opt.FAULT
MARKER_OPTION = opt.FAULT_MARKER
ACTION_OPTION = opt.FAULT_ACTION
#: the default action: SIGKILL (:func:`kill_process`)
KILL = "kill"
#: the action that SIGKILLs the process at the point only (:func:`kill_this_process`)
KILL_PROCESS = "kill-process"
#: the prefix of the action ``pause:FILE`` (:func:`pause_while`)
PAUSE = "pause:"


def point_name(point: str | Enum) -> str:
    return point.value if isinstance(point, Enum) else str(point)


def is_driver_point(point: str | Enum) -> bool:
    """True for points on the driver; unknown (unregistered) names count as driver points."""
    info = _POINTS.get(point_name(point))
    return info.on_driver if info is not None else True


@dataclass(frozen=True)
class FaultSpec:
    """One armed fault: a point name, the first epoch it may fire in, an optional marker
    file (fire at most once across restarts) and the action (``kill`` or ``pause:FILE``).

    Raises ConfigError for an action that is neither."""

    point: str
    min_epoch: int = 0
    marker: str | None = None
    action: str = KILL

    def __post_init__(self) -> None:
        object.__setattr__(self, "point", point_name(self.point))
        action_for(self.action)  # an unknown action fails when the fault is armed

    @classmethod
    def parse(cls, text: str, marker: str | None = None,
              action: str | None = None) -> FaultSpec:
        """``POINT`` or ``POINT@EPOCH``. A name without a dot must be a protocol point; a
        dotted name (``kafka.in_transaction``) belongs to a sink that registers it when it
        loads, so it is accepted here."""
        point_text, _, epoch_text = text.strip().partition("@")
        point = point_text.strip().lower()
        if point not in _POINTS and "." not in point:
            names = ", ".join(sorted(_POINTS))
            raise ConfigError(
                f"fault point {point_text!r} is unknown; use one of {names} (or a sink's "
                "own <sink>.<point>), optionally followed by @EPOCH"
            )
        try:
            min_epoch = int(epoch_text) if epoch_text else 0
        except ValueError:
            raise ConfigError(f"fault {text!r}: the part after @ must be an epoch number") from None
        return cls(point, min_epoch, marker or None, (action or KILL).strip())

    @classmethod
    def from_flags(cls, fault: str | None, marker: str | None = None,
                   action: str | None = None) -> FaultSpec | None:
        """The fault of the flags ``--fault``, ``--fault-marker``, ``--fault-action``; None
        without ``--fault``. ConfigError for a marker or an action without a fault."""
        if not fault:
            if marker or action:
                raise ConfigError("--fault-marker and --fault-action belong to a fault: add "
                                  "--fault POINT[@EPOCH] (see `exactly faults`)")
            return None
        return cls.parse(fault, marker, action)

    def render(self) -> str:
        return f"{self.point}@{self.min_epoch}"

    def with_marker(self, marker: str | os.PathLike[str]) -> FaultSpec:
        """This fault, firing at most once across restarts (the marker file ``marker``)."""
        return replace(self, marker=os.fspath(marker))

    def options(self) -> dict[str, str]:
        """The sink options that arm this fault (``exactly.fault``, ...)."""
        armed = {FAULT_OPTION: self.render()}
        if self.marker:
            armed[MARKER_OPTION] = self.marker
        if self.action != KILL:
            armed[ACTION_OPTION] = self.action
        return armed

    def flags(self) -> list[str]:
        """The command-line flags that arm this fault (``--fault POINT@EPOCH`` ...)."""
        args = ["--fault", self.render()]
        if self.marker:
            args += ["--fault-marker", self.marker]
        if self.action != KILL:
            args += ["--fault-action", self.action]
        return args


def fault_from(options: Mapping[str, str] | None = None) -> FaultSpec | None:
    """The fault armed by sink options (``exactly.fault``, ``exactly.faultMarker``,
    ``exactly.faultAction``), else ``None``. The environment arms nothing."""
    options = options or {}
    text = options.get(FAULT_OPTION)
    if not text:
        return None
    return FaultSpec.parse(text, options.get(MARKER_OPTION), options.get(ACTION_OPTION))


# -- actions ---------------------------------------------------------------------------
class SimulatedCrash(BaseException):
    """Raised at an armed fault point by :func:`raise_simulated_crash` (tests).

    A ``BaseException``: ``except Exception`` blocks never catch it, and the protocol's own
    clean-up on failure skips it, so the process state is what a kill at that point leaves.
    """

    def __init__(self, point: str, epoch: int) -> None:
        super().__init__(f"simulated crash at {point} in epoch {epoch}")
        self.point = point
        self.epoch = epoch


#: an action: called with the point's name, the epoch and whether it runs on the driver
FaultAction = Callable[[str, int, bool], None]


def kill_process(point: str, epoch: int, on_driver: bool) -> None:
    """SIGKILL this process -- and for driver points the driver's whole local tree."""
    if on_driver:
        for pid in local_job_pids():
            _kill(pid)
    _kill(os.getpid())
    time.sleep(60)  # SIGKILL is asynchronous; never run on past the point


def kill_this_process(point: str, epoch: int, on_driver: bool) -> None:
    """SIGKILL only the process at the point, whichever it is: on Spark Connect the
    server's ``foreachBatch`` runner, where the commit runs, while the server lives on (the
    runner killed alone, as an out-of-memory kill would)."""
    _kill(os.getpid())
    time.sleep(60)


def raise_simulated_crash(point: str, epoch: int, on_driver: bool) -> None:
    """Raise :class:`SimulatedCrash` (for protocol tests that run in one process)."""
    raise SimulatedCrash(point, epoch)


def pause_while(path: str, limit_s: float = 300.0) -> FaultAction:
    """An action that stalls at the point while the file ``path`` exists (at most
    ``limit_s``), then goes on: a hung driver, e.g. while a test restarts a server in the
    middle of a commit. It writes ``<path>.waiting`` (holding its pid) when it starts."""

    def pause(point: str, epoch: int, on_driver: bool) -> None:
        with open(path + ".waiting", "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + limit_s
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)

    return pause


#: the action installed by :func:`fault_action` (the test kit's), over every fault's own
_action: FaultAction | None = None


def action_for(text: str) -> FaultAction:
    """The action named ``kill`` (SIGKILL of the process, and for driver points of the
    driver's local tree), ``kill-process`` (SIGKILL of the process at the point only) or
    ``pause:FILE`` (stall while FILE exists); ConfigError for another name."""
    if text.startswith(PAUSE) and len(text) > len(PAUSE):
        return pause_while(text[len(PAUSE):])
    if text == KILL_PROCESS:
        return kill_this_process
    if text != KILL:
        raise ConfigError(f"fault action {text!r}: use 'kill', 'kill-process' or "
                          "'pause:<file>'")
    return kill_process


@contextlib.contextmanager
def fault_action(action: FaultAction) -> Iterator[None]:
    """Use ``action`` instead of each fault's own action for faults firing in this process,
    in the block (the test kit's API, e.g. :func:`raise_simulated_crash`)."""
    global _action
    previous, _action = _action, action
    try:
        yield
    finally:
        _action = previous


def maybe_crash(spec: FaultSpec | None, point: str | Enum, epoch: int,
                before: Callable[[], object] | None = None) -> None:
    """Fire the fault action if ``spec`` is armed for ``point`` at ``epoch``.

    ``before`` runs just before the action (e.g. flushing records into an open Kafka
    transaction, so the crash leaves them in the broker's log, uncommitted).
    """
    name = point_name(point)
    if spec is None or spec.point != name or epoch < spec.min_epoch:
        return
    if spec.marker and not _claim_marker(spec.marker, name, epoch):
        return
    if before is not None:
        before()
    action = _action if _action is not None else action_for(spec.action)
    action(name, epoch, is_driver_point(name))


def _claim_marker(path: str, point: str, epoch: int) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    record = {"point": point, "epoch": epoch, "pid": os.getpid(),
              "host": socket.gethostname(), "at": time.time()}
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

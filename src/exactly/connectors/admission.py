"""Admission control shared by exactly's sources: min pause between epochs and epoch sizing.

On Spark the only place that decides how much input the next epoch gets, and whether an
epoch starts at all, is each source's ``latestOffset``: when it returns the start offset
there is no new data and Spark runs no epoch. exactly's sources (files, datagen, PostgreSQL
table, Kafka) therefore ask :func:`current_admission` on every call. The job supervisor
(:mod:`exactly.ops.supervisor`) writes the *admission file* that answers, and names it to
every source through the environment variable :data:`ADMISSION_FILE_ENV` (internal plumbing:
set by exactly -- ``exactly run``, :func:`exactly.ops.driver.run_job` -- before the driver's
JVM starts, never set it yourself), which Spark's Python workers inherit from the driver
process. Without the variable, or with a missing or unreadable file, admission is open:
sources behave as Spark alone would. The supervisor only ever writes its job's own file
(``<checkpoint>/exactly-job/admission.json``), never another file a variable names.

The file (JSON, replaced atomically) holds:

``checkpoint``   local checkpoint directory of the query; the newest ``commits/N`` file's
                 modification time is when the last epoch completed
``min_pause_s``  no epoch starts until this long after the last epoch completed
``max_rows``     epoch sizing: at most this many rows (records, or files' rows) per epoch
``closed``       admit nothing (a graceful stop lets the epoch in flight finish)

Guarantee: admission only ever holds input back or cuts an epoch shorter; an epoch's end
offset is still written to Spark's offset log before the epoch runs, so a replay reads the
same input whatever the admission file says at replay time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: environment variable naming the admission file (internal: set by exactly before the
#: driver's JVM starts, for its own processes; never set it yourself)
ADMISSION_FILE_ENV = "_EXACTLY_ADMISSION_FILE"


@dataclass(frozen=True)
class Admission:
    """What the next epoch may admit; the default admits everything at once."""

    checkpoint: str | None = None
    min_pause_s: float = 0.0
    max_rows: int | None = None
    closed: bool = False

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Admission:
        if not isinstance(data, dict):
            return cls()
        max_rows = data.get("max_rows")
        return cls(checkpoint=data.get("checkpoint") or None,
                   min_pause_s=float(data.get("min_pause_s") or 0.0),
                   max_rows=int(max_rows) if max_rows is not None else None,
                   closed=bool(data.get("closed", False)))

    def paused_for(self, now: float | None = None) -> float:
        """Seconds the next epoch must still wait (0 when it may start now)."""
        if self.closed:
            return float("inf")
        if self.min_pause_s <= 0 or not self.checkpoint:
            return 0.0
        completed = last_epoch_completed_at(self.checkpoint)
        if completed is None:
            return 0.0
        now = file_clock() if now is None else now
        return max(0.0, completed + self.min_pause_s - now)

    def row_budget(self, *, bounded_run: bool = False, now: float | None = None) -> int | None:
        """Rows the next epoch may take: 0 to admit nothing, ``None`` for no limit.

        ``bounded_run`` (an ``availableNow`` drain) ignores the pause and ``closed``: Spark
        ends such a run at the first epoch that finds no data, so holding input back there
        would end the drain early. The size limit still applies.
        """
        if not bounded_run and self.paused_for(now) > 0:
            return 0
        return self.max_rows


def admission_path() -> Path | None:
    """The admission file named by :data:`ADMISSION_FILE_ENV`, if any."""
    value = os.environ.get(ADMISSION_FILE_ENV)
    return Path(value) if value else None


def current_admission() -> Admission:
    """The admission in force now (open when there is no readable admission file)."""
    path = admission_path()
    if path is None:
        return Admission()
    try:
        return Admission.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return Admission()


#: Linux's CLOCK_REALTIME_COARSE (not named by Python's time module): the clock the kernel
#: stamps file modification times with
_REALTIME_COARSE = 5


def file_clock() -> float:
    """Now, on the clock file modification times come from (coarse, up to a tick behind
    ``time.time()`` on Linux). Compared with a ``commits/N`` mtime it guarantees that a file
    written after the comparison (the next ``offsets/N+1``) is stamped no earlier than ``now``."""
    if sys.platform.startswith("linux"):
        return time.clock_gettime(_REALTIME_COARSE)
    return time.time()


def last_epoch_completed_at(checkpoint: str) -> float | None:
    """Modification time of the newest ``commits/N`` of a local checkpoint, or ``None``."""
    commits = Path(checkpoint.removeprefix("file://")) / "commits"
    try:
        numbers = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    if not numbers:
        return None
    try:
        return (commits / str(max(numbers))).stat().st_mtime
    except OSError:
        return None


def cap(start: int, end: int, budget: int | None) -> int:
    """``end`` limited to ``start + budget`` (``budget`` from :meth:`Admission.row_budget`)."""
    return end if budget is None else min(end, start + max(0, budget))

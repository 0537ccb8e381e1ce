"""The job's bookkeeping writes wait out a full disk instead of ending the job.

``job.json`` (the job's status and claim) and the restart log are written by the launcher
and the driver at every start, failure and restart. A checkpoint disk that fills up for a
while (another job's spill, logs) fails the running epoch -- Spark cannot write its
checkpoint -- and the restart strategy deals with that; but a launcher that gave up on the
first ``ENOSPC`` of its own status write would end the whole job for a transient condition.
:func:`when_space` retries such a write until space is back, for at most
:data:`FULL_DISK_WAIT_S` seconds, logging each retry; after that the ``OSError`` is raised
as it was (the root cause names the disk and the fix: ``exactly.causes.remedy``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from exactly.retry import is_disk_full, retry_call

T = TypeVar("T")

logger = logging.getLogger("exactly.checkpoint")

#: how long a bookkeeping write waits for a full disk to have space again
FULL_DISK_WAIT_S = 600.0


def when_space(fn: Callable[[], T], *, what: str) -> T:
    """``fn()``, retried while it fails because the disk is full (up to
    :data:`FULL_DISK_WAIT_S`); any other error is raised at once. ``fn`` must be safe to
    run again after a failed attempt (a whole-file replace, or an append that undoes a
    partial line)."""
    return retry_call(fn, what=what, transient=is_disk_full, seconds=FULL_DISK_WAIT_S,
                      initial=0.5, maximum=10.0, log=logger)

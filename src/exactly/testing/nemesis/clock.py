"""A wall clock that jumps: the injected clock of leases and other time-keeping components.

``JumpingClock()`` is a callable returning ``time.time()`` plus an offset; :meth:`jump` moves
the offset forward or back, as an NTP step, a VM resumed with a stale clock, or an operator's
``date -s`` would. Hand it to any component that takes a ``clock`` (for instance
``exactly.protocol.lease.Lease(directory, clock=clock)``); the rest of the process keeps the
real time. Thread-safe: a jump is seen at once by every thread reading the clock.
"""

from __future__ import annotations

import threading
import time


class JumpingClock:
    """``time.time()`` plus an offset that :meth:`jump` changes (seconds, may be negative)."""

    def __init__(self, offset: float = 0.0) -> None:
        self._offset = float(offset)
        self._lock = threading.Lock()
        #: every jump made, in order (for the fault log of a test)
        self.jumps: list[float] = []

    def __call__(self) -> float:
        with self._lock:
            return time.time() + self._offset

    @property
    def offset(self) -> float:
        """How far this clock is from the real time now (seconds; negative: behind)."""
        with self._lock:
            return self._offset

    def jump(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward (negative: back); returns the new offset."""
        with self._lock:
            self._offset += float(seconds)
            self.jumps.append(float(seconds))
            return self._offset

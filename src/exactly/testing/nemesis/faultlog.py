"""The fault log: every fault the nemesis injects, one JSON line each, so a failure can be
read and replayed (:func:`exactly.testing.nemesis.schedule.FaultSchedule.from_log`).

A line: ``{"t": seconds since the log was opened, "wall": ISO time, "kind": ..., "target":
..., "phase": "start" | "end" | "event", ...parameters}``. Thread-safe; every line is
flushed as it is written, so the log of a run that was killed is complete up to the kill.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class FaultLog:
    """Append-only JSON-lines log of injected faults (``path=None``: kept in memory only)."""

    def __init__(self, path: str | Path | None = None, *, seed: int | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.seed = seed
        self.started = time.monotonic()
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
        self.record("log", "nemesis", phase="event", seed=seed)

    def record(self, kind: str, target: str, *, phase: str = "event", **params: Any) -> None:
        """Write one entry (``phase`` "start"/"end" bracket a fault that lasts)."""
        entry = {"t": round(time.monotonic() - self.started, 3),
                 "wall": datetime.now(UTC).isoformat(timespec="milliseconds"),
                 "kind": kind, "target": target, "phase": phase, **params}
        with self._lock:
            self.entries.append(entry)
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps(entry, default=str) + "\n")

    def counts(self) -> Counter[str]:
        """How many faults of each kind started (or happened, for one-off events)."""
        with self._lock:
            return Counter(e["kind"] for e in self.entries
                           if e["phase"] in ("start", "event") and e["kind"] != "log")

    def text(self) -> str:
        """The whole log as JSON lines (to attach to a failure)."""
        with self._lock:
            return "\n".join(json.dumps(e, default=str) for e in self.entries)

"""The restart history of a job: every failure, what was done about it, and the recovery.

One JSON object per line in ``<checkpoint>/exactly-job/restarts.jsonl`` on a POSIX
directory; on S3, which has no append, one object per entry under
``<checkpoint>/exactly-job/restarts/`` (named by time, never rewritten). Entries are appended
by the driver (query failures, failed checkpoints) and by the ``exactly run`` launcher (driver
process deaths). Both read it back to feed the restart strategy the same failure times, so
a strategy's limits hold across process restarts. Lines of earlier runs stay (history);
strategies see only their own run's (``run`` field).

Events: ``failure`` (``kind``: query | checkpoint-timeout | start | process | lost-run |
failover | leadership; ``action``: restart | tolerated | give-up | failover | standby;
``delay``; ``cause``; ``repeats``: how many failures in a row had this cause, see
:meth:`RestartHistory.repeats`; ``reason`` of a give-up on a repeated cause; ``since``: when
the failure began if before ``at``, e.g. a failover's lease expiry) and ``recovered`` (the
first epoch completed after a failure; ``recovery_s`` from ``since``, else ``at``).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.location import as_store
from exactly.checkpoint.space import when_space
from exactly.checkpoint.store import LocalLogStore, LogStore
from exactly.fsutil import file_lock

#: failure kinds that count against the restart strategy (tolerated ones do not)
COUNTED = "restart"
#: actions of failures the restart strategy does not count: a tolerated failed checkpoint,
#: a failover to another host (the job moved; nothing failed in it), a lost leadership
UNCOUNTED = ("tolerated", "failover", "standby", "rollback")
#: what varies between occurrences of one failure: UUIDs (Spark's run ids), hex addresses
#: and digit runs (epoch, task, stage, attempt numbers, pids, ports)
_VARYING = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|0x[0-9a-fA-F]+|\d+")


def cause_key(cause: str) -> str:
    """``cause`` with what varies between occurrences of one failure masked (digit runs,
    hex addresses, UUIDs), so ``... epoch 5`` and ``... epoch 6`` are the same cause."""
    return _VARYING.sub("#", cause.strip())


@dataclass
class RestartHistory:
    """Append-only failure log of the runs of one checkpoint, in its job store
    (``exactly-job``: a store, or a local directory path)."""

    where: LogStore | str | os.PathLike[str]
    run_id: str
    store: LogStore = field(init=False, repr=False)
    _read: dict[str, str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.store = as_store(self.where)

    @property
    def path(self) -> Path:
        """The log file of a local job directory."""
        assert isinstance(self.store, LocalLogStore), "a local restart log"
        return self.store.root / layout.RESTART_LOG

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        entry = {"event": event, "run": self.run_id, "at": time.time(), **fields}
        line = json.dumps(entry, default=str)
        if isinstance(self.store, LocalLogStore):
            when_space(lambda: self._append_line(line), what="append to the restart log")
        else:  # one object per entry: sortable by time, never rewritten
            name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
            self.store.write(f"{layout.RESTART_OBJECTS}/{name}", line.encode())
        return entry

    def _append_line(self, line: str) -> None:
        """Append one whole line; a write that fails part-way (a full disk) is cut back,
        so the log never holds a torn line and the append can be made again."""
        assert isinstance(self.store, LocalLogStore)
        root = self.store.root
        root.mkdir(parents=True, exist_ok=True)
        data = (line + "\n").encode("utf-8")
        with file_lock(root / "restarts.lock"):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                try:
                    written = 0
                    while written < len(data):
                        written += os.write(fd, data[written:])
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, size)
                    raise
            finally:
                os.close(fd)

    def _lines(self) -> list[str]:
        if isinstance(self.store, LocalLogStore):
            try:
                return self.path.read_text(encoding="utf-8").splitlines()
            except OSError:
                return []
        lines = []
        for name in sorted(self.store.list(layout.RESTART_OBJECTS)):
            if name not in self._read:  # an entry never changes: read once
                data = self.store.read(f"{layout.RESTART_OBJECTS}/{name}")
                if data is None:
                    continue
                self._read[name] = data.decode("utf-8", errors="replace")
            lines.append(self._read[name])
        return lines

    def entries(self, *, this_run_only: bool = True) -> list[dict[str, Any]]:
        found = []
        for line in self._lines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash mid-append
            if isinstance(entry, dict) and (not this_run_only or entry.get("run") == self.run_id):
                found.append(entry)
        return found

    def counted_failure_times(self) -> list[float]:
        """Times of this run's failures that count against the restart strategy."""
        return [float(e["at"]) for e in self.entries()
                if e.get("event") == "failure" and e.get("action") not in UNCOUNTED]

    def repeats(self, cause: str) -> int:
        """How many failures in a row of this run have the root cause ``cause``, counting
        the failure about to be appended (call it before :meth:`append`): 1 for a new cause.

        Causes are compared by :func:`cause_key` (numbers masked). A failure of another cause
        or a recovery (an epoch completed since) ends the row; other events do not. Reads the
        file, so the driver and the launcher count the same rows.
        """
        key = cause_key(cause)
        count = 1
        for entry in reversed(self.entries()):
            if entry.get("event") == "recovered":
                break
            if entry.get("event") != "failure":
                continue
            if cause_key(str(entry.get("cause") or "")) != key:
                break
            count += 1
        return count

    def restarts(self) -> int:
        return sum(1 for e in self.entries()
                   if e.get("event") == "failure" and e.get("action") in (COUNTED, "tolerated"))


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"

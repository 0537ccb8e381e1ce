"""Recovery before the first epoch of a new driver, for sinks whose pre-commits hold locks.

The generic committer recovers at the first *commit* of a run (DESIGN section 3, step 4),
i.e. after the run's first tasks wrote. That is too late for a target where a leftover
pre-commit blocks new writes: a PostgreSQL prepared transaction keeps its row locks (and
unique-index entries) until it is committed or rolled back, so a replay that upserts the
same keys, or inserts the same primary key, would wait for a transaction that only the
replay's own commit call would abort. :func:`recover_on_new_driver` runs the committer's
recovery earlier, when Spark plans the first epoch of a new driver process:

* only once per driver process (recorded in ``recovered-by.json`` beside the commit log);
* never while another live driver holds the lease: that instance is fenced off at its own
  commit, and its pre-commits are not ours to abort;
* only when the commit log already names its query (a first ever run has nothing to
  recover; a crash before the first intent leaves orphans that the first commit aborts --
  the sink's lock timeout turns a wait on them into a clear error and a restart).
"""

from __future__ import annotations

import time

from exactly.errors import CorruptFileError
from exactly.fsutil import atomic_write_json, file_lock, read_json, require_fields
from exactly.procs import ProcessId, driver_identity
from exactly.protocol.committer import Committer
from exactly.protocol.contract import SinkSettings, TwoPhaseCommitSink
from exactly.protocol.faults import FaultSpec
from exactly.protocol.lease import Lease
from exactly.protocol.repairs import marker_repair, query_repair

MARKER_NAME = "recovered-by.json"


def recover_on_new_driver(sink: TwoPhaseCommitSink, settings: SinkSettings,
                          fault: FaultSpec | None = None) -> bool:
    """Finish unfinished intents and abort orphans once per driver; True when it recovered."""
    directory = sink.log_directory
    owner = read_json(directory / "query.json", repair=query_repair(directory))
    if owner is None:
        return False
    require_fields(owner, directory / "query.json", ("query_id",), query_repair(directory))
    me = driver_identity()
    with file_lock(directory / "startup.lock"):
        marker = directory / MARKER_NAME
        seen = read_json(marker, repair=marker_repair(directory))
        if seen is not None and _marker_driver(seen, marker) == me:
            return False
        lease = Lease(directory, stale_after=settings.lease_stale_after)
        holder = lease.current()
        if holder is not None and holder.holder != me:
            alive = holder.holder.is_alive()
            if alive or (alive is None
                         and time.time() - holder.renewed_at < settings.lease_stale_after):
                return False  # a live instance owns the sink; it is not ours to touch
        Committer(sink, settings, fault).recover(owner["query_id"])
        atomic_write_json(directory / MARKER_NAME, {"driver": me.to_json(), "at": time.time()})
        return True


def _marker_driver(seen: object, marker) -> ProcessId:
    data = require_fields(seen, marker, ("driver",), marker_repair(marker.parent))
    try:
        return ProcessId.from_json(data["driver"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(str(marker), f"has a malformed driver ({exc!r})",
                               marker_repair(marker.parent)) from None

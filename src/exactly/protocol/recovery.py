"""Recovery before the first epoch of a new driver, for sinks whose pre-commits hold locks.

The generic committer recovers at the first *commit* of a run (docs/design.md section 3, step 4),
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

import hashlib
import json
import tempfile
import time
from pathlib import Path

from exactly.checkpoint.store import is_remote, open_log_store
from exactly.errors import CorruptFileError
from exactly.fsutil import file_lock, parse_json, require_fields
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
    store = open_log_store(directory)
    data = store.read("query.json")
    if data is None:
        return False
    where = store.describe("query.json")
    owner = require_fields(parse_json(data, where, query_repair(directory)), where,
                           ("query_id",), query_repair(directory))
    me = driver_identity()
    with file_lock(_startup_lock(directory)):  # the driver's processes: one host
        marker = store.describe(MARKER_NAME)
        seen_data = store.read(MARKER_NAME)
        seen = (None if seen_data is None
                else parse_json(seen_data, marker, marker_repair(directory)))
        if seen is not None and _marker_driver(seen, marker, directory) == me:
            return False
        lease = Lease(directory, stale_after=settings.lease_stale_after)
        if lease.live_holder(me) is not None:
            return False  # a live instance owns the sink; it is not ours to touch
        Committer(sink, settings, fault).recover(owner["query_id"])
        store.write(MARKER_NAME, json.dumps({"driver": me.to_json(), "at": time.time()},
                                            sort_keys=True, indent=1).encode())
        return True


def _startup_lock(directory: Path | str) -> Path:
    """The lock the driver's processes take around recovery: beside a local log, in the
    temp directory for a log on object storage (the processes share one host)."""
    if is_remote(directory):
        digest = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"exactly-startup-{digest}.lock"
    return Path(directory) / "startup.lock"


def _marker_driver(seen: object, marker: str, directory: Path | str) -> ProcessId:
    data = require_fields(seen, marker, ("driver",), marker_repair(directory))
    try:
        return ProcessId.from_json(data["driver"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(marker, f"has a malformed driver ({exc!r})",
                               marker_repair(directory)) from None

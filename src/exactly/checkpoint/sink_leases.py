"""``exactly-job/sink-leases.json``: where the sinks of a checkpoint's query keep their leases.

A sink's lease is renewed by a heartbeat thread of the process that commits
(:class:`exactly.protocol.lease.LeaseKeeper`). Through PySpark's own
``writeStream.format("exactly.…")`` that is a sink-runner worker of Spark's, which outlives
the query (Spark keeps it for the next commit of any query) and which no one can tell that
the query stopped. The driver process can: when a run of the query ends it releases the
run's leases (:mod:`exactly.spark.run_end`), and the heartbeats in those workers, finding
their lease released, end. This file tells the driver where the leases are: the sink's first
commit of a run in a process adds its lease's location when the file does not name it yet.

It is a hint, never a decision: a missing or damaged file only means the leases are not
released early (they go stale as after a crash), and releasing a lease is checked against
its run (:meth:`~exactly.protocol.lease.Lease.release` leaves another run's lease alone).
"""

from __future__ import annotations

import json
import os

from exactly.checkpoint.layout import SINK_LEASES
from exactly.checkpoint.location import job_store

#: the most locations kept (a sink whose log moved leaves its old one behind)
MAX_LEASES = 16


def noted_leases(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The lease locations (directories or ``s3://`` prefixes) noted for ``checkpoint``'s
    sinks, newest last; ``[]`` when none are (or the file is damaged)."""
    data = job_store(checkpoint).read(SINK_LEASES)
    return [] if data is None else _parse(data)


def note_lease(checkpoint: str | os.PathLike[str], location: str) -> bool:
    """Add ``location`` (a sink's lease directory or prefix) to ``checkpoint``'s noted
    leases unless it is there; True when this call wrote it."""
    store = job_store(checkpoint)
    for _ in range(10):
        found = store.read_versioned(SINK_LEASES)
        leases = [] if found is None else _parse(found[0])
        if location in leases:
            return False
        leases = [*leases, location][-MAX_LEASES:]
        data = json.dumps({"leases": leases}, indent=1).encode()
        if store.swap(SINK_LEASES, data, None if found is None else found[1]):
            return True
    return False  # others kept writing it: one of them noted it, or the next run will


def _parse(data: bytes) -> list[str]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return []
    leases = value.get("leases") if isinstance(value, dict) else None
    return [str(x) for x in leases if isinstance(x, str)] if isinstance(leases, list) else []

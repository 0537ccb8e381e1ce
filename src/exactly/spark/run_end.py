"""When a run of a streaming query ends, its sinks' lease heartbeats stop and the leases are
released.

A sink renews its lease from a heartbeat thread of the process that commits
(:class:`~exactly.protocol.lease.LeaseKeeper`): the driver's own Python process for
``start_query`` and ``foreachBatch``, a sink-runner worker of Spark's for PySpark's own
``writeStream.format("exactly.…")``. Neither thread can see the query stop, and both
processes outlive it (a notebook, a pytest worker, ``exactly run`` restarting queries in its
driver; Spark keeps its workers for the next commit of any query), so without being told the
heartbeat renews the lease for as long as the process lives -- holding a claim that fences
nobody useful and, once the lease's store is gone, logging renewal failures forever.

:func:`end_query_run` tells them: it stops this process's heartbeats of the run and waits
until none is renewing (:func:`exactly.protocol.lease.end_run`), then releases the run's
leases -- those heartbeats renewed here and every one the sinks noted in the checkpoint
(:mod:`exactly.checkpoint.sink_leases`). A heartbeat in another process finds its lease
released at its next beat, writes nothing and ends. Who calls it:

* :class:`exactly.ops.query.ExactlyQuery` (``stop``, ``cancel``, ``await_termination`` once
  the query ended) and the supervisor, right after ``StreamingQuery.stop()`` returned: once
  those return, no heartbeat renews the run's leases;
* a ``StreamingQueryListener`` (:func:`watch_run_ends`, registered once per classic session
  by :func:`exactly.spark.formats.register`, ``start_query`` and ``TwoPhaseForeachBatch``)
  on ``onQueryTerminated``, for every other end: a plain ``query.stop()``, a failed query,
  an ``availableNow`` run that finished. Spark delivers that event asynchronously, so the
  release follows the stop by the listener bus's delay (milliseconds).

Releasing cannot break fencing: a run's end is final (Spark's run id is new at every start),
and a released lease fences its run exactly like a lost one (:meth:`Lease.release`).
On Spark Connect the listener is not registered: ``start_query``'s commits run in a Python
process of the server's that ends with the run, heartbeat included; ``ExactlyQuery.stop``
still releases the leases noted in the (shared) checkpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from exactly.checkpoint.sink_leases import noted_leases
from exactly.logs import log_event
from exactly.protocol.lease import Lease, end_run, release_quietly

logger = logging.getLogger("exactly.run_end")


def end_query_run(run_id: str, checkpoint: str | None) -> list[str]:
    """The run ``run_id`` of the query on ``checkpoint`` ended: stop this process's lease
    heartbeats of the run and release its leases (see the module). Returns the leases
    released. Never raises: a lease that cannot be released goes stale instead."""
    released = end_run(run_id)
    if checkpoint:
        try:
            noted = noted_leases(checkpoint)
        except Exception as exc:  # the checkpoint's store unreachable: logged, not raised
            log_event(logger, "sink_leases_unread", logging.WARNING, run_id=run_id,
                      checkpoint=checkpoint, error=repr(exc))
            noted = []
        for location in noted:
            if location not in released and release_quietly(Lease(location), run_id):
                released.append(location)
    return released


class _RunEndListener:
    """Spark's ``PythonStreamingQueryListener`` interface for Py4J: remembers each query's
    checkpoint when it starts, ends its run when it terminates (on a thread of its own, so
    that a slow store never holds up Spark's listener bus)."""

    def __init__(self, jspark: Any) -> None:
        self.jspark = jspark
        #: run id -> the checkpoint of its query (resolved while the query is active)
        self.checkpoints: dict[str, str] = {}

    def onQueryStarted(self, jevent: Any) -> None:
        try:  # delivered synchronously while the query starts: it is active now
            jquery = self.jspark.streams().get(jevent.id())
            if jquery is not None:
                root = str(jquery.streamingQuery().resolvedCheckpointRoot())
                self.checkpoints[jevent.runId().toString()] = root
        except Exception as exc:  # never fail a query's start over this
            log_event(logger, "run_end_watch_failed", logging.DEBUG, error=repr(exc))

    def onQueryProgress(self, jevent: Any) -> None:
        pass

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        run_id = jevent.runId().toString()
        checkpoint = self.checkpoints.pop(run_id, None)
        threading.Thread(target=end_query_run, args=(run_id, checkpoint), daemon=True,
                         name=f"exactly-run-end-{run_id[:8]}").start()

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def watch_run_ends(spark: Any) -> None:
    """Register the listener that ends the runs of ``spark``'s queries (see the module), once
    per session; nothing on Spark Connect."""
    from exactly.spark.connect import is_connect

    if is_connect(spark):
        return
    with _WATCH_LOCK:
        if getattr(spark, "_exactly_run_end_listener", None) is not None:
            return
        from pyspark.java_gateway import ensure_callback_server_started

        gateway = spark.sparkContext._gateway
        ensure_callback_server_started(gateway)  # the JVM calls the listener back through it
        jvm = gateway.jvm
        jlistener = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
            _RunEndListener(spark._jsparkSession))
        spark._jsparkSession.streams().addListener(jlistener)
        spark._exactly_run_end_listener = jlistener


_WATCH_LOCK = threading.Lock()

"""Keep Python's full garbage collections out of a streaming driver's epochs.

A driver process holds everything PySpark, Py4J, PyArrow and pandas loaded: hundreds of
thousands of objects that live as long as the process. Python's cyclic collector walks all of
them in each full (generation 2) collection: 33-40 ms here, five in a two-minute run at a
200 ms trigger, each inside some epoch's commit or tasks, so the epochs it hits are the
visibility tail (docs/performance.md, "The Python hand-off").

:func:`freeze_once` runs once per process, when the first epoch of a query reaches the
driver (everything is loaded by then): a full collection, then ``gc.freeze()``, which moves
every object alive at that moment into the permanent generation. Later collections walk
only what was allocated afterwards, and every object is still freed by reference counting
as before; only reference cycles among the frozen objects are never collected (they were
alive when frozen, and the driver keeps them anyway). PySpark's worker daemon does the same
before it forks (:mod:`exactly.spark.worker_daemon`).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_once() -> bool:
    """Collect, then freeze what is alive, the first time in this process; True if now."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen = True
        return True

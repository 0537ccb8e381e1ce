"""PySpark's Python worker daemon, importing PySpark from its installed package.

Spark starts every Python process it needs through a daemon (``pyspark.daemon``): one per
worker module -- data source lookup, creation, read planning, write planning, the streaming
sink's commits, the tasks -- and it puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on
their ``PYTHONPATH``. Python cannot cache compiled bytecode for modules in a zip file, so each
of these processes compiles PySpark from source: ~0.35 s of CPU per process here, six or more
processes before a streaming query's first epoch, on every driver start.

When PySpark is installed as a package (``pip install pyspark``), the zip is a copy of that
very package, whose compiled bytecode is cached. This module (Spark's
``spark.python.daemon.module``, set by :func:`exactly.spark_session`) moves PySpark's own zip
files behind the installed package on ``sys.path`` and runs PySpark's daemon unchanged; the
workers it forks inherit that path. Where PySpark is not an installed package (a Spark
distribution's ``python`` directory), the path is left as Spark set it.

It also imports, once, the modules every worker of an exactly job imports next (exactly's
data sources and sinks, PyArrow: :data:`PRELOAD`) before it forks any worker, so the task
workers start with them loaded instead of each importing them, and freezes them
(``gc.freeze``): the full collection PySpark runs after every task then skips them.
Nothing in them starts a thread or opens a connection at import. Spark starts its
data-source planning and sink-commit processes through PySpark's own daemon, not this one;
their path gets the same order from the ``sitecustomize`` of :mod:`exactly.spark.pyspark_path`.

Guarantees: the same PySpark code runs, only loaded from the installed package; the daemon's
protocol with the JVM is PySpark's own. ``EXACTLY_WORKER_DAEMON=off`` in the driver's
environment keeps Spark's daemon.
"""

from __future__ import annotations

import gc
import sys

from exactly.spark import worker_stderr
from exactly.spark.pyspark_path import prefer_installed_pyspark
from exactly.switches import switched_on

MODULE = "exactly.spark.worker_daemon"
#: imported by the daemon before it forks: what exactly's workers import first
PRELOAD = ("pyarrow", "pandas", "pyspark.worker", "pyspark.sql.pandas.serializers",
           "exactly.spark.formats")
#: ``off`` (or ``0``, ``false``, ``no``) keeps Spark's own daemon module
ENV = "EXACTLY_WORKER_DAEMON"


def enabled() -> bool:
    return switched_on(ENV)


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    """Import ``modules`` (before forking). A module that fails to import is left to the
    worker that needs it, which then reports the error itself."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            continue


def prepare() -> None:
    """What the daemon does before PySpark's manager forks its first worker: PySpark from
    its installed package, :data:`PRELOAD` imported, and all of it frozen.

    PySpark's workers run a full ``gc.collect()`` after every task (``pyspark/daemon.py``):
    with PyArrow, pandas and PySpark loaded it walks every object they hold (~35 ms here),
    which py-spy showed as ~90 % of a reused worker's CPU in a job of 100-row epochs.
    ``gc.freeze()`` moves what the daemon loaded out of the collector's reach (it lives as
    long as the process anyway); the workers collect only what they allocate."""
    sys.path[:] = prefer_installed_pyspark(sys.path)
    worker_stderr.install()  # no traceback for a worker whose connection the JVM closed
    preload()
    gc.freeze()


def main() -> None:
    prepare()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()

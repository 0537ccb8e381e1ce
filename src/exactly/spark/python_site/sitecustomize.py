"""Run by Python first in every process Spark starts for a session of exactly's.

:func:`exactly.spark.session.session_conf` puts this directory on the path of Spark's Python
processes (``spark.executorEnv.PYTHONPATH``); this moves Spark's PySpark zip behind the
installed package, whose bytecode is cached (:mod:`exactly.spark.pyspark_path`), then runs
the installation's own ``sitecustomize`` (the next one on the path), if any, as it would
have run without this one. It also drops PySpark's report of a flush to a worker connection
the JVM already closed (:mod:`exactly.spark.worker_stderr`). Where exactly cannot be
imported, both are left out.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _prefer_installed_pyspark() -> None:
    try:
        from exactly.spark.pyspark_path import prefer_installed_pyspark
    except Exception:  # exactly is not importable here (another interpreter): change nothing
        return
    sys.path[:] = prefer_installed_pyspark(sys.path)


def _quiet_closed_worker_pipes() -> None:
    try:
        from exactly.spark.worker_stderr import install
    except Exception:
        return
    install()


def _run_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_prefer_installed_pyspark()
_quiet_closed_worker_pipes()
_run_next_sitecustomize()

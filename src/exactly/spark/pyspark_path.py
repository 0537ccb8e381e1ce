"""Where Spark's Python processes import PySpark from: the installed package, not Spark's zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and Py4J's zip) first on the
``PYTHONPATH`` of every Python process it starts. Python cannot cache compiled bytecode for
modules in a zip file, so each such process compiles PySpark from source: about 0.8 s of CPU
more than importing the installed package (measured here), for each of the data-source
lookup, creation and planning workers, the streaming source runner, the commit runner and the
task workers' daemon -- several before a streaming query's first epoch, on every driver
start. When PySpark is an installed package (``pip install pyspark``), the zip is a copy of
that very package, so moving the zip behind it changes where PySpark is loaded from, never
which code runs. Where PySpark is not an installed package (a Spark distribution's ``python``
directory), the path is left as Spark set it.

Two carriers: exactly's worker daemon (:mod:`exactly.spark.worker_daemon`, the task workers)
and a ``sitecustomize`` in :data:`SITE_DIR`, which :func:`exactly.spark.session.session_conf`
puts on the path of every other Python process Spark starts (:func:`python_path`). This
module imports nothing of exactly: the ``sitecustomize`` runs it before anything else.
"""

from __future__ import annotations

import os

#: the directory of the ``sitecustomize`` that applies :func:`prefer_installed_pyspark` at the
#: start of every Python process Spark starts for a session of exactly's
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_site")
#: Spark's setting of its Python processes' environment, merged into their ``PYTHONPATH``
PYTHON_PATH_SETTING = "spark.executorEnv.PYTHONPATH"


def installed_pyspark_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are the zip files inside an installed PySpark package
    (``<site>/pyspark/python/lib/*.zip`` next to ``<site>/pyspark/__init__.py``)."""
    found = []
    for entry in path:
        if not entry.endswith(".zip"):
            continue
        lib = os.path.dirname(entry)
        package = os.path.dirname(os.path.dirname(lib))
        if (os.path.basename(lib) == "lib" and os.path.basename(package) == "pyspark"
                and os.path.isfile(os.path.join(package, "__init__.py"))):
            found.append(entry)
    return found


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` with an installed PySpark's own zip files moved to its end."""
    zips = installed_pyspark_zips(path)
    return [p for p in path if p not in zips] + zips


def python_path(current: str | None) -> str:
    """The ``PYTHONPATH`` setting of Spark's Python processes (:data:`PYTHON_PATH_SETTING`):
    :data:`SITE_DIR` first, then the entries of ``current`` (a user's own), in their order."""
    entries = [e for e in (current or "").split(os.pathsep) if e and e != SITE_DIR]
    return os.pathsep.join([SITE_DIR, *entries])

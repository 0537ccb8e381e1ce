"""A SparkSession with exactly's data sources registered, and defaults that fit the master.

Local masters (``local``, ``local[N]``, ``local[*]``, ``local-cluster[...]``) and masters on
a loopback address (``spark://127.0.0.1:7077``) get the defaults of a small single machine:
driver bound to 127.0.0.1, one shuffle partition per local core, adaptive execution off.
Any other master keeps Spark's own defaults (200 shuffle partitions, adaptive execution on)
and binds where Spark binds. The UI is off unless asked for.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

from exactly.errors import ConfigError
from exactly.spark import worker_daemon
from exactly.spark.class_archive import with_driver_options
from exactly.spark.formats import register
from exactly.spark.pyspark_path import PYTHON_PATH_SETTING, python_path

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: environment variable: JVM options added to every driver spark_session starts
DRIVER_JAVA_OPTIONS_ENV = "EXACTLY_DRIVER_JAVA_OPTIONS"
#: environment variable naming the default master
MASTER_ENV = "EXACTLY_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"
LOOPBACK = "127.0.0.1"
#: Spark's Python workers talk to their JVM over Unix domain sockets instead of loopback
#: TCP. Measured here (2 cores, PySpark 4.3): a 2-task ``mapInArrow`` job took 71-87 ms over
#: TCP and 27-43 ms over Unix sockets, the difference a ~40 ms stall per job on the TCP path
#: (docs/performance.md, "The Python hand-off"). Spark's own setting (4.1+), off by default;
#: classic sessions only (a Connect server takes it at its own start).
PYTHON_WORKER_SOCKETS = {"spark.python.unix.domain.socket.enabled": "true"}

_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def default_master() -> str:
    """The master ``spark-submit --master`` gave this program (when it runs under
    ``spark-submit``), else ``EXACTLY_SPARK_MASTER``, else ``local[2]``."""
    return submitted_master() or os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def submitted_master() -> str | None:
    """``spark.master`` as ``spark-submit`` set it for this Python program, or None when the
    program was not started by ``spark-submit`` (which starts the JVM first and hands Python
    its gateway through ``PYSPARK_GATEWAY_PORT``)."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM: its system properties
    return SparkConf().get("spark.master", None)


def local_cores(master: str) -> int | None:
    """Cores a local master runs tasks on (``local[N]`` -> N, ``local`` -> 1, ``local[*]`` ->
    this machine's cores, ``local-cluster[W,C,M]`` -> W*C); ``None`` for other masters."""
    text = master.strip()
    match = _LOCAL.match(text)
    if match:
        cores = match.group(1)
        if cores is None:
            return 1
        return (os.cpu_count() or 1) if cores == "*" else max(1, int(cores))
    match = _LOCAL_CLUSTER.match(text)
    if match:
        return max(1, int(match.group(1)) * int(match.group(2)))
    return None


def on_this_machine(master: str) -> bool:
    """True for local masters and masters whose host is a loopback address."""
    if local_cores(master) is not None:
        return True
    host = urlsplit(master.strip()).hostname
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def session_conf(master: str, *, ui: bool = False, shuffle_partitions: int | None = None,
                 adaptive: bool | None = None,
                 conf: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark settings :func:`spark_session` gives its builder (``conf`` last, so it
    overrides every other one). Pure: starts nothing.

    ``shuffle_partitions`` default: the local cores for a local master (``local[4]`` -> 4),
    Spark's own default elsewhere. ``adaptive`` default: off for masters on this machine
    (tiny epochs do not pay for re-planning), Spark's own default elsewhere. Driver bound to
    127.0.0.1 only for masters on this machine.
    """
    if shuffle_partitions is not None and shuffle_partitions < 1:
        raise ConfigError(f"spark_session: shuffle_partitions must be >= 1, got "
                          f"{shuffle_partitions}; omit it for the master's default")
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        **PYTHON_WORKER_SOCKETS,
    }
    if worker_daemon.enabled():  # Spark's Python processes load PySpark's cached bytecode
        settings["spark.python.daemon.module"] = worker_daemon.MODULE
    local = on_this_machine(master)
    if local:
        settings["spark.driver.host"] = LOOPBACK
        settings["spark.driver.bindAddress"] = LOOPBACK
    partitions = shuffle_partitions if shuffle_partitions is not None else local_cores(master)
    if partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(partitions)
    if adaptive is None and local:
        adaptive = False
    if adaptive is not None:
        settings["spark.sql.adaptive.enabled"] = "true" if adaptive else "false"
    settings.update(conf or {})
    if worker_daemon.enabled():  # ... and so do the other Python processes (a user's path kept)
        settings[PYTHON_PATH_SETTING] = python_path(settings.get(PYTHON_PATH_SETTING))
    return settings


def spark_session(master: str | None = None, app_name: str = "exactly",
                  conf: dict[str, str] | None = None, *, ui: bool = False,
                  shuffle_partitions: int | None = None,
                  adaptive: bool | None = None, s3a: bool = False,
                  kafka: bool = False, remote: str | None = None) -> SparkSession:
    """Get or create a session with exactly's sources registered (settings:
    :func:`session_conf`).

    ``kafka=True`` adds Spark's Kafka connector (``format("kafka")``,
    :func:`exactly.connectors.kafka.source.read_kafka`); ``s3a=True`` adds Spark's S3A file
    system, for checkpoints on ``s3a://`` (settings from the ``AWS_*`` environment
    variables: :func:`exactly.spark.s3a.s3a_conf`). Both ask Spark for their jars with
    ``spark.jars.packages``: the exact Maven coordinates for the installed PySpark, resolved
    from Maven Central into Spark's Ivy cache when the JVM starts (the first start downloads,
    later ones find them cached; :mod:`exactly.spark.packages`), or, when
    ``EXACTLY_KAFKA_CONNECTOR_JARS`` / ``EXACTLY_S3A_JARS`` name a directory of jars, those
    jars with no resolution (a cluster without Maven Central). Raises ConfigError for a
    PySpark version exactly has no coordinates for; a failed resolution fails the start with
    Spark's error (an unreachable repository, a missing artifact). Most sessions need
    neither: each start with them pays the resolution (half a second to a second warm).

    ``master`` defaults to the one ``spark-submit --master`` gave (under ``spark-submit``),
    else ``EXACTLY_SPARK_MASTER``, else ``local[2]``. ``ui=True`` keeps
    Spark's web UI (on 127.0.0.1 for masters on this machine). ``conf`` overrides every
    other setting, except the lists ``spark.jars``, ``spark.jars.packages`` and
    ``spark.jars.excludes``, which it extends. Settings apply when this call creates the
    session; an existing session is returned as it is, except for the SQL settings
    ``getOrCreate`` applies to it. Python
    workers run the interpreter of this process (``PYSPARK_PYTHON``), so they see the same
    installed packages, exactly included. The driver loads its classes from exactly's class
    archive when one is built (:mod:`exactly.spark.class_archive`).

    ``remote`` (default: ``SPARK_REMOTE``) opens a Spark Connect session to that
    ``sc://`` server instead (:mod:`exactly.spark.connect`): the server owns the master, the
    UI and every static setting; exactly's SQL defaults and ``conf`` are applied per session.
    Raises ConfigError for ``master``, ``kafka=True`` or ``s3a=True`` with a remote (jars and
    the master are the server's, fixed at its start) and for a ``conf`` setting the server
    fixed to another value.
    """
    from exactly.spark.connect import remote_url

    url = remote_url(remote)
    if url is not None:
        return _remote_session(url, app_name, conf or {}, master=master,
                               shuffle_partitions=shuffle_partitions, adaptive=adaptive,
                               s3a=s3a, kafka=kafka)
    master = master or default_master()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if on_this_machine(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # the UI and block manager too
    builder = SparkSession.builder.master(master).appName(app_name)
    conf = _with_jars(conf or {}, kafka=kafka, s3a=s3a)
    settings = session_conf(master, ui=ui, shuffle_partitions=shuffle_partitions,
                            adaptive=adaptive, conf=conf)
    settings = with_env_java_options(settings)
    settings = with_driver_options(settings)  # the class archive, when built: a faster start
    jars = _with_state_writer(settings.get("spark.jars", ""))
    if jars:
        settings["spark.jars"] = jars
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with _driver_jvm_python_path():
            spark = builder.getOrCreate()
    except Exception as exc:  # PySparkRuntimeError: [JAVA_GATEWAY_EXITED] ...
        if settings.get("spark.jars.packages") and "JAVA_GATEWAY_EXITED" in str(exc):
            raise ConfigError(
                "Spark's driver did not start; it resolves spark.jars.packages ("
                f"{settings['spark.jars.packages']}) from Maven Central first, and the lines "
                "above say why that failed ('download failed', 'unresolved dependency': no "
                "network, or a repository that lacks them). Reach Maven Central or a mirror "
                "(spark.jars.repositories), or set EXACTLY_KAFKA_CONNECTOR_JARS / "
                "EXACTLY_S3A_JARS to directories of the jars (exactly packages --download)"
            ) from exc
        raise
    ship_resolved_jars(spark)
    spark.sparkContext.setLogLevel(os.environ.get("EXACTLY_SPARK_LOG_LEVEL", "ERROR"))
    register(spark)
    return spark


@contextlib.contextmanager
def _driver_jvm_python_path() -> Iterator[None]:
    """While a new driver JVM starts: this process's ``PYTHONPATH`` with exactly's
    ``sitecustomize`` first (:func:`exactly.spark.pyspark_path.python_path`), for the JVM to
    inherit. Spark starts one Python process per driver outside ``spark.executorEnv``: the
    data-source lookup of the session's first data source, which then imports the installed
    PySpark too instead of compiling it from Spark's zip. This process's own environment is
    restored once the JVM runs; nothing changes when a JVM is already running (an existing
    session, ``spark-submit``) or the worker daemon is switched off."""
    from pyspark import SparkContext

    if (SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT")
            or not worker_daemon.enabled()):
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = python_path(before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _remote_session(url: str, app_name: str, conf: dict[str, str], *, master: str | None,
                    shuffle_partitions: int | None, adaptive: bool | None, s3a: bool,
                    kafka: bool) -> SparkSession:
    """:func:`spark_session` on a Spark Connect server."""
    from exactly.spark.connect import connect_session, refuse

    if master:
        raise refuse(f"master {master!r}", "the Spark Connect server runs the driver and "
                     "chose its master when it started", "Drop --master (or "
                     "EXACTLY_SPARK_MASTER), or drop --remote / SPARK_REMOTE for a session "
                     "of your own")
    if kafka or s3a:
        what = "Spark's Kafka connector" if kafka else "S3A (s3a:// checkpoints)"
        raise refuse(what, "its jars must be on the server's class path, which a client "
                     "cannot change", "Start the Spark Connect server with them (`exactly "
                     "packages --kafka --s3a` prints the --packages to give it); exactly's "
                     "own Kafka source and sink (format exactly.kafka) need no jars")
    sql_conf = {"spark.sql.execution.arrow.pyspark.enabled": "true"}
    if shuffle_partitions is not None:
        if shuffle_partitions < 1:
            raise ConfigError(f"spark_session: shuffle_partitions must be >= 1, got "
                              f"{shuffle_partitions}")
        conf = {"spark.sql.shuffle.partitions": str(shuffle_partitions), **conf}
    if adaptive is not None:
        conf = {"spark.sql.adaptive.enabled": "true" if adaptive else "false", **conf}
    spark = connect_session(url, app_name, sql_conf, conf)
    register(spark)
    return spark


def ship_resolved_jars(spark: SparkSession) -> list[str]:
    """Hand the executors the jars ``spark.jars.packages`` resolved; returns those added.

    spark-submit resolves the packages, puts their jars on the driver's class path and
    lists them in the JVM's ``spark.jars`` property; but PySpark's builder sets ``spark.jars``
    again from its own settings (exactly's state writer, a user's jars), and the jars the
    executors fetch follow that list, so the resolved ones would reach the driver only (a
    Kafka source or S3A failing on a cluster's executors). Added here with ``addJar``, which
    executors fetch before their next task; jars already shared are left alone."""
    jsc = spark.sparkContext._jsc.sc()
    jvm: Any = spark.sparkContext._jvm
    started_with = str(jvm.java.lang.System.getProperty("spark.jars") or "")
    shared = {j.rsplit("/", 1)[-1] for j in str(jsc.listJars().mkString(",")).split(",") if j}
    added = []
    for jar in (j for j in started_with.split(",") if j):
        if jar.rsplit("/", 1)[-1] not in shared:
            jsc.addJar(jar)
            added.append(jar)
    return added


def _with_jars(conf: dict[str, str], *, kafka: bool, s3a: bool) -> dict[str, str]:
    """``conf`` over the settings that load the Kafka connector and S3A (lists merged)."""
    from exactly.maven import merged_conf

    base: dict[str, str] = {}
    if kafka:
        from exactly.connectors.kafka.jars import connector_conf

        base = merged_conf(base, connector_conf())
    if s3a:
        from exactly.spark.s3a import s3a_conf

        base = merged_conf(base, s3a_conf())
    return merged_conf(base, conf) if base else conf


def with_env_java_options(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` with ``EXACTLY_DRIVER_JAVA_OPTIONS`` appended to
    ``spark.driver.extraJavaOptions`` (after the options given in ``conf``).

    For drivers whose JVM lives seconds, not days -- test suites, one-shot commands --
    ``-XX:TieredStopAtLevel=1`` (JIT compiler C1 only) saves the CPU the optimizing compiler
    spends on code that never runs long; exactly's test suite sets it. JVM options change how
    Spark runs, never what it computes."""
    extra = os.environ.get(DRIVER_JAVA_OPTIONS_ENV, "").strip()
    if not extra:
        return settings
    current = settings.get(DRIVER_JAVA_OPTIONS, "")
    return {**settings, DRIVER_JAVA_OPTIONS: f"{current} {extra}".strip()}


def _with_state_writer(jars: str) -> str:
    """``spark.jars`` plus exactly's state writer (savepoint restores that rescale or switch
    the state backend use it; compiled once, cached; left out without a JDK)."""
    from exactly.spark.state_writer_jar import ensure_jar

    jar = ensure_jar()
    listed = [j for j in jars.split(",") if j]
    if jar is not None and str(jar) not in listed:
        listed.append(str(jar))
    return ",".join(listed)

"""A class-data-sharing archive of the driver's classes: a Spark driver that starts faster.

A PySpark driver JVM loads tens of thousands of classes from PySpark's jars before its
first epoch, and it does so again on every start: after every crash, on every restart of
``exactly run``, in every test. The JDK can map classes from an archive instead of loading
them (application class-data sharing, JDK 13+: ``-XX:ArchiveClassesAtExit`` writes one,
``-XX:SharedArchiveFile`` uses it). :func:`build` writes one archive per PySpark version and
Java runtime into exactly's cache (``scripts/setup.sh`` does it once); :func:`driver_options`
gives the option that uses it, which :func:`exactly.spark_session` adds to
``spark.driver.extraJavaOptions``.

Guarantees: the archive changes how classes are loaded, never which: the JDK checks the
archive against the running JVM and classpath and ignores one that does not match (then the
driver starts as it would without it; its messages are switched off). A missing archive or
``EXACTLY_CLASS_ARCHIVE=off`` leaves the driver's options alone. Executors of a cluster
master are not touched (their classpath differs).

``python -m exactly.spark.class_archive`` builds the archive if it is missing and prints its
path (``--force`` rebuilds it).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from exactly.cache import user_cache
from exactly.errors import ConfigError
from exactly.switches import switched_on

log = logging.getLogger(__name__)

#: ``off`` (or ``0``, ``false``, ``no``) disables the archive
ENV = "EXACTLY_CLASS_ARCHIVE"
#: the JDK's messages about the archive stay out of the driver's stderr
QUIET_JVM_OPTIONS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: archives kept in the cache: one per virtualenv, PySpark version and Java runtime in use
KEEP_ARCHIVES = 3


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.is_file():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found else None


def spark_jars() -> Path:
    """The directory of PySpark's jars: the driver's classpath."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _file_identity(path: Path) -> str:
    stat = path.stat()
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


def archive_path() -> Path | None:
    """Where the archive for this PySpark installation and this Java runtime lives (None
    without java).

    The JDK ignores an archive whose classpath differs from the running one: another
    directory, or a jar of another size or modification time (a reinstalled virtualenv, a
    new clone). The name is therefore a digest of the java binary and of every jar's path,
    size and modification time, so that such an installation builds its own archive instead
    of finding one the JVM would silently refuse."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    parts = [pyspark.__version__, _file_identity(java)]
    jars = spark_jars()
    if jars.is_dir():
        parts += [_file_identity(jar) for jar in sorted(jars.glob("*.jar"))]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return user_cache("jvm") / f"spark-driver-{pyspark.__version__}-{digest}.jsa"


def enabled() -> bool:
    return switched_on(ENV)


def driver_options() -> str | None:
    """The JVM options that load the driver's classes from the archive; None when it is
    disabled or not built."""
    if not enabled():
        return None
    path = archive_path()
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path} {QUIET_JVM_OPTIONS}"


def with_driver_options(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` with the archive's options appended to ``spark.driver.extraJavaOptions``
    (a user's own options stay first; one that already names an archive is left alone)."""
    options = driver_options()
    current = settings.get("spark.driver.extraJavaOptions", "")
    if options is None or "SharedArchiveFile" in current or "ArchiveClassesAtExit" in current:
        return settings
    return {**settings, "spark.driver.extraJavaOptions": f"{current} {options}".strip()}


def build(*, force: bool = False, timeout: float = 600) -> Path | None:
    """Write the archive (if missing, or ``force``) by running a short representative
    workload in a driver that dumps its loaded classes at exit; returns its path, or None
    without java. Written to a temporary name and renamed: a killed build leaves no archive.
    Raises ConfigError naming the driver's output when the build fails."""
    target = archive_path()
    if target is None:
        return None
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exactly-cds-", dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        env = {**os.environ, ENV: "off", "PYSPARK_PYTHON": sys.executable}
        result = subprocess.run(
            [sys.executable, "-m", "exactly.spark.class_archive_workload", str(staged)],
            capture_output=True, text=True, timeout=timeout, env=env)
        if result.returncode != 0 or not staged.is_file():
            raise ConfigError(f"building the driver's class archive failed (exit "
                              f"{result.returncode}); run with {ENV}=off to do without it:\n"
                              f"{result.stderr[-3000:]}")
        os.replace(staged, target)
    prune(target.parent, keep=KEEP_ARCHIVES)
    return target


def prune(directory: Path, *, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest archives in ``directory`` (each is ~170 MB); returns
    the deleted ones. Other virtualenvs, PySpark versions or Java runtimes on the machine keep
    theirs (a second clone does not take the first one's archive away); older ones are rebuilt
    when needed."""
    found = sorted(directory.glob("spark-driver-*.jsa"), key=lambda p: p.stat().st_mtime,
                   reverse=True)
    for old in found[keep:]:
        old.unlink(missing_ok=True)
    return found[keep:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly.spark.class_archive",
                                     description="Build the Spark driver's class archive.")
    parser.add_argument("--force", action="store_true", help="rebuild it even if it exists")
    args = parser.parse_args(argv)
    path = build(force=args.force)
    print(path if path is not None else "no java: no class archive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

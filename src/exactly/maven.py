"""Jars the Spark way: Maven coordinates that Spark resolves and caches itself
(``spark.jars.packages``, Ivy, from Maven Central), with what PySpark already ships left out.

A connector that needs jars PySpark lacks names them as :class:`Packages` per PySpark version
(its own table: :mod:`exactly.connectors.kafka.jars`, :mod:`exactly.spark.s3a`);
:func:`packages_conf` turns them into the three Spark settings a session (or
``spark-submit --conf``) needs:

* ``spark.jars.packages`` -- the exact coordinates; Spark resolves them when the driver's JVM
  starts, downloads what its Ivy cache lacks (``~/.ivy2.5.2``, or ``spark.jars.ivy``) and
  hands the jars to the driver and executors (``spark.jars``);
* ``spark.jars.excludes`` -- transitive dependencies whose jars PySpark already has (the
  Hadoop client, lz4, snappy, slf4j, netty, ...): two copies of a class on the class path
  are a conflict waiting to happen;
* ``spark.jars.ivySettings`` -- exactly's Ivy settings (:func:`ivy_settings_file`): Maven
  Central only. Spark's built-in settings also look in ``~/.m2/repository`` first, where
  Maven leaves a pom without its jar, and resolution then fails (``download failed:
  org.slf4j#slf4j-api;2.0.17!slf4j-api.jar``); and in repos.spark-packages.org. A mirror
  goes in ``spark.jars.repositories`` (Spark adds it after Maven Central) or in Ivy
  settings of one's own (``spark.jars.ivySettings`` in the session's ``conf`` wins).

Spark reads these settings only when the driver's JVM starts; a session created earlier
keeps the jars it started with.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from exactly.cache import user_cache
from exactly.errors import ConfigError

PACKAGES = "spark.jars.packages"
EXCLUDES = "spark.jars.excludes"
IVY_SETTINGS = "spark.jars.ivySettings"
JARS = "spark.jars"
#: settings whose value is a comma-separated list: merged, never overwritten
LIST_SETTINGS = (PACKAGES, EXCLUDES, JARS)
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

IVY_SETTINGS_XML = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- exactly's Ivy settings for spark.jars.packages (exactly.maven): Maven Central only, no
     ~/.m2 (a pom there without its jar fails the resolution), no spark-packages.org. Spark
     sets the cache (spark.jars.ivy, else ~/.ivy2.5.2) and adds spark.jars.repositories
     after this resolver. The resolver's name is that of Spark's own Maven Central resolver,
     so that a cache Spark filled before stays usable. Cache entries are locked (NIO file
     locks): drivers starting at once on a fresh cache would otherwise fail each other's
     downloads. Written by exactly; edits are overwritten. -->
<ivysettings>
  <settings defaultResolver="central"/>
  <caches lockStrategy="artifact-lock-nio"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" usepoms="true"
             root="{MAVEN_CENTRAL}"/>
  </resolvers>
</ivysettings>
"""


@dataclass(frozen=True)
class Packages:
    """Maven coordinates (``group:artifact:version``) Spark resolves with their transitive
    dependencies, and the ``group:artifact`` patterns (``*`` allowed) left out of them."""

    coordinates: tuple[str, ...]
    excludes: tuple[str, ...] = ()

    def __add__(self, other: Packages) -> Packages:
        return Packages(_union(self.coordinates, other.coordinates),
                        _union(self.excludes, other.excludes))


def pyspark_version() -> str:
    """The installed PySpark's version (``4.3.0``)."""
    import pyspark

    return str(pyspark.__version__)


def for_pyspark(table: Mapping[str, Packages], what: str, override: str,
                version: str | None = None) -> Packages:
    """``table``'s packages for the installed PySpark (or ``version``).

    Raises ConfigError for a version the table does not know, naming the versions it knows,
    the offline override (``override``, a directory of jars) and ``spark.jars.packages``."""
    version = version or pyspark_version()
    if version in table:
        return table[version]
    raise ConfigError(
        f"{what}: exactly knows the Maven coordinates for PySpark {', '.join(sorted(table))}, "
        f"not for the installed PySpark {version}; install one of those, or set {override} "
        f"to a directory holding the jars, or start the session with spark.jars.packages "
        f"of your own")


def offline_dir(env: str, what: str, marker: str, flag: str) -> Path:
    """The directory environment variable ``env`` names (the offline override of a package
    set: jars instead of resolution), checked to hold a jar matching ``marker`` (a glob);
    raises ConfigError naming the fix (``exactly packages --<flag> --download``) when it is
    unset or lacks that jar."""
    configured = os.environ.get(env)
    if not configured:
        raise ConfigError(f"{env} is not set: it names a directory holding {what} for a "
                          f"cluster without Maven Central; without it, "
                          f"spark_session({flag}=True) resolves them from Maven Central")
    directory = Path(configured).expanduser()
    if not any(directory.glob(marker)):
        raise ConfigError(
            f"{what} are missing in {directory} (from {env}): fill it with "
            f"`exactly packages --{flag} --download {directory}` on a machine that reaches "
            f"Maven Central, or unset {env} to let Spark resolve them")
    return directory


def ivy_settings_file() -> Path:
    """exactly's Ivy settings (:data:`IVY_SETTINGS_XML`), written to
    ``<cache>/exactly/ivy/ivysettings.xml`` when missing or different (atomically: a
    concurrent reader sees the old or the new file, never half of one)."""
    path = user_cache("ivy") / "ivysettings.xml"
    try:
        if path.read_text() == IVY_SETTINGS_XML:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(IVY_SETTINGS_XML)
    tmp.replace(path)
    return path


def packages_conf(packages: Packages) -> dict[str, str]:
    """The Spark settings that resolve ``packages`` from Maven Central when the JVM starts
    (writes :func:`ivy_settings_file`). Empty for no coordinates."""
    if not packages.coordinates:
        return {}
    conf = {PACKAGES: ",".join(packages.coordinates), IVY_SETTINGS: str(ivy_settings_file())}
    if packages.excludes:
        conf[EXCLUDES] = ",".join(packages.excludes)
    return conf


def merged_conf(base: Mapping[str, str], top: Mapping[str, str]) -> dict[str, str]:
    """``base`` updated with ``top``, except that the list settings (``spark.jars``,
    ``spark.jars.packages``, ``spark.jars.excludes``) are joined, ``base``'s entries first,
    duplicates dropped: asking for the Kafka connector and S3A, or adding one's own package,
    keeps the others."""
    merged = {**base, **top}
    for key in LIST_SETTINGS:
        if key in base and key in top:
            merged[key] = ",".join(_union(_split(base[key]), _split(top[key])))
    return merged


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _union(first: Iterable[str], second: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*first, *second]))

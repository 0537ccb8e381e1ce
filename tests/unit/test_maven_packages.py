"""Jars the Spark way (exactly.maven, exactly.spark.packages): the coordinates for the
installed PySpark, the exclusions checked against the jars PySpark ships, the Ivy settings,
the offline overrides and how the settings combine. No Spark started."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from exactly import maven
from exactly.cli import main
from exactly.connectors.kafka import jars as kafka_jars
from exactly.errors import ConfigError
from exactly.spark import packages, s3a
from exactly.spark.session import _with_jars

PYSPARK_JARS = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
#: excluded on purpose although PySpark lacks them: the 659 MB AWS SDK bundle (S3A gets the
#: modules it loads instead) and the optional native TLS library hadoop-aws declares
NOT_SHIPPED_ON_PURPOSE = {"software.amazon.awssdk:bundle", "org.wildfly.openssl:wildfly-openssl"}
#: excluded artifacts whose classes PySpark ships under another artifact's name
SHIPPED_AS = {"commons-logging": "jcl-over-slf4j"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(kafka_jars.CONNECTOR_ENV, raising=False)
    monkeypatch.delenv(s3a.JARS_ENV, raising=False)


def test_the_installed_pyspark_has_coordinates_for_the_kafka_connector_and_s3a():
    version = pyspark.__version__
    assert version in kafka_jars.CONNECTOR_PACKAGES, "a PySpark upgrade needs a row here"
    assert version in s3a.S3A_PACKAGES, "a PySpark upgrade needs a row here"
    # hadoop-aws at the version of the Hadoop client PySpark ships
    hadoop = next(c for c in s3a.S3A_PACKAGES[version].coordinates if ":hadoop-aws:" in c)
    assert f"hadoop-client-api-{hadoop.rsplit(':', 1)[1]}.jar" in PYSPARK_JARS


@pytest.mark.parametrize("table", [kafka_jars.CONNECTOR_PACKAGES, s3a.S3A_PACKAGES],
                         ids=["kafka", "s3a"])
def test_every_exclusion_is_a_jar_pyspark_already_ships_or_a_named_deliberate_one(table):
    for exclude in table[pyspark.__version__].excludes:
        if exclude in NOT_SHIPPED_ON_PURPOSE:
            continue
        group, name = exclude.split(":")
        name = SHIPPED_AS.get(name, name)
        prefix = f"{group.split('.')[-1]}-" if name == "*" else f"{name}-"
        assert any(jar.startswith(prefix) for jar in PYSPARK_JARS), exclude


def test_an_unknown_pyspark_version_is_refused_naming_the_offline_override():
    with pytest.raises(ConfigError, match=kafka_jars.CONNECTOR_ENV) as error:
        kafka_jars.connector_packages("3.9.9")
    assert "spark.jars.packages" in str(error.value)
    with pytest.raises(ConfigError, match=s3a.JARS_ENV):
        s3a.s3a_packages("3.9.9")


def test_kafka_asks_spark_for_exact_coordinates_through_exactlys_ivy_settings():
    conf = kafka_jars.connector_conf()
    assert conf[maven.PACKAGES] == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert "org.apache.hadoop:hadoop-client-runtime" in conf[maven.EXCLUDES].split(",")
    assert maven.JARS not in conf  # nothing from a local directory
    settings = ET.parse(conf[maven.IVY_SETTINGS]).getroot()
    resolvers = settings.find("resolvers")
    assert resolvers is not None
    # Maven Central only: no ~/.m2 (a pom without its jar there fails the resolution)
    assert [r.get("root") for r in resolvers] == [maven.MAVEN_CENTRAL]
    assert settings.find("settings").get("defaultResolver") == resolvers[0].get("name")
    # drivers sharing a cache lock its entries (tests/spark/test_packages_concurrent.py)
    assert settings.find("caches").get("lockStrategy") == "artifact-lock-nio"


def test_the_ivy_settings_file_is_rewritten_when_it_differs(tmp_path):
    path = maven.ivy_settings_file()
    path.write_text("<ivysettings/>")
    assert maven.ivy_settings_file() == path
    assert path.read_text() == maven.IVY_SETTINGS_XML


def test_the_offline_directories_replace_resolution(monkeypatch, tmp_path):
    kafka_dir, s3a_dir = tmp_path / "kafka", tmp_path / "s3a"
    kafka_dir.mkdir()
    s3a_dir.mkdir()
    (kafka_dir / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    (kafka_dir / "kafka-clients-3.9.2.jar").touch()
    (s3a_dir / "org.apache.hadoop_hadoop-aws-3.5.0.jar").touch()  # as download() names it
    monkeypatch.setenv(kafka_jars.CONNECTOR_ENV, str(kafka_dir))
    monkeypatch.setenv(s3a.JARS_ENV, str(s3a_dir))
    conf = packages.packages_conf(kafka=True, s3a=True)
    assert conf == {maven.JARS: ",".join(sorted(str(p) for p in kafka_dir.glob("*.jar"))),
                    "spark.driver.extraClassPath": f"{s3a_dir}/*",
                    "spark.executor.extraClassPath": f"{s3a_dir}/*"}


def test_an_offline_directory_without_the_jars_names_the_download_command(monkeypatch,
                                                                           tmp_path):
    monkeypatch.setenv(kafka_jars.CONNECTOR_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="exactly packages --kafka --download"):
        kafka_jars.connector_conf()
    monkeypatch.setenv(s3a.JARS_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="exactly packages --s3a --download"):
        s3a.jars_conf()


def test_kafka_s3a_and_a_users_own_package_combine_instead_of_overwriting():
    mine = {maven.PACKAGES: "io.delta:delta-spark_2.13:4.0.0", maven.EXCLUDES: "x:y",
            "spark.sql.shuffle.partitions": "7"}
    conf = _with_jars(mine, kafka=True, s3a=True)
    wanted = conf[maven.PACKAGES].split(",")
    assert wanted == [*packages.kafka_packages(), *packages.s3a_packages(),
                      "io.delta:delta-spark_2.13:4.0.0"]
    excluded = conf[maven.EXCLUDES].split(",")
    assert "x:y" in excluded and "io.netty:*" in excluded
    assert "org.apache.hadoop:hadoop-client-runtime" in excluded
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert _with_jars(mine, kafka=False, s3a=False) == mine


def test_exactly_packages_prints_spark_submit_arguments():
    out = CliRunner().invoke(main, ["packages", "--kafka", "--submit"])
    assert out.exit_code == 0, out.output
    args = out.output.split()
    assert args[:2] == ["--packages", "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"]
    assert args[2] == "--exclude-packages"
    assert args[4:] == ["--conf", f"spark.jars.ivySettings={maven.ivy_settings_file()}"]
    assert CliRunner().invoke(main, ["packages"]).exit_code == 2  # nothing named

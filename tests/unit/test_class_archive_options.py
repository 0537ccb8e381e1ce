"""Which JVM options the driver gets from the class archive (exactly.spark.class_archive),
computed without starting Spark; the archive at work is in tests/spark/test_class_archive.py."""

from __future__ import annotations

import os

import pytest

from exactly.spark import class_archive

OPTIONS = "spark.driver.extraJavaOptions"


@pytest.fixture
def built(tmp_path, monkeypatch):
    """An archive file where archive_path() looks (a cache in tmp_path)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(class_archive.ENV, raising=False)
    path = class_archive.archive_path()
    assert path is not None and str(path).startswith(str(tmp_path))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    return path


def test_a_built_archive_is_added_after_the_users_own_driver_options(built):
    settings = class_archive.with_driver_options({OPTIONS: "-Xss4m", "other": "x"})
    assert settings[OPTIONS].startswith("-Xss4m -XX:SharedArchiveFile=")
    assert str(built) in settings[OPTIONS] and "-Xlog:cds=off" in settings[OPTIONS]
    assert settings["other"] == "x"


@pytest.mark.parametrize("value", ["off", "0", "FALSE", "no"])
def test_the_environment_switch_turns_the_archive_off(built, monkeypatch, value):
    monkeypatch.setenv(class_archive.ENV, value)
    assert class_archive.with_driver_options({}) == {}


def test_no_archive_built_leaves_the_options_alone(built):
    built.unlink()
    assert class_archive.with_driver_options({OPTIONS: "-Xss4m"}) == {OPTIONS: "-Xss4m"}


def test_a_user_naming_an_archive_of_their_own_keeps_it(built):
    own = {OPTIONS: "-XX:SharedArchiveFile=/opt/mine.jsa"}
    assert class_archive.with_driver_options(own) == own


def test_the_archive_is_per_pyspark_version_and_java_runtime(built, tmp_path, monkeypatch):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    other = class_archive.archive_path()
    assert other is not None and other != built and other.parent == built.parent


def test_a_reinstalled_pyspark_gets_its_own_archive(built, tmp_path, monkeypatch):
    """The JDK refuses an archive when a jar's path, size or modification time differs from
    the build's (a fresh virtualenv): such an installation must not find the old archive."""
    jars = tmp_path / "venv" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"jar")
    monkeypatch.setattr(class_archive, "spark_jars", lambda: jars)
    first = class_archive.archive_path()
    assert first is not None and first != built
    os.utime(jars / "spark-core.jar", ns=(1, 1))
    assert class_archive.archive_path() != first
    moved = tmp_path / "elsewhere" / "jars"
    jars.rename(tmp_path / "venv" / "gone")
    moved.mkdir(parents=True)
    (moved / "spark-core.jar").write_bytes(b"jar")
    monkeypatch.setattr(class_archive, "spark_jars", lambda: moved)
    assert class_archive.archive_path() not in (first, built)

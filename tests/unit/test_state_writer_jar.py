"""Which state writer jar a session gets (:func:`exactly.spark.state_writer_jar.ensure_jar`):
the wheel's when it was built for the installed PySpark and this source; else one compiled
into the user cache, by ``javac`` or by the ``java`` runtime's own compiler module; else
None (no compiler at all)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pyspark
import pytest

from exactly.spark import state_writer_jar as sw
from exactly.spark.jvm_compile import source_sha256


def packaged(tmp_path: Path, monkeypatch, pyspark_version: str) -> Path:
    """A wheel's jar and metadata (built for ``pyspark_version``) in place of the package's."""
    jar, metadata = tmp_path / "pkg" / "exactly-state-writer.jar", tmp_path / "pkg" / "m.json"
    jar.parent.mkdir()
    jar.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: never opened here
    metadata.write_text(json.dumps({"pyspark": pyspark_version,
                                    "source_sha256": source_sha256(sw.SOURCE)}))
    monkeypatch.setattr(sw, "PACKAGED_JAR", jar)
    monkeypatch.setattr(sw, "PACKAGED_METADATA", metadata)
    return jar


def path_with(tmp_path: Path, monkeypatch, *tools: str) -> None:
    """PATH holding only ``tools`` (symlinks to this machine's), JAVA_HOME unset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} is needed for this test"
        (bin_dir / tool).symlink_to(Path(found).resolve())
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_the_wheels_jar_is_used_when_built_for_the_installed_pyspark(tmp_path, monkeypatch):
    jar = packaged(tmp_path, monkeypatch, pyspark.__version__)
    path_with(tmp_path, monkeypatch)  # no compiler: nothing else could provide one
    assert sw.ensure_jar() == jar


def test_a_jar_built_for_another_pyspark_is_not_used_and_without_a_compiler_there_is_none(
        tmp_path, monkeypatch):
    packaged(tmp_path, monkeypatch, "3.5.0")
    path_with(tmp_path, monkeypatch)
    assert sw.ensure_jar() is None


@pytest.mark.jvm  # the compiler runs in a JVM for seconds: not in the fast lane
def test_without_javac_the_java_runtimes_compiler_module_builds_the_jar_into_the_cache(
        tmp_path, monkeypatch):
    """Debian's openjdk-17-jre-headless has no javac but ships the jdk.compiler module."""
    monkeypatch.setattr(sw, "PACKAGED_JAR", tmp_path / "none.jar")  # a checkout: no wheel jar
    path_with(tmp_path, monkeypatch, "java")
    jar = sw.ensure_jar()
    assert jar is not None and jar == sw.jar_path()
    assert jar.is_relative_to(tmp_path / "cache")
    assert "dev/exactly/state/StateWriter.class" in zipfile.ZipFile(jar).namelist()

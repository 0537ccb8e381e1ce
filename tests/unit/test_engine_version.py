"""A savepoint's Spark version against the restoring one: an older minor version of the same
major restores (and the plan names the conversion), a newer one or another major version is
refused naming both versions. No Spark: manifests and plans only."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.errors import SavepointError
from exactly.savepoints.engine import engine_change, parse_version
from exactly.savepoints.manifest import Manifest
from exactly.savepoints.restore import plan_restore

pytestmark = pytest.mark.fast


def manifest(spark_version: str) -> Manifest:
    """A savepoint without operators, taken with Spark ``spark_version``."""
    return Manifest("id", 5, "t", "q", "stop", spark_version, 2, "hashmap", {}, [], [], [], {})


def plan(spark_version: str, running: str):
    """The plan of a restore of ``spark_version``'s savepoint by Spark ``running``."""
    return plan_restore(manifest(spark_version), Path("/sp"), [], partitions=None,
                        backend="hashmap", spark_version=running)


def test_the_same_version_converts_nothing():
    result = plan("4.3.0", "4.3.0")
    assert result.engine is None
    assert "engine" not in result.describe()


def test_an_older_minor_version_restores_and_the_plan_names_the_change():
    result = plan("4.2.1", "4.3.0")
    assert result.engine is not None
    assert result.engine.startswith("Spark 4.2.1 -> 4.3.0")
    assert result.describe()["engine"] == result.engine
    assert "alwaysNullableOutput" in result.engine
    assert "no offsets metadata conf" in engine_change("4.3.0", "4.3.1")


def test_a_newer_spark_is_refused_naming_both_versions():
    with pytest.raises(SavepointError, match=r"Spark 4\.4\.0.*Spark 4\.3\.0"):
        plan("4.4.0", "4.3.0")


def test_another_major_version_is_refused_naming_both_versions():
    with pytest.raises(SavepointError, match=r"Spark 3\.5\.3.*Spark 4\.3\.0.*major"):
        engine_change("3.5.3", "4.3.0")


def test_without_a_running_version_nothing_is_checked():
    result = plan_restore(manifest("4.4.0"), Path("/sp"), [], partitions=None,
                          backend="hashmap")
    assert result.engine is None


def test_suffixes_are_read_and_a_damaged_version_is_refused():
    assert parse_version("4.3.0.dev1") == (4, 3, 0)
    assert parse_version("4.1.0-SNAPSHOT") == (4, 1, 0)
    with pytest.raises(SavepointError, match="damaged"):
        parse_version("four")

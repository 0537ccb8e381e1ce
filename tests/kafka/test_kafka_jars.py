"""Where the Kafka jars are looked for (exactly.connectors.kafka.jars), without a broker: the
connector's offline directory, the broker's jars in the per-user cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exactly.connectors.kafka import jars
from exactly.errors import ConfigError
from exactly.testing.kafka_broker import broker_jars_dir


def test_an_explicit_directory_wins(monkeypatch, tmp_path):
    (tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    (tmp_path / "kafka-clients-3.9.2.jar").touch()
    monkeypatch.setenv(jars.CONNECTOR_ENV, str(tmp_path))
    assert jars.connector_jars() == sorted(str(p) for p in tmp_path.glob("*.jar"))


def test_without_the_offline_directory_the_connector_comes_from_maven_central(monkeypatch):
    monkeypatch.delenv(jars.CONNECTOR_ENV, raising=False)
    assert "spark.jars" not in jars.connector_conf()
    with pytest.raises(ConfigError, match=r"spark_session\(kafka=True\)") as info:
        jars.connector_jars()
    assert jars.CONNECTOR_ENV in str(info.value)


def test_the_broker_jars_are_in_the_per_user_cache_never_the_source_tree(monkeypatch,
                                                                          tmp_path):
    monkeypatch.delenv(jars.BROKER_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.jars_dir("broker", jars.BROKER_ENV) == tmp_path / "exactly/kafka/broker"
    with pytest.raises(ConfigError, match=jars.BROKER_ENV):
        broker_jars_dir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    assert jars.cache_dir() == Path.home() / ".cache" / "exactly" / "kafka"


def test_a_wrong_explicit_directory_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(jars.BROKER_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=f"from {jars.BROKER_ENV}"):
        broker_jars_dir()


def test_the_kafka_source_does_not_load_the_test_kit():
    code = ("import sys, exactly.connectors.kafka.source; "
            "print([m for m in sys.modules if m.startswith('exactly.testing')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"

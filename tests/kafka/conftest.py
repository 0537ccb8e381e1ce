"""A real single-node Kafka broker (KRaft, 127.0.0.1) for the Kafka tests, started once.

The broker jars come from scripts/install-kafka.sh (called by scripts/setup.sh). When they
are missing the tests FAIL with that instruction: a Kafka test that silently skips proves
nothing.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from exactly.errors import ConfigError
from exactly.testing.kafka_broker import KafkaBroker, broker_jars_dir, connector_jars


@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    try:
        directory = broker_jars_dir()
        connector_jars()
    except ConfigError as exc:
        pytest.fail(f"{exc}", pytrace=False)
    return directory


@pytest.fixture(scope="session")
def broker(kafka_jars, tmp_path_factory) -> KafkaBroker:
    """One broker for the whole session (a test that restarts it leaves it running)."""
    b = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"), transaction_max_timeout_ms=300_000)
    b.start()
    yield b
    b.close()


@pytest.fixture
def topic(broker) -> str:
    """A fresh 2-partition topic."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, 2)
    return name

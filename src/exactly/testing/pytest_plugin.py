"""pytest fixtures for throw-away servers: a PostgreSQL server, a Kafka broker, an
S3-compatible server and an Iceberg REST catalog.

Register the plugin in a root ``conftest.py``::

    pytest_plugins = ["exactly.testing.pytest_plugin"]

Servers start on first use, once per test session, on 127.0.0.1 with ports and
directories of their own, and are removed at the end. A missing server binary is a
failure, not a skip: a test that silently skips proves nothing. ``scripts/setup.sh``
installs PostgreSQL (Debian's ``postgresql`` package), the Kafka jars
(``scripts/install-kafka.sh``), and the S3Proxy and Iceberg REST catalog jars
(``scripts/install-objectstore.sh``).

Fixtures
--------
``pg``          session: a :class:`~exactly.testing.pgcluster.TempPostgres` (20 prepared
                transactions allowed); prepared transactions a test leaves are rolled
                back after it
``conn``        an autocommit connection to ``pg``
``table_name``  a fresh table name (``t_<hex>``)
``kafka_jars``  session: the directory of the broker jars
``broker``      session: a :class:`~exactly.testing.kafka_broker.KafkaBroker`
                (``transaction.max.timeout.ms`` = 300000); a test that restarts it leaves it
                running. It also has a ``PROXIED`` listener for ``kafka_proxy``
``topic``       a fresh 2-partition topic on ``broker``
``kafka_proxy`` a :class:`~exactly.testing.nemesis.proxy.FaultProxy` in front of ``broker``'s
                proxied listener, for this test only: clients of
                ``broker.proxied_bootstrap`` reach the broker through it and nothing else
``s3_server``   session: a started :class:`~exactly.testing.s3_server.S3Server` (S3Proxy);
                a test that restarts it leaves it running; tests share it, so each uses
                buckets of its own
``s3_ignoring_conditions``
                an :class:`~exactly.testing.s3_without_conditions.S3WithoutConditions` in
                front of ``s3_server`` that strips ``If-None-Match`` / ``If-Match`` (the server
                then overwrites: a store without compare-and-swap), for this test; the test's
                ``AWS_ENDPOINT_URL`` names it (set after ``s3_bucket``'s)
``s3_refusing_conditions``
                the same, answering ``501 NotImplemented`` to a request with those headers
``iceberg_rest``
                session: a started :class:`~exactly.testing.iceberg_rest.IcebergRestServer`
                (Iceberg's REST catalog on a JdbcCatalog, SQLite) with a local warehouse;
                tests share it, so each uses namespaces of its own
``iceberg_rest_s3``
                session: the same with its warehouse on ``s3_server``, in a bucket of its own
``connect_server``
                session: a started :class:`~exactly.testing.connect_server.ConnectServer`
                (Spark Connect on ``local[2]``, from the installed PySpark); a test that kills
                it starts it again (``connect_server.start()``) before it ends
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.errors import ConfigError


# -- PostgreSQL ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pg() -> Iterator[Any]:
    """A throw-away PostgreSQL server for the session."""
    from exactly.testing.pgcluster import TempPostgres

    try:
        server = TempPostgres(max_prepared_transactions=20)
    except ConfigError as exc:
        pytest.fail(f"PostgreSQL is needed for this test: {exc}", pytrace=False)
    server.start()
    yield server
    server.destroy()


@pytest.fixture(autouse=True)
def _pg_left_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used ``pg``: roll back the prepared transactions it left, so
    that the next test on the shared server starts from none."""
    yield
    if "pg" in request.fixturenames:
        request.getfixturevalue("pg").rollback_prepared()


@pytest.fixture
def conn(pg: Any) -> Iterator[Any]:
    """An autocommit connection to ``pg``."""
    with pg.connect() as c:
        yield c


@pytest.fixture
def table_name() -> str:
    """A table name no other test uses."""
    return f"t_{uuid.uuid4().hex[:10]}"


# -- Kafka ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    """The broker jars' directory; fails naming the installer when they are missing."""
    from exactly.testing.kafka_broker import broker_jars_dir

    try:
        directory = broker_jars_dir()
    except ConfigError as exc:
        pytest.fail(f"{exc}", pytrace=False)
    return directory


@pytest.fixture(scope="session")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One single-node Kafka broker (KRaft) for the session."""
    from exactly.testing.kafka_broker import KafkaBroker
    from exactly.testing.ports import free_port

    b = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"), transaction_max_timeout_ms=300_000,
                    proxy_port=free_port())
    b.start()
    yield b
    b.close()


@pytest.fixture
def topic(broker: Any) -> str:
    """A fresh 2-partition topic."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, 2)
    return name


@pytest.fixture
def kafka_proxy(broker: Any) -> Iterator[Any]:
    """The fault proxy every connection of a ``broker.proxied_bootstrap`` client goes
    through (the broker advertises its port to them); stopped, with its connections reset,
    after the test."""
    from exactly.testing.nemesis.proxy import FaultProxy

    with FaultProxy("127.0.0.1", broker.proxied_port, name="kafka",
                    listen_port=broker.proxy_port) as proxy:
        yield proxy


# -- S3 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One S3-compatible server (S3Proxy) for the session; fails naming the installer when
    its jars are missing."""
    from exactly.testing.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    try:
        server.start()
    except ConfigError as exc:
        server.close()
        pytest.fail(f"{exc}", pytrace=False)
    yield server
    server.close()


@pytest.fixture
def s3_bucket(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's name, with the server in the ``AWS_*`` environment of the test and
    of every command it starts (what boto3, PyArrow, S3A and the CLI read)."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_ignoring_conditions(s3_server: Any, s3_bucket: str,
                           monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``s3_server`` behind a proxy that drops the conditions of conditional writes (a store
    whose create-if-absent and compare-and-swap overwrite); the test's ``AWS_ENDPOINT_URL``
    names the proxy. Stopped after the test."""
    yield from _without_conditions(s3_server, "ignored", monkeypatch)


@pytest.fixture
def s3_refusing_conditions(s3_server: Any, s3_bucket: str,
                           monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``s3_server`` behind a proxy that answers ``501 NotImplemented`` to a conditional
    write; the test's ``AWS_ENDPOINT_URL`` names the proxy. Stopped after the test."""
    yield from _without_conditions(s3_server, "refused", monkeypatch)


def _without_conditions(s3_server: Any, conditions: str,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from exactly.testing.s3_without_conditions import Conditions, S3WithoutConditions

    with S3WithoutConditions(s3_server, Conditions(conditions)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield proxy


# -- Iceberg REST catalog -----------------------------------------------------------------
@pytest.fixture(scope="session")
def iceberg_rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Iceberg REST catalog server for the session, its warehouse a local directory;
    fails naming the installer when its jars are missing."""
    from exactly.testing.iceberg_rest import IcebergRestServer

    yield from _iceberg_rest(IcebergRestServer(tmp_path_factory.mktemp("iceberg-rest")))


@pytest.fixture(scope="session")
def iceberg_rest_s3(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Iceberg REST catalog server for the session, its warehouse on ``s3_server``
    (``s3://<bucket>/warehouse``, a bucket of its own)."""
    from exactly.testing.iceberg_rest import IcebergRestServer

    yield from _iceberg_rest(IcebergRestServer(tmp_path_factory.mktemp("iceberg-rest-s3"),
                                               s3=s3_server))


def _iceberg_rest(server: Any) -> Iterator[Any]:
    try:
        server.start()
    except ConfigError as exc:
        server.close()
        pytest.fail(f"{exc}", pytrace=False)
    yield server
    server.close()


# -- Spark Connect ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark Connect server for the session, on 127.0.0.1."""
    import os

    from exactly.testing.connect_server import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("connect-server"),
                           java_options=os.environ.get("EXACTLY_DRIVER_JAVA_OPTIONS", ""))
    server.start()
    yield server
    server.stop()

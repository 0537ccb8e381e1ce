"""A throw-away PostgreSQL server for the PostgreSQL tests: 127.0.0.1, own port, own temp dir.

Missing server binaries are a failure, not a skip: the suite must not pass without having
run. ``scripts/setup.sh`` installs them (Debian's ``postgresql`` package).
"""

from __future__ import annotations

import uuid

import pytest

from exactly.errors import ConfigError


@pytest.fixture(scope="session")
def pg():
    from exactly.testing.pgcluster import TempPostgres

    try:
        server = TempPostgres(max_prepared_transactions=20)
    except ConfigError as exc:
        pytest.fail(f"PostgreSQL is needed for tests/postgres: {exc}", pytrace=False)
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def conn(pg):
    with pg.connect() as c:
        yield c


@pytest.fixture
def table_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"

"""The Spark Connect tests' session: ``remote``, a Connect session (through exactly's
``spark_session(remote=...)``) to the session's ``connect_server`` (a real Spark Connect
server on ``local[2]``, from the plugin :mod:`exactly.testing.pytest_plugin` registered in
tests/conftest.py). ``pg``, ``conn``, ``table_name``, ``broker`` and ``topic`` come from the
same plugin.

A test that kills the server starts it again before it ends (``connect_server.start()``,
same URL); ``remote`` checks the server runs before it hands out the session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def remote(connect_server: Any) -> Iterator[Any]:
    """A Spark Connect session to ``connect_server``, stopped after the test."""
    from exactly.spark.session import spark_session

    connect_server.start()  # a no-op while it runs; again after a test that killed it
    spark = spark_session(app_name="exactly-connect-tests", remote=connect_server.url)
    yield spark
    spark.stop()

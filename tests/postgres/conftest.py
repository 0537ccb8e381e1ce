"""The PostgreSQL tests' server: ``pg`` (a throw-away server, 127.0.0.1, own port and temp
dir, started once per session), ``conn`` and ``table_name`` come from the plugin
:mod:`exactly.testing.pytest_plugin`, registered in tests/conftest.py.

Missing server binaries are a failure, not a skip: the suite must not pass without having
run. ``scripts/setup.sh`` installs them (Debian's ``postgresql`` package). ``two_pc`` is
a 2PC sink on a fresh table, prepared for 2 write tasks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pg_rows import SCHEMA

from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink


@pytest.fixture
def two_pc(pg, tmp_path: Path, table_name: str) -> PostgresTwoPhaseSink:
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log", retry_seconds=20)
    sink.prepare_target(SCHEMA, partitions=2)
    return sink

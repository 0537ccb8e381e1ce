"""Shared fixtures: one local[2] SparkSession per test session, event files, workdirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from exactly.demos.files import write_events


@pytest.fixture(scope="session")
def spark():
    from exactly.spark.session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = spark_session(app_name="exactly-tests")
    yield session
    session.stop()


@pytest.fixture
def events_dir(tmp_path: Path) -> Path:
    """8 JSON-lines files holding events with ids 0..3999."""
    directory = tmp_path / "input"
    write_events(directory, 4000, 8, seed=1)
    return directory


def pytest_collection_modifyitems(config, items):
    """Long soak runs (marked ``slow``) run only with EXACTLY_SLOW=1."""
    if os.environ.get("EXACTLY_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="soak run: set EXACTLY_SLOW=1 to include it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

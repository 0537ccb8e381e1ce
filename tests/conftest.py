"""Shared fixtures: one local[2] SparkSession per test session, event files, workdirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from lanes import parse_share, why_skipped

from exactly.demos.files import write_events

#: the throw-away PostgreSQL server and Kafka broker (``pg``, ``conn``, ``table_name``,
#: ``broker``, ``topic``...): shared by tests/postgres, tests/kafka and tests/contract
pytest_plugins = ["exactly.testing.pytest_plugin"]

#: every Spark driver of the tests (in this process and in the jobs they start) lives
#: seconds: JIT compiler C1 only, ~20% less CPU on 2 cores (exactly.spark.session)
os.environ.setdefault("EXACTLY_DRIVER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


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


#: lane markers by folder (tests/<folder>/...): ``fast`` needs neither Spark nor a server
FOLDER_LANES = {
    "unit": ("fast",),
    "contract": ("fast",),  # its PostgreSQL and Kafka cases also carry ``server``
    "spark": ("spark",),
    "postgres": ("server",),
    "kafka": ("server",),
    "chaos": ("chaos",),
    "ops": ("spark",),  # exactly run end to end; its server cases also carry ``server``
    "savepoints": ("spark",),  # its PostgreSQL and Kafka cases also carry ``server``
    "monitoring": ("spark",),  # a live job, `exactly ui`, headless Chromium
    "objectstore": ("server",),  # S3Proxy: the S3 server, logs and checkpoints on it
    "install": ("spark",),  # the wheel in a fresh virtualenv: its CLI runs Spark jobs
    "connect": ("spark",),  # a Spark Connect server; its PostgreSQL and Kafka cases also
    # carry ``server``
}


#: the longest test files (over a minute of the default lane each), longest first: started
#: first so that two pytest workers end together (a long file started last would leave one
#: worker alone at the end)
LONGEST_FIRST = ("install/test_wheel_install.py", "connect/test_chaos_on_connect.py",
                 "chaos/test_nemesis.py",
                 "ops/test_ha_failover.py", "postgres/test_pg_chaos.py",
                 "ops/test_launcher_where_it_runs.py", "kafka/test_kafka_chaos.py",
                 "chaos/test_file_sink_chaos.py", "chaos/test_multi_input_chaos.py",
                 "chaos/test_cluster_lane.py", "ops/test_run_restarts.py",
                 "ops/test_run_on_s3.py", "savepoints/test_savepoint_commands.py",
                 "savepoints/test_restore_aggregation.py", "chaos/test_delta_chaos.py",
                 "ops/test_outages.py", "objectstore/test_s3_ambiguous_commit.py",
                 "kafka/test_kafka_ambiguous_commit.py", "ops/test_run_remote.py",
                 "savepoints/test_savepoints_on_connect.py")


def _start_order(item) -> int:
    path = Path(str(item.fspath)).as_posix()
    for rank, name in enumerate(LONGEST_FIRST):
        if path.endswith(name):
            return rank
    return len(LONGEST_FIRST)


def pytest_addoption(parser):
    parser.addoption("--slow-share", metavar="K/N", default=None,
                     help="also run share K of N of the slow proofs (tests marked slow; "
                          "soaks never): tests/lanes.py")


def _slow_share(config) -> tuple[int, int] | None:
    value = config.getoption("--slow-share")
    if value is None:
        return None
    try:
        return parse_share(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--slow-share {exc}") from None


def pytest_configure(config):
    _slow_share(config)  # a bad --slow-share is a usage error before anything is collected


def pytest_collection_modifyitems(config, items):
    """Mark every test with its lane by folder; a contract case that needs a server leaves
    the fast lane. Slow proofs (marked ``slow``) run in their share (``--slow-share K/N``),
    soaks (marked ``soak``) never; EXACTLY_SLOW=1 runs both (tests/lanes.py)."""
    items.sort(key=_start_order)  # stable: the order inside a file stays
    root = Path(__file__).parent
    for item in items:
        try:
            folder = Path(str(item.fspath)).relative_to(root).parts[0]
        except ValueError:
            continue
        for lane in FOLDER_LANES.get(folder, ()):
            if lane == "fast" and "server" in item.keywords:
                continue
            item.add_marker(getattr(pytest.mark, lane))
    share = _slow_share(config)
    everything = os.environ.get("EXACTLY_SLOW") == "1"
    for item in items:
        # markers, not keywords: a keyword is also any node's name (a folder named "slow")
        reason = why_skipped(item.nodeid, slow=item.get_closest_marker("slow") is not None,
                             soak=item.get_closest_marker("soak") is not None, share=share,
                             everything=everything)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))

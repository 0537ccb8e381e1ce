"""Shared fixtures: one local[2] SparkSession per test session, event files, workdirs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from lanes import ci_share, parse_share, why_skipped

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


#: the folders of the fast lane: ``-m fast`` collects only these (the test modules of the
#: others would be imported only to be deselected: seconds, on every pytest worker)
FAST_FOLDERS = {folder for folder, lanes in FOLDER_LANES.items() if "fast" in lanes}
TESTS = Path(__file__).parent


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (config.getoption("markexpr", "") == "fast" and collection_path.parent == TESTS
            and collection_path.name in FOLDER_LANES
            and collection_path.name not in FAST_FOLDERS):
        return True
    return None


#: the longest test files (over a minute of the default lane each), longest first: started
#: first so that two pytest workers end together (a long file started last would leave one
#: worker alone at the end)
LONGEST_FIRST = ("ops/test_spare_driver.py", "connect/test_chaos_on_connect.py",
                 "install/test_wheel_install.py", "ops/test_upgrade.py",
                 "ops/test_launcher_where_it_runs.py", "ops/test_ha_failover.py",
                 "chaos/test_nemesis.py", "ops/test_run_remote.py",
                 "contract/test_commit_protocol.py", "chaos/test_cluster_lane.py",
                 "chaos/test_file_sink_chaos.py", "chaos/test_multi_input_chaos.py",
                 "ops/test_run_on_s3.py", "savepoints/test_savepoint_commands.py",
                 "savepoints/test_savepoints_every_backend.py", "connect/test_sinks_on_connect.py",
                 "spark/test_file_sink.py", "ops/test_outages.py", "ops/test_run_pacing.py",
                 "savepoints/test_rollback_lineage.py", "spark/test_admission.py",
                 "savepoints/test_restore_aggregation.py", "chaos/test_process_tree.py",
                 "kafka/test_kafka_reader.py", "spark/test_spark_submit.py",
                 "monitoring/test_dashboard_browser.py", "objectstore/test_s3_ambiguous_commit.py",
                 "kafka/test_kafka_ambiguous_commit.py", "savepoints/test_savepoints_on_s3.py")


def _start_order(item) -> int:
    path = Path(str(item.fspath)).as_posix()
    for rank, name in enumerate(LONGEST_FIRST):
        if path.endswith(name):
            return rank
    return len(LONGEST_FIRST)


def pytest_addoption(parser):
    parser.addoption("--slow-share", metavar="K/N", default=None,
                     help="also run share K of N of the slow proofs (tests marked slow; "
                          "soaks never): tests/lanes.py. 'ci': the share of this commit "
                          "(its number of commits), as CI runs it")


def _landings() -> int:
    """The number of commits of the checkout (``git rev-list --count HEAD``)."""
    done = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=TESTS, text=True,
                          capture_output=True, timeout=30)
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise pytest.UsageError("--slow-share ci counts the commits of the checkout, but git "
                                f"could not: {done.stderr.strip()}; give --slow-share K/N")
    return int(done.stdout)


def _slow_share(config) -> tuple[int, int] | None:
    value = config.getoption("--slow-share")
    if value is None:
        return None
    if value.strip() == "ci":
        return ci_share(_landings())
    try:
        return parse_share(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--slow-share {exc}") from None


def pytest_report_header(config):
    share = _slow_share(config)
    if share is not None:
        return [f"slow lane: share {share[0]}/{share[1]} (scripts/slow-shares {share[1]} "
                "lists every share)"]
    return None


def pytest_configure(config):
    _slow_share(config)  # a bad --slow-share is a usage error before anything is collected


def pytest_collection_modifyitems(config, items):
    """Mark every test with its lane by folder; a contract case that needs a server, and a
    test that starts a JVM (marked ``jvm``), leave the fast lane. Slow proofs (marked
    ``slow``) run in their share (``--slow-share K/N``), soaks (marked ``soak``) never;
    EXACTLY_SLOW=1 runs both (tests/lanes.py)."""
    items.sort(key=_start_order)  # stable: the order inside a file stays
    for item in items:
        try:
            folder = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder not in FAST_FOLDERS and item.get_closest_marker("fast") is not None:
            raise pytest.UsageError(
                f"{item.nodeid} is marked fast, but the fast lane collects only "
                f"tests/{{{','.join(sorted(FAST_FOLDERS))}}}: move it there")
        for lane in FOLDER_LANES.get(folder, ()):
            if lane == "fast" and (item.get_closest_marker("server") is not None
                                   or item.get_closest_marker("jvm") is not None):
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


def _children() -> list[psutil.Process]:
    """This process's children (a grandchild left behind has a child left behind too, or
    was re-parented away from here), read from /proc/self/task/*/children: psutil's
    children() scans every process of the machine, milliseconds after every test."""
    listings = list(Path("/proc/self/task").glob("*/children"))
    if not listings:  # a kernel without them
        return psutil.Process().children()
    children = []
    for listing in listings:
        try:
            pids = listing.read_text().split()
        except OSError:  # the thread ended
            continue
        for pid in pids:
            try:
                children.append(psutil.Process(int(pid)))
            except psutil.NoSuchProcess:
                continue
    return children


def pytest_terminal_summary(terminalreporter, config):
    """The seed of a random order (pytest-randomly) again at the end, where a failure is."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.getoption("randomly_reorganize", False):
        terminalreporter.write_line(f"random order: replay it with -p randomly "
                                    f"--randomly-seed={seed} (one process: -n 0)")


@pytest.fixture(autouse=True)
def _no_lease_heartbeat_outlives_its_test(request):
    """After every test that is not a fast one (those are checked below): the lease
    heartbeat threads it left in this process are stopped, without releasing the leases.
    A query's heartbeats end with the query; a test that drives committers directly
    (:class:`exactly.testing.harness.ProtocolHarness`, the contract suite's server cases)
    leaves its driver's renewing a lease in a directory or on a server the next tests no
    longer have: warnings in their logs, or in the JSON report a command prints."""
    if request.node.get_closest_marker("fast") is not None:
        yield
        return
    from exactly.protocol.lease import keepers, stop_heartbeats

    before = set(keepers())
    yield
    stop_heartbeats(keep=before)


def _process_pools() -> set[threading.Thread]:
    """Threads of pools a library keeps for the life of the process by design: pyiceberg's
    one executor (``ExecutorFactory``, its manifest reads and writes), which grows a thread
    at a time up to its size; none of them belongs to the test that started it."""
    import sys

    concurrent = sys.modules.get("pyiceberg.utils.concurrent")
    pool = getattr(getattr(concurrent, "ExecutorFactory", None), "_instance", None)
    return set(getattr(pool, "_threads", ()))


@pytest.fixture(autouse=True)
def _fast_test_leaves_nothing_behind(request):
    """A fast test shares its process with hundreds of others, run in any order: what it
    changes in the process must not reach the next one. After it, the heartbeat threads of
    the leases its sinks took are stopped and the logging an in-process ``exactly`` command
    set up (``exactly.logs.configure``) is undone; a child process, a thread or an
    environment variable it left behind, or a working directory it changed, fails it."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    from exactly.protocol.lease import stop_heartbeats

    logger = logging.getLogger("exactly")
    logging_before = (list(logger.handlers), logger.level)
    environ, cwd = dict(os.environ), os.getcwd()
    threads = set(threading.enumerate())
    # the default lane runs fast tests in the processes of the others: the session's servers
    # and Spark driver started before this test are not its leftovers
    children_before = {child.pid for child in _children()}
    yield
    stop_heartbeats()
    logger.handlers[:] = logging_before[0]
    logger.setLevel(logging_before[1])
    left: list[str] = []
    children = [child for child in _children() if child.pid not in children_before]
    for child in children:
        try:
            left.append(f"process {child.pid} ({child.status()}): "
                        f"{' '.join(child.cmdline())[:200]}")
            child.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(children, timeout=10)
    for thread in set(threading.enumerate()) - threads - _process_pools():
        thread.join(2.0)
        if thread.is_alive():
            left.append(f"thread {thread.name}")
    changed = sorted(k for k in environ.keys() | os.environ.keys()
                     if environ.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST")
    if changed:
        left.append(f"environment variables {', '.join(changed)} (use monkeypatch)")
        for name in changed:
            if name in environ:
                os.environ[name] = environ[name]
            else:
                del os.environ[name]
    if os.getcwd() != cwd:
        left.append(f"working directory {os.getcwd()} (use monkeypatch.chdir)")
        os.chdir(cwd)
    if left:
        pytest.fail("the test left behind: " + "; ".join(left), pytrace=False)

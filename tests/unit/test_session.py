"""spark_session's settings per master, computed without starting Spark (session_conf); the
real start is in tests/spark/test_start_checks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.errors import ConfigError
from exactly.spark import session, worker_daemon
from exactly.spark.pyspark_path import PYTHON_PATH_SETTING, SITE_DIR
from exactly.spark.session import (
    MASTER_ENV,
    default_master,
    local_cores,
    on_this_machine,
    session_conf,
)

SHUFFLE = "spark.sql.shuffle.partitions"
ADAPTIVE = "spark.sql.adaptive.enabled"
UI = "spark.ui.enabled"
HOST = "spark.driver.host"
BIND = "spark.driver.bindAddress"


def test_a_local_master_gets_one_shuffle_partition_per_core_no_aqe_no_ui_and_loopback():
    conf = session_conf("local[4]")
    assert conf[SHUFFLE] == "4"
    assert conf[ADAPTIVE] == "false"
    assert conf[UI] == "false"
    assert (conf[HOST], conf[BIND]) == ("127.0.0.1", "127.0.0.1")


def test_the_default_local2_master_keeps_the_old_settings():
    conf = session_conf("local[2]")
    assert (conf[SHUFFLE], conf[ADAPTIVE], conf[UI], conf[HOST]) == (
        "2", "false", "false", "127.0.0.1")


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[3]", 3), ("local[3, 2]", 3), ("local[*]", os.cpu_count() or 1),
    ("local-cluster[2,1,1024]", 2), ("spark://127.0.0.1:7077", None), ("yarn", None),
])
def test_local_cores_per_master(master, cores):
    assert local_cores(master) == cores


def test_a_cluster_master_keeps_spark_defaults_and_binds_where_spark_binds():
    conf = session_conf("yarn")
    assert SHUFFLE not in conf and ADAPTIVE not in conf
    assert HOST not in conf and BIND not in conf
    assert not on_this_machine("spark://spark-master.example:7077")


def test_a_standalone_master_on_loopback_binds_the_driver_to_loopback():
    conf = session_conf("spark://127.0.0.1:7077")
    assert (conf[HOST], conf[BIND]) == ("127.0.0.1", "127.0.0.1")
    assert conf[ADAPTIVE] == "false"
    assert SHUFFLE not in conf  # cores are the workers', not known here


def test_explicit_arguments_win_over_the_master_defaults():
    conf = session_conf("local[2]", ui=True, shuffle_partitions=7, adaptive=True)
    assert (conf[UI], conf[SHUFFLE], conf[ADAPTIVE]) == ("true", "7", "true")
    assert session_conf("yarn", shuffle_partitions=64, adaptive=False)[ADAPTIVE] == "false"


def test_python_workers_reach_the_jvm_over_unix_domain_sockets_unless_conf_says_no():
    uds = "spark.python.unix.domain.socket.enabled"
    assert session_conf("local[2]")[uds] == "true"
    assert session_conf("spark://spark-master.example:7077")[uds] == "true"
    assert session_conf("local[2]", conf={uds: "false"})[uds] == "false"


def test_conf_overrides_every_other_setting():
    conf = session_conf("local[2]", shuffle_partitions=7,
                        conf={SHUFFLE: "9", UI: "true", "spark.foo": "bar"})
    assert (conf[SHUFFLE], conf[UI], conf["spark.foo"]) == ("9", "true", "bar")


def test_a_shuffle_partition_count_below_one_is_refused():
    with pytest.raises(ConfigError, match="shuffle_partitions must be >= 1"):
        session_conf("local[2]", shuffle_partitions=0)


def test_the_default_master_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(MASTER_ENV, raising=False)
    assert default_master() == "local[2]"
    monkeypatch.setenv(MASTER_ENV, "local[3]")
    assert default_master() == "local[3]"


def test_driver_java_options_from_the_environment_follow_the_given_ones(monkeypatch):
    monkeypatch.setenv(session.DRIVER_JAVA_OPTIONS_ENV, "-XX:TieredStopAtLevel=1")
    given = {session.DRIVER_JAVA_OPTIONS: "-Xss4m", "other": "x"}
    assert session.with_env_java_options(given) == {
        session.DRIVER_JAVA_OPTIONS: "-Xss4m -XX:TieredStopAtLevel=1", "other": "x"}
    monkeypatch.setenv(session.DRIVER_JAVA_OPTIONS_ENV, " ")
    assert session.with_env_java_options(given) == given


def test_python_workers_run_exactlys_daemon_unless_switched_off(monkeypatch):
    monkeypatch.delenv(worker_daemon.ENV, raising=False)
    assert session_conf("local[2]")["spark.python.daemon.module"] == worker_daemon.MODULE
    monkeypatch.setenv(worker_daemon.ENV, "off")
    assert "spark.python.daemon.module" not in session_conf("local[2]")


def test_sparks_other_python_processes_get_the_sitecustomize_first_and_keep_a_users_path(
        monkeypatch):
    monkeypatch.delenv(worker_daemon.ENV, raising=False)
    assert session_conf("local[2]")[PYTHON_PATH_SETTING] == SITE_DIR
    users = session_conf("local[2]", conf={PYTHON_PATH_SETTING: f"/opt/libs{os.pathsep}/x"})
    assert users[PYTHON_PATH_SETTING] == os.pathsep.join([SITE_DIR, "/opt/libs", "/x"])
    assert (Path(SITE_DIR) / "sitecustomize.py").is_file()
    monkeypatch.setenv(worker_daemon.ENV, "off")
    assert PYTHON_PATH_SETTING not in session_conf("local[2]")


def test_the_worker_daemon_preloads_and_freezes_what_every_worker_imports():
    """PySpark's workers run a full gc.collect() after every task: what the daemon imported
    before forking them (PySpark, PyArrow, pandas, exactly's sources and sinks) is frozen,
    so those collections walk only what a task allocated."""
    probe = (
        "import gc, sys\n"
        "from exactly.spark import worker_daemon\n"
        "worker_daemon.prepare()\n"
        "missing = [m for m in worker_daemon.PRELOAD if m not in sys.modules]\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()), missing)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    frozen, tracked, missing = done.stdout.split(maxsplit=2)
    assert missing.strip() == "[]", missing
    assert int(frozen) > 50_000, done.stdout  # PySpark, PyArrow and pandas hold more
    assert int(tracked) < int(frozen) // 10, done.stdout  # what a collection still walks

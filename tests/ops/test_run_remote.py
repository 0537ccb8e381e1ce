"""``exactly run --remote sc://...``: the launcher supervises a query that runs in a Spark
Connect server. A SIGKILL of the server followed by its restart (as a platform restarts it):
``exactly run`` starts a new driver process, which reconnects and resumes from the
checkpoint. The whole story (default lane): a stateful job (per-key totals into PostgreSQL,
upserted by key) goes through ``exactly savepoint`` while it runs, a stop with a savepoint, a
restore of that savepoint with other state partitions into a new checkpoint, and the killed
server. Drained, every key's count and sum in the table equal the same computation run as one
batch over the same input on the server: nothing lost, nothing counted twice. Real Spark
Connect server, real PostgreSQL."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from psycopg import sql
from supervised import SupervisedRun

from exactly.savepoints.manifest import read_manifest

pytestmark = pytest.mark.server

ROWS, KEYS = 20_000, 10
CONNECT_BACK = "Python worker failed to connect back"


def env_for(pg, table: str, **extra: str) -> dict[str, str]:
    """Input that keeps coming (60 rows/s of 20000: it lasts the whole test) in epochs of at
    most 10000 rows (a drain takes the rest, most of the input, in one or two epochs: each
    epoch on the Connect server costs seconds whatever its size)."""
    return {"JOB_DSN": pg.dsn, "JOB_TABLE": table, "JOB_ROWS": str(ROWS), "JOB_RATE": "60",
            "JOB_MAX_ROWS": str(ROWS // 2), "JOB_KEYS": str(KEYS), "JOB_PARTITIONS": "2",
            **extra}


def savepoint_path(stdout: str) -> Path:
    match = re.search(r"savepoint (/\S+)", stdout)
    assert match, stdout
    return Path(match.group(1))


def table_totals(conn, table: str) -> dict[str, tuple[int, float]]:
    rows = conn.execute(sql.SQL("SELECT key, n, total FROM {}").format(
        sql.Identifier(table))).fetchall()
    return {key: (int(n), float(total)) for key, n, total in rows}


#: the batch audit, in a Connect client process of its own (this pytest worker may hold a
#: classic session, beside which PySpark opens no Connect session)
BATCH_AUDIT = """
import json, os, sys
from pyspark.sql import functions as F
from exactly.connectors.datagen import generate
from exactly.spark.session import spark_session
url, rows, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spark = spark_session(remote=url, app_name="batch-audit")
found = (spark.createDataFrame(generate(0, rows, keys, 0).to_pandas()).groupBy("key")
         .agg(F.count("*").alias("n"), F.sum("amount").alias("total")).collect())
spark.stop()
print(json.dumps({r["key"]: [int(r["n"]), float(r["total"])] for r in found}), flush=True)
os._exit(0)
"""


def batch_totals(url: str, rows: int) -> dict[str, tuple[int, float]]:
    """Every key's count and sum over ids 0..rows-1, as one batch on the Connect server."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", BATCH_AUDIT, url, str(rows), str(KEYS)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {key: (int(n), float(total)) for key, (n, total) in found.items()}


def assert_same_totals(found: dict[str, tuple[int, float]],
                       expected: dict[str, tuple[int, float]]) -> None:
    assert sorted(found) == sorted(expected)
    assert {k: v[0] for k, v in found.items()} == {k: v[0] for k, v in expected.items()}
    keys = sorted(expected)
    assert np.allclose([found[k][1] for k in keys], [expected[k][1] for k in keys],
                       rtol=1e-9)


def query_epochs(run: SupervisedRun) -> int:
    return max(run.committed_epochs(), default=-1)


def through_a_killed_server(connect_server, run: SupervisedRun, after_epoch: int, *,
                            since: float) -> dict[str, float]:
    """Once ``run`` committed past ``after_epoch``: SIGKILL the Connect server and start it
    again (a platform restarting it); ``exactly run`` starts a new driver process, which
    reconnects and resumes the query from the checkpoint; then drain and stop it. Returns
    what was measured, in seconds."""
    measured: dict[str, float] = {}
    try:
        run.wait_for(lambda: query_epochs(run) > after_epoch, "an epoch on the server",
                     timeout=600)
        measured["start_to_first_epoch"] = time.monotonic() - since
        driver = run.status().driver
        resumed_from = query_epochs(run)
        killed_at = time.monotonic()
        connect_server.kill()
        connect_server.start()
        measured["server_restart"] = time.monotonic() - killed_at
        run.wait_for(lambda: query_epochs(run) > resumed_from + 1,
                     "epochs of the resumed query", timeout=600)
        measured["kill_to_resumed_epochs"] = time.monotonic() - killed_at
        assert run.status().driver != driver  # a new driver process reconnected
        failures = [e for e in run.history() if e["event"] == "failure"]
        lost = [e for e in failures if e["kind"] == "process"]
        assert len(lost) == 1 and "lost its Spark driver" in lost[0]["cause"], failures
        # the only other failures: query starts the server's foreachBatch runner missed (its
        # Python process has 10 s to connect back, which a loaded machine can miss)
        assert all(e["kind"] == "start" and CONNECT_BACK in e["cause"]
                   for e in failures if e not in lost), failures
        drained = run.command("stop", "--drain", str(run.checkpoint), timeout=600)
        assert drained.returncode == 0, drained.stderr
        assert run.wait(timeout=300) == 0, run.output()[-3000:]
    finally:
        run.close()
    return measured


def savepoint_restore_and_a_killed_server(connect_server, pg, conn, table: str, tmp_path: Path,
                                          *, parallelism: int | None) -> dict[str, float]:
    """The whole story (module doc), the restore with ``parallelism`` state partitions
    (None: the savepoint's 2); returns what was measured, in seconds."""
    url = connect_server.url
    ck, target = tmp_path / "ck", tmp_path / "savepoints"
    env = env_for(pg, table)
    measured: dict[str, float] = {}
    started = time.monotonic()
    run = SupervisedRun("keyed_totals_job.py", ck, env, "--remote", url,
                        log=tmp_path / "run1.log")
    try:
        run.wait_for(lambda: query_epochs(run) >= 1, "two epochs on the Connect server",
                     timeout=600)
        measured["start_to_second_epoch"] = time.monotonic() - started
        taken = run.command("savepoint", str(ck), str(target), timeout=600)
        assert taken.returncode == 0, taken.stderr
        running_sp = savepoint_path(taken.stdout)
        at = read_manifest(running_sp).epoch
        run.wait_for(lambda: query_epochs(run) > at, "an epoch after the savepoint",
                     timeout=180)
        stopped = run.command("stop", "--savepoint", str(target), str(ck), timeout=600)
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    final_sp = savepoint_path(stopped.stdout)
    manifest = read_manifest(final_sp)
    assert read_manifest(running_sp).trigger == "savepoint" and manifest.trigger == "stop"
    assert [(o.uid, o.partitions) for o in manifest.operators] == [("totals", 2)]
    assert sum(n for n, _ in table_totals(conn, table).values()) > 0

    # the savepoint restored into a new checkpoint, on Connect
    ck2 = tmp_path / "ck2"
    rescale = ["--parallelism", str(parallelism)] if parallelism else []
    restoring = time.monotonic()
    again = SupervisedRun("keyed_totals_job.py", ck2, env, "--remote", url, "-s",
                          str(final_sp), *rescale, log=tmp_path / "run2.log")
    measured.update(through_a_killed_server(connect_server, again, manifest.epoch,
                                            since=restoring))
    record = json.loads((ck2 / "exactly-job" / "restore.json").read_text())
    assert record["epoch"] == manifest.epoch, record
    if parallelism:
        assert record["partitions"] == f"2->{parallelism}", record
    else:
        assert record["restored"] == ["totals: #0->#0 (copy)"], record
    assert_same_totals(table_totals(conn, table), batch_totals(url, ROWS))
    measured["total"] = time.monotonic() - started
    return measured


# the whole story below kills the server too: this shorter run is in the slow lane
@pytest.mark.slow
def test_remote_job_resumes_from_its_checkpoint_after_the_connect_server_was_killed(
        connect_server, pg, conn, table_name, tmp_path):
    started = time.monotonic()
    run = SupervisedRun("keyed_totals_job.py", tmp_path / "ck", env_for(pg, table_name),
                        "--remote", connect_server.url, log=tmp_path / "run.log")
    measured = through_a_killed_server(connect_server, run, 0, since=started)
    assert_same_totals(table_totals(conn, table_name), batch_totals(connect_server.url, ROWS))
    print("measured:", {k: round(v, 1) for k, v in measured.items()})


def test_remote_job_survives_a_savepoint_a_rescaled_restore_and_a_killed_connect_server(
        connect_server, pg, conn, table_name, tmp_path):
    measured = savepoint_restore_and_a_killed_server(connect_server, pg, conn, table_name,
                                                     tmp_path, parallelism=3)
    print("measured:", {k: round(v, 1) for k, v in measured.items()})


def test_min_pause_is_refused_on_connect_before_the_query_starts(connect_server, tmp_path):
    ck = tmp_path / "ck"
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_CHECKPOINT_MIN_PAUSE": "2s"}
    run = SupervisedRun("datagen_job.py", ck, env, "--remote", connect_server.url,
                        log=tmp_path / "run.log")
    try:
        assert run.wait(timeout=600) == 3, run.output()[-3000:]
    finally:
        run.close()
    last = run.output().strip().splitlines()[-1]
    assert "min_pause_between_checkpoints and epoch sizing" in last, last
    assert "does not work on a Spark Connect session" in last and "Drop them" in last, last
    assert not (ck / "offsets").exists()  # no query ran
    assert [e["kind"] for e in run.history() if e["event"] == "failure"] == []

"""The issue's end-to-end proof: a stateful job on a Spark standalone cluster (a master and two
workers on 127.0.0.1) with its checkpoints and savepoints on S3 (S3Proxy), through every
operation a user does on it, audited against one batch computation over the same input.

The job (tests/chaos/dedup_totals_job.py): exactly.datagen rows, a quarter of them
re-delivering an earlier event, deduplicated (uid ``dedup``), counted and summed per key
(uid ``totals``), upserted into PostgreSQL (``exactly.postgres``, ``writeMode=upsert``,
output mode update). In one test:

1. ``exactly run JOB --checkpoint s3a://B/ck`` on the hashmap backend, two state partitions,
   the master named by ``EXACTLY_SPARK_MASTER``; ``exactly savepoint s3a://B/ck s3://B/sp1``
   while it runs;
2. ``exactly stop --savepoint s3://B/sp2 s3a://B/ck``;
3. ``exactly run JOB -s <the savepoint in sp2> --checkpoint s3a://B/ck2 --parallelism 4
   --master spark://...`` on RocksDB: state rescaled from 2 to 4 partitions and moved to the
   other backend;
4. a SIGKILL of that driver's whole process tree; the launcher starts a new driver, whose new
   application gets new executors and goes on from the checkpoint on S3;
5. ``exactly stop``.

Audit: the PostgreSQL table holds, per key, the count, the sum of amounts and the sum of event
ids of the distinct events among input rows ``0..n-1`` (``n``: the input position of the last
committed epoch, from Spark's offset log on S3), computed here with numpy and pandas -- zero
lost, zero counted twice. ``exactly checkpoints --json`` on both checkpoints reports every
committed epoch, the savepoints, the restore and the restart; ``exactly ui s3a://B/ck2``,
loaded in headless Chromium, shows the job; no process of the job or of its applications
survives.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dedup_totals_job import KEYS, REDELIVERY_LAG
from psycopg import sql

from exactly.procs import ProcessInfo, is_alive, job_processes
from exactly.testing.spark_cluster import StandaloneCluster
from exactly.testing.supervised import SupervisedRun
from exactly.testing.ui import headless_chromium, ui_server
from exactly.testing.waits import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.server]

JOB = Path(__file__).with_name("dedup_totals_job.py")

#: the dashboard's state as the page shows it
PAGE = """
const rows = [...document.querySelectorAll('#history tbody tr')];
return {
  updated: document.body.dataset.updated || null,
  rows: rows.length,
  status: document.getElementById('job-status').textContent,
  cards: Object.fromEntries([...document.querySelectorAll('[data-count]')]
            .map(c => [c.dataset.count, Number(c.querySelector('.n').textContent)])),
};
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, cores=1,
                           memory="1g", java_options="-XX:TieredStopAtLevel=1") as c:
        yield c


def expected_totals(n: int) -> pd.DataFrame:
    """Per key: count, sum of amount and sum of eid of the distinct events among input rows
    ``0..n-1``, in one batch (the job's definition of an event, restated with numpy)."""
    ids = np.arange(n, dtype=np.int64)
    eids = np.where((ids % 4 == 3) & (ids >= REDELIVERY_LAG), ids - REDELIVERY_LAG, ids)
    events = pd.DataFrame({"eid": np.unique(eids)})
    events["key"] = [f"k{e % KEYS}" for e in events["eid"]]
    events["amount"] = (events["eid"] * 37) % 1000 / 10.0
    return (events.groupby("key").agg(n=("eid", "size"), total=("amount", "sum"),
                                      eid_sum=("eid", "sum")).sort_index())


def table_totals(conn, table: str) -> pd.DataFrame:
    rows = conn.execute(sql.SQL("SELECT key, n, total, eid_sum FROM {}").format(
        sql.Identifier(table))).fetchall()
    return pd.DataFrame(rows, columns=["key", "n", "total", "eid_sum"]).set_index(
        "key").sort_index()


class Bucket:
    def __init__(self, s3_server) -> None:
        self.name = f"e2e-{uuid.uuid4().hex[:12]}"
        s3_server.create_bucket(self.name)
        self.client = s3_server.boto3_client()

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name,
                                                                      Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def input_position(self, checkpoint: str, epoch: int) -> int:
        """The datagen position (rows generated) at the end of ``epoch``: the last line of
        Spark's ``offsets/<epoch>`` (``{"rows": n}``)."""
        key = f"{checkpoint.split('/', 3)[3]}/offsets/{epoch}"
        text = self.client.get_object(Bucket=self.name, Key=key)["Body"].read().decode()
        return int(json.loads(text.strip().splitlines()[-1])["rows"])


def savepoint_of(stdout: str) -> str:
    match = re.search(r"savepoint (s3://\S+)", stdout)
    assert match, stdout
    return match.group(1).rstrip(";,.")


def overview(run: SupervisedRun, checkpoint: str) -> dict:
    shown = run.command("checkpoints", checkpoint, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def completed(view: dict) -> list[int]:
    """The completed epochs of ``exactly checkpoints --json``'s history, in order."""
    return sorted(row["epoch"] for row in view["history"] if row["status"] == "completed")


def run_kill_and_stop(cluster: StandaloneCluster, checkpoint: str, env: dict[str, str],
                      *args: str, log: Path, beyond: int,
                      screenshot: Path) -> tuple[SupervisedRun, dict]:
    """``exactly run JOB --checkpoint CHECKPOINT --master <cluster> ARGS``; once it committed
    an epoch after ``beyond``, SIGKILL its driver's whole process tree; once the launcher's
    new driver committed two epochs, load ``exactly ui CHECKPOINT`` in headless Chromium
    (the running job), stop the job and see the page show it stopped. Returns the run and
    the page's last state."""
    run = SupervisedRun(JOB, checkpoint, env, *args, "--master", cluster.url, log=log)
    try:
        run.wait_for(lambda: max(run.committed_epochs(), default=-1) > beyond,
                     f"an epoch after {beyond}", timeout=300)
        killed = run.kill_driver_tree()
        run.wait_for(lambda: any(e["event"] == "recovered" for e in run.history()),
                     "a new driver that completes an epoch", timeout=300)
        assert run.status().driver.pid != killed
        resumed = max(run.committed_epochs())
        run.wait_for(lambda: max(run.committed_epochs()) > resumed, "one more epoch",
                     timeout=240)
        with ui_server(checkpoint) as base, headless_chromium() as browser:
            browser.get(base + "/")
            page = lambda: browser.execute_script(PAGE)  # noqa: E731
            live = wait_until(lambda: (p := page())["updated"] and p["rows"] and p,
                              "the dashboard's history")
            assert live["status"] == "running", live
            browser.save_screenshot(str(screenshot))
            assert run.command("stop", checkpoint, timeout=300).returncode == 0
            assert ended_cleanly(run) == 0, run.output()[-3000:]
            shown = wait_until(lambda: (p := page())["status"] == "stopped" and p,
                               "the stopped job")
            severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert severe == [], severe
    finally:
        run.close()
    return run, shown


def ended_cleanly(run: SupervisedRun) -> int:
    """Wait for ``exactly run`` to exit; then no process of the job (the launcher, a driver,
    its JVM, its Python workers: whatever carries the job's token) may outlive it by more
    than ~30 s. Returns the exit code."""
    code = run.proc.wait(timeout=120)
    left = job_processes(run.token)
    for _ in range(300):
        if not left:
            break
        time.sleep(0.1)
        left = job_processes(run.token)
    assert left == [], [ProcessInfo.of(p) for p in left if is_alive(p)]
    return code


def assert_applications_ended(cluster: StandaloneCluster) -> None:
    """The applications ended with their drivers: the workers stopped their executors."""
    left = cluster.application_processes()
    for _ in range(600):  # at most ~60 s
        if not left:
            break
        time.sleep(0.1)
        left = cluster.application_processes()
    assert left == [], [ProcessInfo.of(p) for p in left if is_alive(p)]


def assert_totals(conn, table: str, n: int) -> None:
    """Every event once: the table against one batch over the input rows 0..n-1."""
    found, expected = table_totals(conn, table), expected_totals(n)
    assert list(found.index) == list(expected.index), found
    assert found["n"].tolist() == expected["n"].tolist(), (found, expected)
    assert found["eid_sum"].tolist() == expected["eid_sum"].tolist(), (found, expected)
    assert np.allclose(found["total"].to_numpy(float), expected["total"].to_numpy(), rtol=1e-9)


@pytest.mark.slow  # two supervised runs, a restore and a driver restart on a cluster
def test_a_stateful_job_on_a_cluster_with_its_checkpoints_on_s3_savepoints_rescales_restarts(
        cluster, pg, conn, table_name, s3_server, tmp_path, monkeypatch):
    for key, value in s3_server.env().items():  # the test's own reads, and every command's
        monkeypatch.setenv(key, value)
    bucket = Bucket(s3_server)
    ck, ck2 = f"s3a://{bucket.name}/ck", f"s3a://{bucket.name}/ck2"
    env = {"JOB_DSN": pg.dsn, "JOB_TABLE": table_name, "JOB_RATE": "100",
           "JOB_MAX_ROWS": "200", "JOB_INTERVAL": "1s"}
    apps_before = set(cluster.applications())

    # 1-2: hashmap, 2 state partitions, the master from EXACTLY_SPARK_MASTER; a savepoint
    # while it runs, then a stop with a savepoint
    first = SupervisedRun(JOB, ck, {**env, **cluster.client_env(), "JOB_BACKEND": "hashmap"},
                          log=tmp_path / "run1.log")
    try:
        first.wait_for(lambda: len(first.committed_epochs()) >= 2, "two epochs", timeout=300)
        assert set(cluster.applications()) - apps_before, "no application on the cluster"
        taken = first.command("savepoint", ck, f"s3://{bucket.name}/sp1", timeout=300)
        assert taken.returncode == 0, taken.stdout + taken.stderr
        sp1 = savepoint_of(taken.stdout)
        at = max(first.committed_epochs())
        first.wait_for(lambda: max(first.committed_epochs()) > at, "an epoch after it",
                       timeout=240)
        stopped = first.command("stop", "--savepoint", f"s3://{bucket.name}/sp2", ck,
                                timeout=300)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert ended_cleanly(first) == 0, first.output()[-3000:]
    finally:
        first.close()
    sp2 = savepoint_of(stopped.stdout)
    assert sp1.startswith(f"s3://{bucket.name}/sp1/") and sp2.startswith(
        f"s3://{bucket.name}/sp2/")
    for savepoint in (sp1, sp2):
        inspected = first.command("savepoint", "--inspect", savepoint)
        assert inspected.returncode == 0 and "complete" in inspected.stdout, inspected
    first_epochs = first.committed_epochs()
    stopped_at = max(first_epochs)

    # 3-5: restored into a new checkpoint on RocksDB, 4 state partitions, --master; its
    # driver's whole tree SIGKILLed, restarted by the launcher; stopped
    second, shown = run_kill_and_stop(
        cluster, ck2, {**env, "JOB_BACKEND": "rocksdb"}, "-s", sp2, "--parallelism", "4",
        log=tmp_path / "run2.log", beyond=stopped_at + 1, screenshot=tmp_path / "ui.png")

    # three drivers, each an application of the cluster: --master honoured like the variable
    assert len(set(cluster.applications()) - apps_before) == 3, cluster.applications()
    assert_applications_ended(cluster)
    assert_totals(conn, table_name, bucket.input_position(ck2, max(second.committed_epochs())))

    # the histories on S3: every committed epoch, the savepoints, the restore, the restart
    one, two = overview(second, ck), overview(second, ck2)
    assert one["status"] == "stopped" and two["status"] == "stopped"
    assert completed(one) == first_epochs and one["counts"]["completed"] == len(first_epochs)
    assert one["counts"]["savepoints"] == 2
    assert one["latest"]["savepoint"]["path"] == sp2
    restored = [e for e in second.committed_epochs() if e > stopped_at]
    assert completed(two) == restored and two["counts"]["completed"] == len(restored)
    assert two["counts"]["restarts"] == 1
    assert [r.get("kind") for r in two["restarts"] if r["event"] == "failure"] == ["process"]
    assert two["counts"]["restored"] == 2  # the savepoint's restore, the restart's resume
    restore = two["latest"]["savepoint_restore"]
    assert (restore["source"], restore["path"], restore["epoch"]) == ("savepoint", sp2,
                                                                      stopped_at)
    resume = two["latest"]["restore"]
    assert resume["source"] == "checkpoint" and resume["epoch"] > stopped_at, resume
    assert shown["cards"]["completed"] == two["counts"]["completed"], shown
    assert bucket.keys("ck/offsets/") and bucket.keys("ck2/offsets/")

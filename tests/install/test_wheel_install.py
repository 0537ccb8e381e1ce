"""exactly as a user installs it: the wheel (built from the sdist) in a fresh virtualenv, an empty
cache, ``java`` but no ``javac``/``jar``/``mvn``/``npm``, no checkout in sight
(``installed_wheel``, tests/install/conftest.py). It runs the file demo, a savepoint restore
rescaled 2 -> 4 that rewrites state through the wheel's prebuilt state writer, and the
dashboard in headless Chromium on the restored job's checkpoint, the restored run's
``/metrics`` against ``exactly checkpoints --json``, and a Kafka-to-Kafka job with Spark's
Kafka source whose connector comes through ``spark.jars.packages`` into an empty Ivy
directory; each audited against its input."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from exactly.testing.metrics import scrape
from exactly.testing.ports import free_port
from exactly.testing.ui import headless_chromium, ui_server
from exactly.testing.waits import wait_until

JOB = Path(__file__).parent / "jobs" / "totals_job.py"
KAFKA_JOB = Path(__file__).parent / "kafka_to_kafka_job.py"
KEYS = 10


def epoch_files(output: Path, epoch: int | None = None) -> list[Path]:
    """The parquet files of the file sink's published epochs (or of one epoch)."""
    pattern = "epoch-*" if epoch is None else f"epoch-{epoch:012d}"
    return sorted(output.glob(f"{pattern}/*.parquet"))


def read_parquet(files: list[Path]) -> pd.DataFrame:
    assert files
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


@pytest.mark.parametrize("crashes", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_the_file_demo_runs_from_the_wheel_and_writes_every_input_event_once(installed_wheel,
                                                                            crashes):
    """``exactly demo`` (quick start 1). CI budget: the default lane runs it without a crash
    (one driver); the crash and restart from the wheel in the slow lane."""
    workdir = installed_wheel.workdir / f"demo-{crashes}"
    installed_wheel.run("exactly", "demo", "--events", "1000", "--crashes", str(crashes),
                        "--workdir", workdir, timeout=480)
    inputs = pd.concat([pd.read_json(f, lines=True)
                        for f in sorted((workdir / "input").glob("*.jsonl"))])
    output = read_parquet(epoch_files(workdir / "output"))
    assert len(inputs) == 1000
    assert sorted(output["id"]) == sorted(inputs["id"])  # each input id once, nothing else
    cents = dict(zip(inputs["id"], (inputs["amount"] * 100).round().astype("int64"),
                     strict=True))
    assert all(cents[i] == c for i, c in zip(output["id"], output["amount_cents"], strict=True))


def write_input(directory: Path, first_file: int, files: int, rows: int, seed: int) -> None:
    """``files`` JSON-lines files of ``rows`` rows (unique ids, 10 keys, whole amounts)."""
    directory.mkdir(exist_ok=True)
    rng = random.Random(seed)
    for index in range(first_file, first_file + files):
        lines = [json.dumps({"id": index * rows + i, "key": f"k{rng.randrange(KEYS)}",
                             "amount": float(rng.randint(1, 100))}) for i in range(rows)]
        (directory / f"part-{index:04d}.jsonl").write_text("\n".join(lines) + "\n")


def committed(checkpoint: Path) -> list[int]:
    """The epochs in Spark's commit log of ``checkpoint``."""
    return sorted(int(c.name) for c in (checkpoint / "commits").glob("[0-9]*"))


def run_until_drained(installed_wheel, checkpoint: Path, env: dict[str, str], *args: str,
                      after_epoch: int = -1, savepoint: Path | None = None,
                      while_running: Callable[[], None] | None = None) -> str:
    """``exactly run JOB`` in the background until it committed an epoch after
    ``after_epoch`` (then calls ``while_running``), then ``exactly stop --drain`` (with
    ``--savepoint``); returns the stop's output."""
    log = checkpoint.parent / f"{checkpoint.name}.log"
    proc = installed_wheel.start("exactly", "run", JOB, "--checkpoint", checkpoint, *args,
                                 log=log, env=env)
    try:
        wait_until(lambda: proc.poll() is not None or max(committed(checkpoint),
                                                          default=-1) > after_epoch,
                   f"a committed epoch in {checkpoint}", timeout=300)
        assert proc.poll() is None, log.read_text()[-5000:]
        if while_running is not None:
            while_running()
        stop = installed_wheel.run("exactly", "stop", "--drain", *(
            ["--savepoint", savepoint] if savepoint else []), checkpoint, env=env)
        assert proc.wait(timeout=120) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return stop.stdout


J, T = "flink_jobmanager_job_", "flink_taskmanager_job_task_"


@pytest.fixture(scope="module")
def restored(installed_wheel) -> tuple[Path, dict, pd.DataFrame, dict, dict]:
    """A job run on 2 state partitions, stopped with a savepoint, restored from it with
    ``--parallelism 4`` and run over more input: (checkpoint, restore record, all input, the
    restored run's ``/metrics`` once its input drained, ``exactly checkpoints --json`` read
    right after that scrape)."""
    base = installed_wheel.workdir / "restore"
    base.mkdir()
    inputs, out, savepoints = base / "in", base / "out", base / "savepoints"
    env = {"JOB_IN": str(inputs), "JOB_OUT": str(out)}
    write_input(inputs, 0, 4, 50, seed=1)
    stopped = run_until_drained(installed_wheel, base / "ck1", env, "--shuffle-partitions", "2",
                                savepoint=savepoints)
    [savepoint] = savepoints.glob("savepoint-*")
    assert str(savepoint) in stopped
    write_input(inputs, 4, 2, 50, seed=2)
    ck2, port, seen = base / "ck2", free_port(), {}

    def scrape_drained() -> None:
        """Scrape until the restored run read its 100 new rows and no epoch is in flight,
        then read ``exactly checkpoints --json`` (nothing runs between: no new input)."""
        def drained() -> bool:
            values = scrape(port)
            if values and values.get(T + "numRecordsIn", 0) >= 100 \
                    and values.get(J + "numberOfInProgressCheckpoints") == 0:
                seen["metrics"] = values
            return "metrics" in seen
        wait_until(drained, "the restored run's input on /metrics", timeout=120)
        shown = installed_wheel.run("exactly", "checkpoints", ck2, "--json")
        seen["overview"] = json.loads(shown.stdout)

    run_until_drained(installed_wheel, ck2, env, "-s", str(savepoint), "--parallelism", "4",
                      "--metrics-port", str(port), after_epoch=max(committed(base / "ck1")),
                      while_running=scrape_drained)
    record = json.loads((ck2 / "exactly-job" / "restore.json").read_text())
    rows = pd.concat([pd.read_json(f, lines=True) for f in sorted(inputs.glob("*.jsonl"))])
    return ck2, record, rows, seen["metrics"], seen["overview"]


def test_a_savepoint_restored_rescaled_2_to_4_rewrites_state_with_the_wheels_state_writer(
        installed_wheel, restored):
    ck2, record, rows, _, _ = restored
    assert record["state"] == "done" and record["partitions"] == "2->4"
    assert record["restored"] == ["totals: #0->#0 (rewrite)"]  # exactly's state writer
    # the state writer the driver put on the class path is the wheel's (none compiled: no
    # javac here, and the user cache holds no jar)
    shown = installed_wheel.run("python", "-m", "exactly.spark.state_writer_jar")
    jar = Path(shown.stdout.strip())
    assert jar.is_relative_to(installed_wheel.site_packages) and jar.is_file(), jar
    assert not list(installed_wheel.cache.rglob("*.jar"))
    assert sorted(p.name for p in (ck2 / "state" / "0").iterdir()
                  if p.name.isdigit()) == ["0", "1", "2", "3"]
    # the last epoch's complete result: every key's count and sum over all input, the
    # part before the savepoint included (it lives only in the restored state)
    last = max(int(d.name.split("-")[1]) for d in (ck2.parent / "out").glob("epoch-*"))
    assert last > record["epoch"]
    result = read_parquet(epoch_files(ck2.parent / "out", last)).set_index("key").sort_index()
    expected = rows.groupby("key").agg(n=("id", "size"), total=("amount", "sum")).sort_index()
    assert len(rows) == 300 and len(expected) == KEYS
    assert result["n"].tolist() == expected["n"].tolist()
    assert result["total"].tolist() == expected["total"].tolist()


def test_the_restored_run_serves_flink_named_metrics_equal_to_checkpoints_json(restored):
    """``exactly run --metrics-port`` from the wheel: once the restored run drained its new
    input, its ``/metrics`` under Flink's names equal ``exactly checkpoints --json`` read right
    after, and ``numRecordsIn`` counts the rows the restored run read (100, the input written
    after the savepoint; the 200 before it live only in the restored state)."""
    *_, metrics, overview = restored
    counts, latest = overview["counts"], overview["latest"]["completed"]
    assert metrics[J + "numberOfCompletedCheckpoints"] == counts["completed"] > 0
    assert metrics[J + "numberOfFailedCheckpoints"] == counts["failed"] == 0
    assert metrics[J + "numberOfInProgressCheckpoints"] == counts["in_progress"] == 0
    assert metrics[J + "totalNumberOfCheckpoints"] == counts["triggered"]
    assert metrics[J + "numRestarts"] == counts["restarts"] == 0
    assert metrics[J + "lastCheckpointDuration"] == latest["duration_ms"]
    assert metrics[J + "lastCheckpointSize"] == latest["new_bytes"]
    assert metrics[J + "lastCheckpointFullSize"] == latest["full_bytes"]
    assert metrics[J + "lastCompletedCheckpointId"] == latest["epoch"]
    assert metrics[T + "numRecordsIn"] == 100
    assert metrics[J + "uptime"] > 0 and metrics[J + "downtime"] == 0


#: the dashboard's charts: the Chart.js version loaded, the points of the duration chart and
#: how many pixels of each canvas are drawn
CHARTS = """
const drawn = c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                     let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; };
const charts = window.exactlyCharts || {};
return {
  version: window.Chart ? window.Chart.version : null,
  updated: document.body.dataset.updated || null,
  points: charts['chart-duration'] ? charts['chart-duration'].data.datasets[0].data.length : 0,
  canvases: Object.fromEntries([...document.querySelectorAll('canvas')]
                                 .map(c => [c.id, drawn(c)])),
};
"""


def test_the_dashboard_of_the_restored_job_shows_its_charts_in_chromium(installed_wheel,
                                                                         restored):
    ck2, record, *_ = restored
    pin = json.loads((installed_wheel.site_packages / "exactly" / "monitoring" / "static"
                      / "vendor" / "chart.js.pin").read_text())
    ran = [epoch for epoch in committed(ck2) if epoch > record["epoch"]]
    with (ui_server(ck2, python=installed_wheel.python, env=installed_wheel.env) as base,
          headless_chromium() as browser):
        browser.get(base + "/")
        page = wait_until(lambda: (p := browser.execute_script(CHARTS))["updated"]
                          and p["points"] and p, "the charts")
    assert page["version"] == pin["version"]  # the wheel's vendored Chart.js
    assert page["points"] == len(ran) > 0  # one point per epoch the restored job ran
    assert set(page["canvases"]) == {"chart-duration", "chart-size", "chart-rows"}
    assert all(n > 0 for n in page["canvases"].values()), page["canvases"]


def artifact(jar_name: str) -> str:
    """``kafka-clients`` for ``org.apache.kafka_kafka-clients-3.9.2.jar`` (Ivy's retrieve
    name) or ``kafka-clients-3.9.2.jar`` (PySpark's)."""
    group, _, rest = jar_name.partition("_")
    grouped = rest and "." in group and not re.search(r"-\d+\.\d", group)
    name = rest if grouped else jar_name  # Ivy's [organisation]_[artifact]-[revision]
    return re.sub(r"-\d+\.\d.*$", "", name)


def poisoned_home(home: Path) -> Path:
    """A home whose ~/.m2 holds kafka-clients' pom without its jar, as Maven leaves it after
    resolving a project that never needed the jar; Spark's default Ivy settings find the pom
    there and then fail the download (exactly's Ivy settings look at Maven Central only)."""
    pom_dir = home / ".m2/repository/org/apache/kafka/kafka-clients/3.9.2"
    pom_dir.mkdir(parents=True)
    (pom_dir / "kafka-clients-3.9.2.pom").write_text(
        "<project><modelVersion>4.0.0</modelVersion><groupId>org.apache.kafka</groupId>"
        "<artifactId>kafka-clients</artifactId><version>3.9.2</version></project>")
    return home


@pytest.mark.server
def test_a_kafka_to_kafka_job_from_the_wheel_gets_sparks_connector_through_packages(
        installed_wheel, broker):
    """``spark_session(kafka=True)`` in the installed wheel with an empty Ivy directory (and
    a Maven repository in the home directory holding a pom without its jar) resolves Spark's
    Kafka connector from Maven Central; the job (Spark's Kafka source -> exactly's Kafka sink)
    moves every record exactly once, audited by id with a read_committed consumer; the
    executors get the jars too; nothing PySpark ships is resolved twice."""
    base = installed_wheel.workdir / "kafka"
    base.mkdir()
    ivy, home = base / "ivy", poisoned_home(base / "home")
    done = installed_wheel.run("python", KAFKA_JOB, "--bootstrap", broker.bootstrap,
                               "--workdir", base / "job", "--records", "40", "--ivy", ivy,
                               env={"JAVA_TOOL_OPTIONS": f"-Duser.home={home}"},
                               check=False, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-4000:]  # the job died before its audit
    report = json.loads(lines[-1])
    assert report["ok"], report  # every input id once in the committed output, nothing else
    assert report["found"] == 40 and report["epochs"] >= 2
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {artifact(p.name) for p in (ivy / "jars").glob("*.jar")}
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients"} <= resolved
    assert resolved <= {artifact(name) for name in report["jars"]}  # the executors' too
    shipped = {artifact(p.name)
               for p in (installed_wheel.site_packages / "pyspark" / "jars").glob("*.jar")}
    assert resolved & shipped == set()

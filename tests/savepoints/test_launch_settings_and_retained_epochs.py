"""Settings at launch and retained epochs, end to end as a user runs them: ``exactly run
--state-backend hashmap --savepoint-dir SPS`` (an ``exactly savepoint`` without a target
lands in SPS; the history records both settings), ``exactly checkpoints`` lists the epochs
that can be restored, and ``exactly run -s CK@N --state-backend rocksdb --sink-rollback
keep`` goes on from a retained epoch N before the last one, its state rewritten into the
other backend, the PostgreSQL upserts of the epochs after N computed again from N's state.
Real Spark under ``exactly run``, a real PostgreSQL server; the table is audited against
the same rows counted in one batch. The same restore in-process (no driver starts) is the
default lane's; the whole path under ``exactly run`` is a slow proof."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from savepoint_jobs import KEYS, StatefulJob, assert_totals, table_totals

from exactly.errors import SavepointError
from exactly.monitoring import overview
from exactly.ops.driver import with_settings
from exactly.ops.job_savepoints import RestoreRequest, restore_job
from exactly.savepoints.manifest import read_manifest
from exactly.savepoints.operators import job_operators
from exactly.savepoints.sinks import SinkRollback
from exactly.savepoints.take import restorable_epochs
from exactly.testing.supervised import SupervisedRun

pytestmark = pytest.mark.server

JOB = Path(__file__).parent / "jobs" / "stateful_job.py"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROWS = 6000


def env_for(pg, table: str) -> dict[str, str]:
    """Per-key count and sum (an aggregation, uid ``counts``) upserted into PostgreSQL; no
    backend in the job's code (JOB_BACKEND unset): the launch option decides. 6,000 rows
    coming at 200 a second, in epochs of at most 400."""
    return {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table, "JOB_ROWS": str(ROWS),
            "JOB_RATE": "200", "JOB_MAX_ROWS": "400", "JOB_KEYS": str(KEYS)}


def provider(checkpoint: Path, epoch: int) -> str:
    """The state store provider Spark recorded in ``offsets/epoch``."""
    meta = json.loads((checkpoint / "offsets" / str(epoch)).read_text().splitlines()[1])
    return meta["conf"][PROVIDER]


def run_settings(checkpoint: Path) -> list[dict]:
    return [r["config"] for r in overview.load(checkpoint).records if r["kind"] == "run"]


def counted(conn, table: str) -> int:
    return int(table_totals(conn, table)["n"].sum())


def test_a_retained_epoch_restores_in_process_into_the_backend_given_over_the_job(
        spark, tmp_path, conn, pg, table_name):
    """Six epochs of 500 rows on hashmap; epoch 3 (rows 0..1999) of the retained checkpoint
    restored with ``state_backend`` set over the job's own (what ``--state-backend`` does),
    the upserts of epochs 4 and 5 kept and computed again, then 4,000 rows in all."""
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name,
           "JOB_BACKEND": "hashmap"}
    ck, ck2 = tmp_path / "ck", tmp_path / "ck2"
    StatefulJob(spark, ck, **env).run(3000)
    assert restorable_epochs(ck) == [0, 1, 2, 3, 4, 5]
    later = StatefulJob(spark, ck2, **env)
    job = with_settings(later.job(4000), {"state_backend": "rocksdb"})
    with pytest.raises(SavepointError, match=r"epoch 9 .* 0\.\.5"):
        restore_job(job, RestoreRequest(f"{ck}@9"), job_operators(job.df))
    done = restore_job(job, RestoreRequest(f"{ck}@3", sink_rollback=SinkRollback.KEEP),
                       job_operators(job.df))
    assert done["epoch"] == 3 and done["backend"] == "hashmap->rocksdb", done
    later.env["JOB_BACKEND"] = "rocksdb"  # the backend ck2 now holds
    later.run(4000)
    # rows 2000..3999 from epoch 3's positions: four epochs of 500 after it
    assert later_epochs(ck2)[-1] == 7
    assert "RocksDBStateStoreProvider" in provider(ck2, 7)
    assert_totals(table_totals(conn, table_name), 4000)


def later_epochs(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


# CI budget: a slow proof (two `exactly run` drivers, ~60 s); the restore itself is the
# in-process test above, the CLI's parsing and listing tests/unit/test_launch_settings.py
@pytest.mark.slow
def test_a_retained_epoch_restores_into_the_backend_named_at_launch(tmp_path, pg, conn,
                                                                    table_name):
    ck, sps = tmp_path / "ck", tmp_path / "sps"
    env = env_for(pg, table_name)
    first = SupervisedRun(JOB, ck, env, "--state-backend", "hashmap", "--savepoint-dir",
                          str(sps), log=tmp_path / "run1.log")
    try:
        first.wait_for(lambda: len(first.committed_epochs()) >= 2, "two epochs")
        taken = first.command("savepoint", str(ck))  # no target: the launch's directory
        assert taken.returncode == 0, taken.stderr
        match = re.search(r"savepoint (/\S+)", taken.stdout)
        assert match, taken.stdout
        assert Path(match.group(1)).parent == sps
        at = read_manifest(Path(match.group(1))).epoch
        first.wait_for(lambda: max(first.committed_epochs()) >= at + 3, "three more epochs")
        assert first.command("stop", str(ck)).returncode == 0
        assert first.wait(timeout=120) == 0, first.output()[-3000:]
    finally:
        first.close()
    last = max(first.committed_epochs())
    assert "HDFSBackedStateStoreProvider" in provider(ck, last)
    assert {(s["state_backend"], s["savepoint_dir"]) for s in run_settings(ck)} == {
        ("hashmap", str(sps))}
    assert counted(conn, table_name) < ROWS  # stopped before the input's end

    shown = first.command("checkpoints", str(ck), "--json")
    assert shown.returncode == 0, shown.stderr
    restorable = json.loads(shown.stdout)["restorable_epochs"]
    assert restorable[-1] == last and len(restorable) >= 3, restorable
    text = first.command("checkpoints", str(ck))
    assert f"restorable epochs: {restorable[0]}..{last}" in text.stdout, text.stdout
    epoch = restorable[-3]  # two epochs before the last: the table holds epochs after it

    # the retained epoch, restored into RocksDB; the table's upserts of the epochs after
    # it are kept (--sink-rollback keep) and overwritten as they are computed again
    ck2 = tmp_path / "ck2"
    second = SupervisedRun(JOB, ck2, env, "-s", f"{ck}@{epoch}", "--state-backend", "rocksdb",
                           "--sink-rollback", "keep", log=tmp_path / "run2.log")
    try:
        second.wait_for(lambda: counted(conn, table_name) >= ROWS, "the input's end",
                        timeout=240)
        assert second.command("stop", str(ck2)).returncode == 0
        assert second.wait(timeout=120) == 0, second.output()[-3000:]
    finally:
        second.close()
    record = json.loads((ck2 / "exactly-job" / "restore.json").read_text())
    assert record["epoch"] == epoch and record["savepoint"] == f"{ck}@{epoch}"
    assert "RocksDBStateStoreProvider" in provider(ck2, max(second.committed_epochs()))
    assert {s["state_backend"] for s in run_settings(ck2)} == {"rocksdb"}
    # the state of epoch N carried into the other backend, every row after it counted once
    assert_totals(table_totals(conn, table_name), ROWS)

"""Savepoints from a job's first epochs on every state backend: the default one (RocksDB with
changelog checkpointing for a new checkpoint, whose young stores have changelogs and no
snapshot yet), hashmap, RocksDB without changelog checkpointing and RocksDB with it named
explicitly. One query takes a savepoint after each of its first epochs; every savepoint is
inspected and restored rescaled (most also onto another backend) into a fork writing its
own table, which runs to the end of the input; each key's count and sum there must equal
the same computation done in one batch over the generator's input. A transformWithState
job on the default backend (a changelog-only deduplication store beside it) is rescaled
through Spark's repartition and audited id by id. Real Spark, real PostgreSQL, real files.

The default lane runs the default backend at epochs 1-3, hashmap and RocksDB without
changelog checkpointing at epoch 0 (RocksDB with changelog checkpointing named explicitly is
the default's configuration) and the transformWithState job at epoch 1; the whole matrix
(every backend at epochs 0-3) is marked slow."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from savepoint_jobs import KEYS, StatefulJob, expected_totals, table_totals

from exactly.audit import audit_ids, data_files, file_ids
from exactly.cli import main
from exactly.savepoints.manifest import read_manifest

#: rows per epoch of the job the savepoints are taken from, and the whole input
EPOCH = 100
TOTAL = 600

BACKENDS = {
    "default": {},  # state_backend=None: RocksDB + changelog checkpointing for a new checkpoint
    "hashmap": {"JOB_BACKEND": "hashmap"},
    "rocksdb": {"JOB_BACKEND": "rocksdb", "JOB_INCREMENTAL": "0"},
    "rocksdb-changelog": {"JOB_BACKEND": "rocksdb", "JOB_INCREMENTAL": "1"},
}
#: per backend of the savepoint, per epoch: the job's backend and state partitions (None:
#: the savepoint's 2) on restore; every savepoint is rescaled but the copy of epoch 0 of the
#: default backend, and most switch the backend
RESTORES: dict[str, dict[int, tuple[str, int | None]]] = {
    "default": {0: ("rocksdb", None), 1: ("default", 4), 2: ("hashmap", 3),
                3: ("rocksdb", 4)},
    "hashmap": {0: ("rocksdb-changelog", 4), 1: ("default", 3), 2: ("rocksdb", 4),
                3: ("default", 4)},
    "rocksdb": {0: ("hashmap", 3), 1: ("default", 4), 2: ("rocksdb-changelog", 3),
                3: ("hashmap", 4)},
    "rocksdb-changelog": {0: ("hashmap", 4), 1: ("rocksdb", 3), 2: ("default", 4),
                          3: ("hashmap", 3)},
}
SLOW = pytest.mark.slow


def assert_totals_of(found: pd.DataFrame, rows: int) -> None:
    """Every key's count and sum equal the batch computation over ids 0..rows-1."""
    expected = expected_totals(rows)
    found = found.set_index("key").sort_index()
    assert list(found.index) == list(expected.index), found
    assert found["n"].tolist() == expected["n"].tolist(), (found, expected)
    assert np.allclose(found["total"].to_numpy(), expected["total"].to_numpy(), rtol=1e-9)


def state_files(savepoint) -> list[str]:
    """The state version files of a savepoint (``<version>.<kind>``), per operator/partition."""
    root = savepoint / "checkpoint" / "state"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.suffix in (".zip", ".changelog", ".delta", ".snapshot"))


def provider(name: str, savepoint_backend: str) -> str:
    """The state backend a job configured as BACKENDS[name] restores into."""
    return savepoint_backend if name == "default" else BACKENDS[name]["JOB_BACKEND"]


def inspect(savepoint) -> dict:
    """``exactly savepoint --inspect`` (its table, then its JSON) of ``savepoint``."""
    shown = CliRunner().invoke(main, ["savepoint", "--inspect", str(savepoint)])
    assert shown.exit_code == 0 and "complete" in shown.output, shown.output
    listed = CliRunner().invoke(main, ["savepoint", "--inspect", str(savepoint), "--json"])
    assert listed.exit_code == 0, listed.output
    return json.loads(listed.stdout)


def inspected_rows(savepoint) -> list[tuple[str, int]]:
    """(uid, rows) of every operator as ``--inspect`` shows them."""
    return sorted((op["uid"], sum(s["rows"] for s in op["stores"]))
                  for op in inspect(savepoint)["operators"])


@pytest.mark.server
@pytest.mark.parametrize("backend, epochs", [
    pytest.param("default", (1, 2, 3), id="default-epochs-1-3"),
    pytest.param("hashmap", (0,), id="hashmap-epoch-0"),
    pytest.param("rocksdb", (0,), id="rocksdb-epoch-0"),
    pytest.param("default", (0, 1, 2, 3), id="default-epochs-0-3", marks=SLOW),
    pytest.param("hashmap", (0, 1, 2, 3), id="hashmap-epochs-0-3", marks=SLOW),
    pytest.param("rocksdb", (0, 1, 2, 3), id="rocksdb-epochs-0-3", marks=SLOW),
    pytest.param("rocksdb-changelog", (0, 1, 2, 3), id="rocksdb-changelog-epochs-0-3",
                 marks=SLOW),
])
def test_savepoints_of_the_first_epochs_restore_rescaled_onto_every_backend(
        spark, pg, conn, table_name, tmp_path, backend, epochs):
    env = {"JOB_KIND": "agg", "JOB_DSN": pg.dsn, "JOB_TABLE": table_name,
           "JOB_MAX_ROWS": str(EPOCH), **BACKENDS[backend]}
    job = StatefulJob(spark, tmp_path / "ck", **env)
    taken = {}
    for epoch in epochs:  # availableNow: the epochs up to this one, EPOCH rows each
        job.run((epoch + 1) * EPOCH)
        taken[epoch] = job.savepoint(tmp_path / "sps")
    assert_totals_of(table_totals(conn, table_name), (max(epochs) + 1) * EPOCH)

    for epoch, savepoint in taken.items():
        manifest = read_manifest(savepoint)
        assert manifest.epoch == epoch and manifest.shuffle_partitions == 2
        assert manifest.state_backend == ("hashmap" if backend == "hashmap" else "rocksdb")
        assert inspected_rows(savepoint) == [("counts", KEYS)]
        files = state_files(savepoint)
        if backend in ("default", "rocksdb-changelog"):  # no snapshot uploaded yet
            assert files == [f"0/{p}/{v}.changelog" for p in (0, 1)
                             for v in range(1, epoch + 2)], files

        target, parallelism = RESTORES[backend][epoch]
        fork = f"{table_name}_{epoch}"
        restored = StatefulJob(spark, tmp_path / f"ck-{epoch}", **{
            **env, "JOB_TABLE": fork, "JOB_MAX_ROWS": str(TOTAL), "JOB_BACKEND": "",
            "JOB_INCREMENTAL": "", **BACKENDS[target]})
        done = restored.restore(savepoint, TOTAL, parallelism=parallelism)
        into = provider(target, manifest.state_backend)
        method = "copy" if parallelism is None and into == manifest.state_backend else "rewrite"
        assert done["restored"] == [f"counts: #0->#0 ({method})"]
        assert done["partitions"] == f"2->{parallelism or 2}"
        assert done["backend"] == f"{manifest.state_backend}->{into}"
        restored.run(TOTAL)
        # the fork's table: every key was updated after the savepoint (ids are spread over
        # the keys round robin), so it holds every key's totals over the whole input
        assert_totals_of(table_totals(conn, fork), TOTAL)


def fork_output(out) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in data_files(out)], ignore_index=True)


@pytest.mark.parametrize("epochs", [
    pytest.param((1,), id="epoch-1"),
    pytest.param((0, 2, 3), id="epochs-0-2-3", marks=SLOW),
])
def test_transform_with_state_savepoints_of_the_default_backend_restore_rescaled(
        spark, tmp_path, epochs):
    """Version 2 of the transformWithState job (a dedup step before it) on the default
    backend: the dedup store has changelogs only, the transformWithState store Spark's
    snapshot of version 1 and changelogs after it. Every savepoint is rescaled through
    Spark's repartition; the fork writes every id after the savepoint once, each with its
    key's running count and sum over all ids so far."""
    env = {"JOB_KIND": "tws", "JOB_VERSION": "v2", "JOB_OUT": str(tmp_path / "out"),
           "JOB_MAX_ROWS": str(EPOCH)}
    job = StatefulJob(spark, tmp_path / "ck", **env)
    for epoch in epochs:
        job.run((epoch + 1) * EPOCH)
        savepoint = job.savepoint(tmp_path / "sps")
        manifest = read_manifest(savepoint)
        assert manifest.epoch == epoch and manifest.state_backend == "rocksdb"
        assert inspected_rows(savepoint) == [("dedup", (epoch + 1) * EPOCH), ("running", KEYS)]
        files = state_files(savepoint)
        assert [f for f in files if f.startswith("1/")] == [  # dedup: changelogs only
            f"1/{p}/{v}.changelog" for p in (0, 1) for v in range(1, epoch + 2)], files

        parallelism = 4 if epoch % 2 else 3
        out = tmp_path / f"out-{epoch}"
        restored = StatefulJob(spark, tmp_path / f"ck-{epoch}", **{
            **env, "JOB_OUT": str(out), "JOB_MAX_ROWS": str(TOTAL)})
        done = restored.restore(savepoint, TOTAL, parallelism=parallelism)
        assert sorted(done["restored"]) == ["dedup: #1->#1 (repartition)",
                                            "running: #0->#0 (repartition)"]
        restored.run(TOTAL)
        start = (epoch + 1) * EPOCH
        found, _ = file_ids(out)
        report = audit_ids(found, np.arange(start, TOTAL))
        assert report.ok, report.to_json()
        last = fork_output(out).sort_values("n").groupby("key").tail(1)
        assert_totals_of(last[["key", "n", "total"]], TOTAL)

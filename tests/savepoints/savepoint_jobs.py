"""The savepoint tests' helpers: run the stateful test job in-process, take savepoints,
restore them, and compute what the output must be from the input (a batch computation)."""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from psycopg import sql

from exactly.connectors.datagen import generate

JOB_FILE = Path(__file__).parent / "jobs" / "stateful_job.py"
KEYS = 10


def job_module():
    spec = importlib.util.spec_from_file_location("stateful_job", JOB_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def job_env(**env: str):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class StatefulJob:
    """The test job with one configuration; ``run`` processes input up to ``rows``."""

    def __init__(self, spark, checkpoint: Path, **env: str) -> None:
        self.spark = spark
        self.checkpoint = checkpoint
        self.env = {"JOB_KEYS": str(KEYS), "JOB_MAX_ROWS": "500", **env}

    def job(self, rows: int):
        with job_env(JOB_ROWS=str(rows), **self.env):
            return job_module().build(self.spark).with_checkpoint_dir(str(self.checkpoint))

    def operators(self, rows: int = 1):
        from exactly.savepoints.operators import job_operators

        return job_operators(self.job(rows).df)

    def restore(self, savepoint: Path, rows: int, **options):
        from exactly.ops.job_savepoints import RestoreRequest, restore_job

        job = self.job(rows)
        from exactly.savepoints.operators import job_operators

        return restore_job(job, RestoreRequest(str(savepoint), **options), job_operators(job.df))

    def run(self, rows: int) -> None:
        """Process the input up to ``rows`` (availableNow) and stop."""
        from exactly.ops.query import start_query

        job = self.job(rows)
        query = start_query(job.df, sink_format=job.sink_format, checkpoint=job.checkpoint,
                            path=job.path, options=dict(job.options),
                            output_mode=job.output_mode, available_now=True)
        query.query.awaitTermination()
        error = query.query.exception()
        if error is not None:
            raise AssertionError(f"the query failed: {error}")

    def savepoint(self, target: Path, rows: int = 1) -> Path:
        from exactly.ops.job_savepoints import take_job_savepoint
        from exactly.savepoints.operators import job_operators

        job = self.job(rows)
        return take_job_savepoint(job, target, trigger="stop",
                                  operators=job_operators(job.df))


RESTORE_OPTIONS = ("parallelism", "allow_non_restored_state")


def stage(spark, checkpoint: Path, env: dict[str, str], savepoint: Path | None, rows: int,
          target: Path, **overrides: str):
    """One step of an upgrade path: restore ``savepoint`` (if any) into ``checkpoint`` with
    the job configured by ``env`` and ``overrides`` (restore options among them), run to
    ``rows``, take a savepoint into ``target``. Returns (what the restore did, savepoint)."""
    options = {k: overrides.pop(k) for k in RESTORE_OPTIONS if k in overrides}
    job = StatefulJob(spark, checkpoint, **{**env, **overrides})
    done = job.restore(savepoint, rows, **options) if savepoint else None
    job.run(rows)
    return done, job.savepoint(target)


def expected_totals(rows: int) -> pd.DataFrame:
    """Per key: count and sum of amount over ids 0..rows-1, computed in one batch."""
    table = generate(0, rows, KEYS, 0).to_pandas()
    return table.groupby("key").agg(n=("id", "size"), total=("amount", "sum")).sort_index()


def table_totals(conn, table: str) -> pd.DataFrame:
    """The aggregation job's PostgreSQL table: key, n, total per row."""
    rows = conn.execute(sql.SQL("SELECT key, n, total FROM {}").format(
        sql.Identifier(table))).fetchall()
    return pd.DataFrame(rows, columns=["key", "n", "total"])


def assert_totals(found: pd.DataFrame, rows: int) -> None:
    expected = expected_totals(rows)
    found = found.set_index("key").sort_index()[["n", "total"]]
    assert list(found.index) == list(expected.index)
    assert found["n"].tolist() == expected["n"].tolist(), (found, expected)
    assert np.allclose(found["total"].to_numpy(), expected["total"].to_numpy(), rtol=1e-9)

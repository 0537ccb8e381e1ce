"""A full disk under the job (issue 28): the sink's staging directory and the checkpoint on a
small tmpfs filled to the last byte. The epoch fails with an error naming the cause (no space
left on device, where) and the fix; nothing is visible partially; after the space is freed a
restart on the same checkpoint drains the input and every id is in the output exactly once.

Real Spark (the session fixture, local[2]), real files on a real tmpfs (needs root to mount).
"""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.causes import remedy, root_cause_of
from exactly.config import CheckpointConfig
from exactly.ops.query import start_query
from exactly.testing.file_output import assert_no_dangling_pre_commits
from exactly.testing.nemesis.disk import SmallDisk, why_unavailable

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(why_unavailable() is not None, reason=str(why_unavailable()))]
TOTAL = 3000


def _datagen(spark):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", TOTAL).option("maxRowsPerTrigger", 1000).load())


def _ids(out) -> list[int]:
    files = [str(f) for f in data_files(out)] if out.exists() else []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist()) if files else []


def _run(spark, out, ck):
    return start_query(_datagen(spark), sink_format="exactly.files", path=str(out),
                       checkpoint=CheckpointConfig(storage=str(ck)), available_now=True)


@pytest.mark.parametrize("full", ["staging", "checkpoint"])
def test_a_full_disk_fails_the_epoch_naming_cause_and_fix_and_a_restart_after_freeing_loses_nothing(
        spark, tmp_path, full):
    with SmallDisk(tmp_path / "disk", 8 << 20) as disk:
        out = disk.path / "out" if full == "staging" else tmp_path / "out"
        ck = disk.path / "ck" if full == "checkpoint" else tmp_path / "ck"
        disk.fill()
        with pytest.raises(Exception) as failed:
            _run(spark, out, ck).await_termination()
        cause = root_cause_of(failed.value)
        assert "No space left on device" in cause, cause
        fix = remedy(cause) or ""
        assert "is full" in fix and "restart" in fix, fix
        if full == "staging":
            assert str(out) in cause  # our own writes name the file
        assert _ids(out) == []  # nothing visible, not even part of an epoch

        disk.free()
        _run(spark, out, ck).await_termination()
        assert _ids(out) == list(range(TOTAL))
        assert_no_dangling_pre_commits(out)

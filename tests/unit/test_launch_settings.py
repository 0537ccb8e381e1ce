"""Launch settings and retained epochs without Spark: ``-s CHECKPOINT@N`` parsing, which
epochs of a checkpoint still restore (state files deleted by Spark's retention), the
refusals of bad launch options before anything starts, and the backend a stateful step
cannot live in. End to end: tests/savepoints/test_launch_settings_and_retained_epochs.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from exactly import CheckpointConfig
from exactly.cli import main
from exactly.errors import ConfigError, SavepointError
from exactly.ops.driver import refuse_backend_of
from exactly.ops.job_savepoints import retained_epoch
from exactly.savepoints.operators import JobOperator
from exactly.savepoints.take import _pick_epoch, restorable_epochs, spans

pytestmark = pytest.mark.fast

COMMAND_ENV: dict[str, str | None] = {"EXACTLY_SPARK_LOG_LEVEL": None}


def fake_checkpoint(root: Path, *, epochs: int, deltas: list[int],
                    snapshots: list[int]) -> Path:
    """A checkpoint of ``epochs`` completed epochs with one state partition of the hashmap
    provider holding the given ``N.delta`` and ``N.snapshot`` files (epoch e needs state
    version e + 1)."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0,
            "conf": {"spark.sql.shuffle.partitions": "1"}}
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id": "q"}\n')
    for e in range(epochs):
        (root / "offsets" / str(e)).write_text(f"v1\n{json.dumps(meta)}\n{{\"n\": {e}}}\n")
        (root / "commits" / str(e)).write_text('v1\n{"nextBatchWatermarkMs": 0}\n')
    store = root / "state" / "0" / "0"
    store.mkdir(parents=True)
    for v in deltas:
        (store / f"{v}.delta").write_bytes(b"x")
    for v in snapshots:
        (store / f"{v}.snapshot").write_bytes(b"x")
    return root


def test_an_epoch_after_the_at_sign_names_a_retained_epoch_unless_the_path_exists(tmp_path):
    assert retained_epoch("/data/ck@12") == ("/data/ck", 12)
    assert retained_epoch("s3://bucket/jobs/ck@0") == ("s3://bucket/jobs/ck", 0)
    assert retained_epoch("/data/ck") == ("/data/ck", None)
    assert retained_epoch("/data/ck@latest") == ("/data/ck@latest", None)
    odd = tmp_path / "sp@3"
    odd.mkdir()
    assert retained_epoch(str(odd)) == (str(odd), None)  # a real directory of that name


def test_spans_fold_consecutive_epochs():
    assert spans([]) == "none"
    assert spans([4]) == "4"
    assert spans([3, 4, 5, 6, 7, 9]) == "3..7, 9"
    assert spans([1, 3, 4, 8, 9, 10]) == "1, 3..4, 8..10"


def test_epochs_whose_state_files_are_gone_are_not_restorable(tmp_path):
    # versions 1 and 2 deleted (Spark's retention kept the snapshot of version 3 and later)
    ck = fake_checkpoint(tmp_path / "ck", epochs=5, deltas=[3, 4, 5], snapshots=[3])
    assert restorable_epochs(ck) == [2, 3, 4]
    assert _pick_epoch(str(ck), None) == 4
    assert _pick_epoch(str(ck), 3) == 3
    with pytest.raises(SavepointError, match=r"epoch 1 .* no longer retained.* 2\.\.4"):
        _pick_epoch(str(ck), 1)
    with pytest.raises(SavepointError, match=r"epoch 9 .* has not completed.* 2\.\.4"):
        _pick_epoch(str(ck), 9)


def test_checkpoints_lists_the_restorable_epochs(tmp_path):
    ck = fake_checkpoint(tmp_path / "ck", epochs=4, deltas=[1, 2, 3, 4], snapshots=[])
    runner = CliRunner(env=COMMAND_ENV)
    shown = runner.invoke(main, ["checkpoints", str(ck), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["restorable_epochs"] == [0, 1, 2, 3]
    text = runner.invoke(main, ["checkpoints", str(ck)])
    assert "restorable epochs: 0..3" in text.output and f"-s {ck}@N" in text.output


def test_bad_launch_settings_are_refused_before_anything_starts(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("def build(spark):\n    raise AssertionError('never built')\n")
    runner = CliRunner(env=COMMAND_ENV)
    ck = tmp_path / "ck"
    backend = runner.invoke(main, ["run", str(job), "--checkpoint", str(ck),
                                   "--state-backend", "memory"])
    assert backend.exit_code == 2 and "'memory' is not one of" in backend.output
    savepoint = tmp_path / "sps" / "savepoint-3-abc"
    savepoint.mkdir(parents=True)
    at = runner.invoke(main, ["run", str(job), "--checkpoint", str(ck), "-s",
                              f"{savepoint}@2"])
    assert at.exit_code == 2 and "@2 names an epoch of a retained checkpoint" in at.output
    assert not ck.exists()
    with pytest.raises(ConfigError, match="savepoint_dir: give a directory"):
        CheckpointConfig(savepoint_dir=" ")


def test_transform_with_state_cannot_be_switched_to_the_hashmap_backend():
    steps = [JobOperator(0, "TransformWithStateInPySparkExec", "TransformWithStateInPandas",
                         "running")]
    hashmap = SimpleNamespace(checkpoint=CheckpointConfig(state_backend="hashmap"))
    with pytest.raises(ConfigError, match=r"cannot hold the state of running: .*RocksDB only"):
        refuse_backend_of(hashmap, steps)
    refuse_backend_of(SimpleNamespace(checkpoint=CheckpointConfig(state_backend="rocksdb")),
                      steps)
    refuse_backend_of(SimpleNamespace(checkpoint=CheckpointConfig()), steps)
    aggregation = [JobOperator(0, "StateStoreSaveExec", "Aggregate", "counts")]
    refuse_backend_of(hashmap, aggregation)  # the hashmap backend holds an aggregation

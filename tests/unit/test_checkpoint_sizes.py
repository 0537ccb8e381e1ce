"""Checkpoint sizes per epoch (exactly.monitoring.sizes): full size, bytes new since a time,
re-listing only what changed."""

from __future__ import annotations

import os
import time

from exactly.monitoring.sizes import CheckpointSizes


def _write(path, size: int, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_full_and_new_bytes_follow_what_each_epoch_wrote(tmp_path):
    old = time.time() - 100
    _write(tmp_path / "offsets" / "0", 100, old)
    _write(tmp_path / "state" / "0" / "0" / "1.delta", 1000, old)
    _write(tmp_path / "exactly-job" / "history" / "segment-000000000001.jsonl", 50_000)
    sizes = CheckpointSizes(tmp_path, exclude=("exactly-job/history",))
    first = sizes.measure(since=old + 50)
    assert (first.full_bytes, first.new_bytes, first.files) == (1100, 0, 2)
    epoch_start = time.time()
    _write(tmp_path / "offsets" / "1", 120)
    _write(tmp_path / "state" / "0" / "0" / "2.delta", 300)
    (tmp_path / "state" / "0" / "0" / "1.delta").unlink()  # Spark's maintenance
    second = sizes.measure(since=epoch_start - 0.01)
    assert (second.full_bytes, second.new_bytes, second.files) == (520, 420, 3)


def test_settled_directories_are_not_listed_again(tmp_path):
    old = time.time() - 100
    _write(tmp_path / "a" / "f", 10, old)
    os.utime(tmp_path / "a", (old, old))
    sizes = CheckpointSizes(tmp_path)
    assert sizes.measure().full_bytes == 10
    # a size change that leaves the directory's time alone is not seen: proof of the cache
    (tmp_path / "a" / "f").write_bytes(b"x" * 99)
    os.utime(tmp_path / "a", (old, old))
    assert sizes.measure().full_bytes == 10
    _write(tmp_path / "a" / "g", 5)  # a new file changes the directory's time
    assert sizes.measure().full_bytes == 10 + 5  # f was listed and settled: not stat'ed
    replaced = tmp_path / "a" / ".f.tmp"  # how Spark and exactly rewrite: a rename over it
    replaced.write_bytes(b"x" * 7)
    os.replace(replaced, tmp_path / "a" / "f")
    assert sizes.measure().full_bytes == 7 + 5


def test_a_missing_checkpoint_measures_zero(tmp_path):
    assert CheckpointSizes(tmp_path / "nowhere").measure().full_bytes == 0

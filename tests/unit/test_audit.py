from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.audit import verify


def write_ids(directory: Path, name: str, ids: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids}), directory / name)


def test_a_perfect_copy_passes(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", list(range(100)))
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", list(range(100)))
    assert verify(tmp_path / "in", tmp_path / "out").ok


def test_missing_duplicated_and_unexpected_ids_are_each_reported(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", list(range(10)))
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", [0, 1, 2, 2, 3, 4, 5, 6, 7, 42])
    report = verify(tmp_path / "in", tmp_path / "out")
    assert not report.ok
    assert report.missing.tolist() == [8, 9]
    assert report.duplicated.tolist() == [2]
    assert report.unexpected.tolist() == [42]
    assert report.duplicate_extra_rows == 1


def test_staging_and_log_directories_are_not_output(tmp_path):
    write_ids(tmp_path / "in", "a.parquet", [1, 2])
    write_ids(tmp_path / "out" / "epoch-1", "p.parquet", [1, 2])
    write_ids(tmp_path / "out" / "_staging" / "1", "part.parquet", [1, 2])
    assert verify(tmp_path / "in", tmp_path / "out").ok

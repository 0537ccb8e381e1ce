from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from exactly.cli import main


def write(directory: Path, ids: list[int]) -> None:
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"id": ids}), directory / "part.parquet")


def test_verify_exits_zero_on_a_match_and_one_on_duplicates(tmp_path):
    write(tmp_path / "in", [1, 2, 3])
    write(tmp_path / "good" / "epoch-1", [3, 2, 1])
    write(tmp_path / "bad" / "epoch-1", [1, 2, 2, 3])
    ok = CliRunner().invoke(main, ["verify", "--input", str(tmp_path / "in"),
                                   "--output", str(tmp_path / "good")])
    assert ok.exit_code == 0 and "EXACTLY ONCE" in ok.output
    bad = CliRunner().invoke(main, ["verify", "--input", str(tmp_path / "in"),
                                    "--output", str(tmp_path / "bad"), "--json"])
    assert bad.exit_code == 1 and '"duplicated": 1' in bad.output


def test_faults_lists_every_point():
    result = CliRunner().invoke(main, ["faults"])
    assert "after_intent" in result.output and "in_write" in result.output

"""``exactly compact TABLE`` (ops/compaction.py) on an Iceberg table written through the
sink's protocol (embedded SQLite catalog, no Spark): once, as JSON, as a dry run, on a
schedule, and bad tables refused with exit 2."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from exactly.cli import main
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.ops.compaction import CompactionPlan, compact_every
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64())])


def written(tmp_path: Path, epochs: int = 3) -> tuple[str, ProtocolHarness]:
    sink = IcebergSink("db.events", tmp_path / "log",
                       catalog=CatalogSpec.from_options({}, str(tmp_path / "lake")))
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink)
    for epoch in range(epochs):
        h.run_epoch(epoch, [pa.record_batch({"id": [epoch * 2]}, schema=SCHEMA),
                            pa.record_batch({"id": [epoch * 2 + 1]}, schema=SCHEMA)])
    return f"iceberg:{tmp_path / 'lake'}?table=db.events", h


def test_compact_prints_what_it_did_and_a_dry_run_changes_nothing(tmp_path):
    table, _ = written(tmp_path)
    dry = CliRunner().invoke(main, ["compact", table, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would rewrite 6 file(s) into 1; live files 6 -> 1" in dry.output
    done = CliRunner().invoke(main, ["compact", table, "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert (result["format"], result["files_before"], result["files_after"]) == \
        ("iceberg", 6, 1)
    assert list(result["epochs"].values()) == [[[0, 2]]]
    again = CliRunner().invoke(main, ["compact", table])
    assert "rewrote 0 file(s) into 0; live files 1 -> 1" in again.output


def test_compact_every_runs_a_pass_per_interval_and_goes_on_after_a_failed_one(
        tmp_path, monkeypatch):
    table, h = written(tmp_path)
    lines: list[str] = []
    import exactly.ops.compaction as compaction

    real = compaction.compact_once
    calls = []

    def second_fails(plan):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("lost the race")
        if len(calls) == 3:
            h.run_epoch(3, [pa.record_batch({"id": [6]}, schema=SCHEMA),
                            pa.record_batch({"id": [7]}, schema=SCHEMA)])
        return real(plan)

    monkeypatch.setattr(compaction, "compact_once", second_fails)
    committed = compact_every(CompactionPlan(table), 0.01, lines.append, threading.Event(),
                              passes=3, failures=(RuntimeError,))
    assert committed == 2
    assert [("error" in json.loads(line)) for line in lines] == [False, True, False]


@pytest.mark.parametrize("table, message", [
    ("{tmp}/nothing", "is neither an Iceberg table"),
    ("iceberg:{tmp}/lake", "names no Iceberg table"),
])
def test_a_bad_table_exits_2_naming_the_forms(tmp_path, table, message):
    result = CliRunner().invoke(main, ["compact", table.format(tmp=tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output

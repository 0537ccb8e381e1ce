"""The 2PC file sink and the sources under real Spark (local[2])."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.auditor import verify
from exactly.config import CheckpointConfig, Mode, StateBackend
from exactly.demos.files_job import PipelineSpec, run
from exactly.errors import ConfigError, SourceNotReplayableError
from exactly.ops.query import check_replayable, start_query

EPOCH_ROWS = 1000


def datagen(spark, total: int, per_epoch: int = EPOCH_ROWS):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", total).option("maxRowsPerTrigger", per_epoch).load())


def test_readers_listing_the_output_see_whole_committed_epochs_only(spark, tmp_path):
    out = tmp_path / "out"
    seen: list[dict[str, list[int]]] = []
    stop = threading.Event()

    def poll() -> None:
        while True:  # one last snapshot after the query ended, however slow the reads are
            last = stop.is_set()
            files = data_files(out) if out.exists() else []
            by_epoch: dict[str, list[int]] = {}
            for f in files:
                try:
                    ids = ds.dataset(str(f), format="parquet").to_table(columns=["id"])
                except FileNotFoundError:
                    continue
                by_epoch.setdefault(f.parent.name, []).extend(ids["id"].to_pylist())
            seen.append(by_epoch)
            if last:
                return
            time.sleep(0.01)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        config = CheckpointConfig(storage=str(tmp_path / "ck"))
        query = start_query(datagen(spark, 20 * EPOCH_ROWS), sink_format="exactly.files",
                            path=str(out), checkpoint=config, available_now=True)
        query.await_termination()
    finally:
        stop.set()
        reader.join()
    assert query.query.exception() is None
    partial = [(epoch, len(ids)) for snapshot in seen for epoch, ids in snapshot.items()
               if len(ids) != EPOCH_ROWS]
    assert partial == []
    assert max(len(s) for s in seen) == 20
    assert len({len(s) for s in seen}) > 2, "the reader should have watched epochs appear"
    assert verify_range(out, 20 * EPOCH_ROWS)
    count = duckdb.sql(f"select count(*), count(distinct id) from "
                       f"read_parquet('{out}/epoch-*/*.parquet')").fetchall()[0]
    assert count == (20 * EPOCH_ROWS, 20 * EPOCH_ROWS)
    assert len(pd.read_parquet(out)) == 20 * EPOCH_ROWS


def verify_range(out: Path, total: int) -> bool:
    ids = sorted(ds.dataset([str(f) for f in data_files(out)], format="parquet")
                 .to_table(columns=["id"])["id"].to_pylist())
    return ids == list(range(total))


def test_json_lines_output_holds_every_row_once(spark, tmp_path):
    out = tmp_path / "out"
    query = start_query(datagen(spark, 3000), sink_format="exactly.files", path=str(out),
                        options={"format": "json"},
                        checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")),
                        available_now=True)
    query.await_termination()
    rows = [json.loads(line) for f in data_files(out) for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(3000))
    assert rows[0]["event_time"].startswith("2026-01-01T")


def test_the_file_pipeline_copies_every_event_once(spark, events_dir, tmp_path):
    spec = PipelineSpec(str(events_dir), str(tmp_path / "out"), str(tmp_path / "ck"))
    run(spark, spec, out=open("/dev/null", "w"))  # noqa: SIM115
    assert verify(events_dir, tmp_path / "out").ok


def test_a_malformed_row_fails_the_query_naming_file_and_line(spark, events_dir, tmp_path):
    bad = events_dir / "events-00002.jsonl"
    lines = bad.read_text().splitlines()
    lines[6] = '{"id": 12, "amount": "twelve"'
    bad.write_text("\n".join(lines) + "\n")
    spec = PipelineSpec(str(events_dir), str(tmp_path / "out"), str(tmp_path / "ck"))
    with pytest.raises(Exception, match=r"events-00002.jsonl at line 7") as info:
        run(spark, spec, out=open("/dev/null", "w"))  # noqa: SIM115
    assert "deadLetterPath" in str(info.value)


def test_a_dead_letter_location_takes_malformed_rows_and_the_rest_goes_on(spark, events_dir,
                                                                         tmp_path):
    bad = events_dir / "events-00005.jsonl"
    lines = bad.read_text().splitlines()
    broken_id = json.loads(lines[3])["id"]
    lines[3] = lines[3].replace('"amount": ', '"amount": "x')
    bad.write_text("\n".join(lines) + "\n")
    dlq = tmp_path / "dlq"
    spec = PipelineSpec(str(events_dir), str(tmp_path / "out"), str(tmp_path / "ck"),
                        dead_letter_dir=str(dlq))
    run(spark, spec, out=open("/dev/null", "w"))  # noqa: SIM115
    report = verify(events_dir, tmp_path / "out")
    # the audit cannot read the broken row either: it counts it as malformed, not expected
    assert report.ok and report.input_rows_without_key == 1 and report.found_rows == 3999
    letters = [json.loads(x) for x in (dlq / "events-00005.jsonl.jsonl").read_text().splitlines()]
    assert [(d["line"], str(broken_id) in d["raw"]) for d in letters] == [(4, True)]


def test_a_socket_source_is_refused_in_exactly_once_mode(spark):
    df = (spark.readStream.format("socket").option("host", "127.0.0.1")
          .option("port", 9).load())
    with pytest.raises(SourceNotReplayableError, match="accept_at_most_once"):
        check_replayable(df, Mode.EXACTLY_ONCE, accept_at_most_once=False)
    check_replayable(df, Mode.EXACTLY_ONCE, accept_at_most_once=True)
    check_replayable(df, Mode.AT_LEAST_ONCE, accept_at_most_once=False)


def test_restoring_a_checkpoint_into_another_state_backend_is_refused(spark, tmp_path):
    ck = str(tmp_path / "ck")
    first = start_query(datagen(spark, 100), sink_format="exactly.files",
                        path=str(tmp_path / "out"),
                        checkpoint=CheckpointConfig(storage=ck, state_backend="hashmap"),
                        available_now=True)
    first.await_termination()
    with pytest.raises(ConfigError, match="state_backend='hashmap'"):
        start_query(datagen(spark, 100), sink_format="exactly.files", path=str(tmp_path / "out"),
                    checkpoint=CheckpointConfig(storage=ck, state_backend="rocksdb"),
                    available_now=True)


def pinned_provider(checkpoint: str) -> str:
    """The state store provider Spark pinned in the checkpoint's newest offsets entry."""
    offsets = sorted((p for p in Path(checkpoint, "offsets").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    conf = json.loads(offsets[-1].read_text().splitlines()[1])["conf"]
    return conf["spark.sql.streaming.stateStore.providerClass"]


def test_without_a_backend_a_new_checkpoint_gets_rocksdb_and_an_old_one_keeps_its_own(
        spark, tmp_path):
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    for ck, backend in ((new, None), (old, "hashmap")):
        start_query(datagen(spark, 100), sink_format="exactly.files", path=f"{ck}-out",
                    checkpoint=CheckpointConfig(storage=ck, state_backend=backend),
                    available_now=True).await_termination()
    assert pinned_provider(new).endswith("RocksDBStateStoreProvider")
    assert pinned_provider(old).endswith("HDFSBackedStateStoreProvider")
    # the next run, with no backend given, resumes the old checkpoint on its own backend
    again = start_query(datagen(spark, 200), sink_format="exactly.files", path=f"{old}-out",
                        checkpoint=CheckpointConfig(storage=old), available_now=True)
    again.await_termination()
    assert again.config.state_backend is StateBackend.HASHMAP
    assert pinned_provider(old).endswith("HDFSBackedStateStoreProvider")
    assert verify_range(Path(f"{old}-out"), 200)


def test_a_new_query_cannot_write_into_another_querys_output(spark, tmp_path):
    out = str(tmp_path / "out")
    start_query(datagen(spark, 100), sink_format="exactly.files", path=out,
                checkpoint=CheckpointConfig(storage=str(tmp_path / "ck1")),
                available_now=True).await_termination()
    second = start_query(datagen(spark, 100), sink_format="exactly.files", path=out,
                         checkpoint=CheckpointConfig(storage=str(tmp_path / "ck2")),
                         available_now=True)
    with pytest.raises(Exception, match="already holds the output of streaming query"):
        second.await_termination()


@pytest.mark.parametrize("cleanup", ["retain_on_cancellation", "delete_on_cancellation"])
def test_cancel_applies_externalized_cleanup_to_the_checkpoint(spark, tmp_path, cleanup):
    ck = tmp_path / "ck"
    config = CheckpointConfig(storage=str(ck), interval="200ms", externalized_cleanup=cleanup)
    df = spark.readStream.format("exactly.datagen").option("rowsPerSecond", 100).load()
    query = start_query(df, sink_format="exactly.files", path=str(tmp_path / "out"),
                        checkpoint=config)
    deadline = time.monotonic() + 120
    while not (ck / "commits" / "0").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    query.cancel()
    assert ck.exists() == (cleanup == "retain_on_cancellation")


def test_the_readmes_filter_job_passes_exactly_verify_with_its_where(spark, tmp_path,
                                                                       events_dir):
    """The README's job (and docs/python.md's start_query example) as a user runs it:
    exactly.files -> where amount > X -> exactly.files (X drops about half of these events;
    the docs' X = 0 would drop none),
    then `exactly verify` with the job's filter (EXACTLY ONCE, every value equal) and without
    it (the filtered ids reported missing: the filter matters)."""
    from click.testing import CliRunner

    from exactly.cli import main

    events = (spark.readStream.format("exactly.files")
              .schema("id long not null, key string, amount double")
              .option("format", "json").option("maxFilesPerTrigger", 4).load(str(events_dir)))
    query = start_query(events.where("amount > 5000"), sink_format="exactly.files",
                        path=str(tmp_path / "clean"), options={"format": "parquet"},
                        checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")),
                        available_now=True)
    query.await_termination()
    args = ["verify", "--input", str(events_dir), "--output", str(tmp_path / "clean"), "--json"]
    result = CliRunner().invoke(main, [*args, "--where", "amount > 5000",
                                       "--compare-columns", "*"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    kept = sum(1 for f in events_dir.glob("*.jsonl") for line in f.read_text().splitlines()
               if json.loads(line)["amount"] > 5000)
    assert 0 < kept < 4000 and report["found_rows"] == kept
    assert report["compared"] == ["key", "amount"]  # the job dropped event_time
    assert [e["epoch"] for e in report["epochs"]] == [0, 1]  # 8 files, 4 per epoch
    unfiltered = CliRunner().invoke(main, args)
    assert unfiltered.exit_code == 1
    assert json.loads(unfiltered.stdout)["missing"]["count"] == 4000 - kept

"""Every damaged protocol file fails with its path, what is wrong and the safe repair.

One real checkpoint (a tiny exactly.files query under local[2]) is made per module and
copied per test; each test damages one file of the copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from datagen_query import datagen, run_query

from exactly.connectors.files.sink import FileSink
from exactly.errors import CorruptCheckpointFileError, CorruptFileError
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.contract import SinkSettings
from exactly.protocol.lease import Lease
from exactly.protocol.recovery import MARKER_NAME, recover_on_new_driver


@pytest.fixture(scope="module")
def made(spark, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("checkpoint")
    query = run_query(spark, base / "ck", base / "out")
    assert query.query.exception() is None
    assert (base / "ck" / "commits" / "2").exists()
    return base


def copy_of(made: Path, target: Path) -> Path:
    shutil.copytree(made / "ck", target / "ck")
    shutil.copytree(made / "out", target / "out")
    return target


@pytest.fixture
def copy(made, tmp_path) -> Path:
    return copy_of(made, tmp_path / "copy")


@pytest.fixture
def probe(made, tmp_path) -> Path:
    """A second copy, for Spark to fail on (and perhaps change) without the preflight."""
    return copy_of(made, tmp_path / "probe")


def tear(path: Path, keep: int | None = None) -> None:
    """Cut ``path`` short (a torn write): its first ``keep`` bytes, half by default."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


def spark_error_without_preflight(spark, ck: Path, out: Path) -> str:
    """What Spark itself says when it starts on ``ck`` (no preflight in between)."""
    query = (datagen(spark).writeStream.format("exactly.files")
             .option("checkpointLocation", str(ck)).trigger(availableNow=True)
             .start(str(out)))
    try:
        query.awaitTermination()
    except Exception as exc:  # whatever Spark raises
        return str(exc)
    raise AssertionError("Spark started on the damaged checkpoint without an error")


def start_error(spark, copy: Path) -> CorruptCheckpointFileError:
    with pytest.raises(CorruptCheckpointFileError) as caught:
        run_query(spark, copy / "ck", copy / "out")
    return caught.value


# -- Spark's own files, found by start_query's preflight -----------------------------------
def test_a_torn_offsets_entry_is_named_by_start_query_where_spark_names_no_file(
        spark, copy, probe):
    for base in (copy, probe):
        tear(base / "ck" / "offsets" / "2", keep=20)
    torn = copy / "ck" / "offsets" / "2"
    spark_says = spark_error_without_preflight(spark, probe / "ck", probe / "out")
    assert "offsets/2" not in spark_says and "end-of-input" in spark_says
    error = start_error(spark, copy)
    assert error.path == str(torn) and str(torn) in str(error)
    assert "restore-offsets" in error.repair


def test_a_stray_commit_checksum_is_named_instead_of_sparks_concurrent_queries_error(
        spark, copy, probe):
    for base in (copy, probe):
        (base / "ck" / "commits" / "2").unlink()  # deleted by hand, its .crc left behind
    stray = copy / "ck" / "commits" / ".2.crc"
    spark_says = spark_error_without_preflight(spark, probe / "ck", probe / "out")
    assert "Multiple streaming queries are concurrently using" in spark_says
    assert ".2.crc" not in spark_says
    error = start_error(spark, copy)
    assert error.path == str(stray) and str(stray) in str(error)
    assert error.repair == f"delete {stray} (the checksum of a file that no longer exists)"


@pytest.mark.parametrize("damage", ["torn_keeping_crc", "torn_without_crc", "empty", "binary"])
def test_a_damaged_offsets_entry_fails_start_query_naming_it(spark, copy, damage):
    entry = copy / "ck" / "offsets" / "1"
    if damage == "binary":
        entry.write_bytes(b"v1\n\xff\xfe\x00")
    else:
        tear(entry, keep=0 if damage == "empty" else None)
    if damage != "torn_keeping_crc":
        (copy / "ck" / "offsets" / ".1.crc").unlink()
    error = start_error(spark, copy)
    assert error.path == str(entry) and str(entry) in str(error)


@pytest.mark.parametrize("damage", ["torn", "no_json_line", "not_json"])
def test_a_damaged_commit_entry_fails_start_query_naming_it_and_says_delete_it(
        spark, copy, damage):
    entry = copy / "ck" / "commits" / "2"
    (copy / "ck" / "commits" / ".2.crc").unlink()
    entry.write_text({"torn": "v1\n{\"nextBatch", "no_json_line": "v1\n",
                      "not_json": "v1\nnextBatchWatermarkMs=0\n"}[damage])
    error = start_error(spark, copy)
    assert error.path == str(entry) and str(entry) in str(error)
    assert error.repair.startswith("delete it and its .crc")


def test_a_stray_offsets_checksum_fails_start_query_naming_it(spark, copy):
    (copy / "ck" / "offsets" / "2").unlink()
    (copy / "ck" / "commits" / "2").unlink()
    (copy / "ck" / "commits" / ".2.crc").unlink()
    error = start_error(spark, copy)
    assert error.path == str(copy / "ck" / "offsets" / ".2.crc")


def test_a_torn_metadata_file_is_named_with_the_query_id_the_sink_recorded(spark, copy):
    metadata = copy / "ck" / "metadata"
    recorded = json.loads((copy / "out" / "_exactly" / "query.json").read_text())["query_id"]
    tear(metadata, keep=10)
    error = start_error(spark, copy)
    assert error.path == str(metadata)
    assert f'{{"id":"{recorded}"}}' in error.repair and ".metadata.crc" in error.repair


def test_a_missing_metadata_file_beside_offsets_fails_start_query(spark, copy):
    (copy / "ck" / "metadata").unlink()
    (copy / "ck" / ".metadata.crc").unlink()
    error = start_error(spark, copy)
    assert error.path == str(copy / "ck" / "metadata") and "is missing" in error.problem


def test_leftover_temp_and_foreign_files_in_the_logs_do_not_stop_the_query(spark, copy):
    (copy / "ck" / "offsets" / ".3.0f1e2d3c.tmp").write_text("v1\n")
    (copy / "ck" / "commits" / "2.bak").write_text("junk")
    query = run_query(spark, copy / "ck", copy / "out")
    assert query.query.exception() is None


# -- the sink's commit log and staging area --------------------------------------------------
def test_a_torn_query_json_fails_start_query_naming_it_and_the_rewrite(spark, copy):
    owner = copy / "out" / "_exactly" / "query.json"
    tear(owner)
    with pytest.raises(CorruptFileError) as caught:
        run_query(spark, copy / "ck", copy / "out")
    assert caught.value.path == str(owner) and str(owner) in str(caught.value)
    assert '{"query_id": "<id>"}' in caught.value.repair


@pytest.mark.parametrize("content", ["", '{"run_id": "r", "gener', '{"run_id": "r"}', "[1]"])
def test_a_damaged_lease_names_the_file_and_says_to_delete_it(copy, content):
    log = copy / "out" / "_exactly"
    (log / "lease.json").write_text(content)
    with pytest.raises(CorruptFileError) as caught:
        Lease(log).current()
    assert caught.value.path == str(log / "lease.json")
    assert caught.value.repair.startswith("delete it once no driver of this query runs")


def test_torn_intent_and_completion_files_name_their_path(copy):
    log = CommitLog(copy / "out" / "_exactly")
    intent = log.intents / f"{2:020d}.json"
    completion = log.complete / f"{2:020d}.json"
    tear(intent)
    tear(completion)
    with pytest.raises(CorruptFileError, match=str(intent)):
        log.read_intent(2)
    with pytest.raises(CorruptFileError, match=str(completion)):
        log.completion(2)


def test_a_torn_recovery_marker_names_the_file_and_says_to_delete_it(copy):
    sink = FileSink(str(copy / "out"))
    marker = sink.log_directory / MARKER_NAME
    marker.write_text('{"driver": {"host"')
    with pytest.raises(CorruptFileError) as caught:
        recover_on_new_driver(sink, SinkSettings())
    assert caught.value.path == str(marker)
    assert caught.value.repair.startswith("delete it: the next driver start runs recovery")


def test_a_torn_staging_task_file_names_the_attempt_to_abort(copy):
    sink = FileSink(str(copy / "out"))
    query_id = json.loads((sink.log_directory / "query.json").read_text())
    attempt = sink.staging / f"{7:012d}" / "00000-deadbeef-0"
    attempt.mkdir(parents=True)
    (attempt / "task.json").write_text('{"query_id": "')
    with pytest.raises(CorruptFileError) as caught:
        sink.list_pre_commits(query_id["query_id"])
    assert caught.value.path == str(attempt / "task.json")
    assert f"otherwise delete {attempt}" in caught.value.repair

"""``exactly verify`` on S3 (S3Proxy): a Delta table written by the real Delta sink's
protocol, read through its log, and the file sink's output copied to a bucket, read per
epoch; each correct one passes, one with a duplicated and a missing id exits 1 naming them;
bad settings exit 2 naming the setting to fix (3 for an endpoint that does not answer), and
never show the secret key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from exactly.auditor import AuditSpec, FilesLocation, ObjectFilesLocation, run_audit, verify
from exactly.cli import main
from exactly.connectors.delta.sink import DeltaSink
from exactly.connectors.files.sink import FileSink
from exactly.objectstore import Location
from exactly.testing.delta_output import leftovers
from exactly.testing.harness import ProtocolHarness
from exactly.testing.ports import free_port

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def rows(ids) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]}, schema=SCHEMA)


def write_input(root: Path, ids) -> Path:
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return root


def delta_table(s3_server, uri: str, log: Path, epochs: list[list[int]]) -> ProtocolHarness:
    sink = DeltaSink(uri, log, storage_options=s3_server.storage_options())
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink)
    for epoch, ids in enumerate(epochs):
        h.run_epoch(epoch, [rows(ids[:2]), rows(ids[2:])])
    return h


def file_sink_output_on_s3(local: Path, uri: str, epochs: list[list[int]]) -> None:
    """The file sink's output written locally (a pending pre-commit of the next epoch in its
    staging area) and copied to ``uri``, as ``aws s3 sync`` would."""
    h = ProtocolHarness(FileSink(str(local)))
    for epoch, ids in enumerate(epochs):
        h.run_epoch(epoch, [rows(ids[:2]), rows(ids[2:])])
    h.tasks(len(epochs), [rows(epochs[-1])])  # staged under _staging/, not published
    fs, path = Location.parse(uri).filesystem()
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)


def verify_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exactly.cli", "verify", *args, "--json"],
                          capture_output=True, text=True, timeout=180)


def test_a_delta_table_on_s3_is_read_through_its_log(s3_server, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/events"
    h = delta_table(s3_server, uri, tmp_path / "log", [[0, 1, 2, 3], [4, 5, 6]])
    h.tasks(1, [rows([4, 5, 6])])  # a replay's pre-commit, written in place, not committed
    assert leftovers(uri, s3_server.storage_options())  # it lies beside the table's files
    source = write_input(tmp_path / "in", range(7))

    result = verify_cli("--input", str(source), "--output", f"s3a://{s3_bucket}/events")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["output"], report["found_rows"]) == (f"Delta table {uri}", 7)
    assert [(e["epoch"], e["rows"]) for e in report["epochs"]] == [(0, 4), (1, 3)]

    loose = verify(source, f"s3://{s3_bucket}/events/")  # detected: still the table
    assert loose.ok and loose.found_rows == 7
    as_files = run_audit(AuditSpec(input=FilesLocation(source),
                                   output=ObjectFilesLocation(uri)))
    assert as_files.duplicated.count == 3  # what reading every Parquet file would count


def test_a_delta_table_on_s3_with_a_duplicated_and_a_missing_id_exits_1_naming_them(
        s3_server, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/bad"
    delta_table(s3_server, uri, tmp_path / "log", [[0, 1, 2, 3], [3, 5, 6]])  # 3 twice, no 4
    result = CliRunner().invoke(main, ["verify", "--input",
                                       str(write_input(tmp_path / "in", range(7))),
                                       "--output", uri, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["duplicated"]["sample"] == [{"id": 3, "rows": 2}]
    assert report["missing"]["sample"] == [{"id": 4}]
    assert [(e["epoch"], e["duplicated_rows"]) for e in report["epochs"]] == [(0, 1), (1, 1)]


def test_the_file_sinks_output_on_s3_is_audited_per_epoch(s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/out"
    file_sink_output_on_s3(tmp_path / "out", uri, [[0, 1, 2], [3, 4, 5, 6]])
    source = write_input(tmp_path / "in", range(7))

    result = verify_cli("--input", str(source), "--output", uri)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["output"], report["found_rows"]) == (uri, 7)
    assert [(e["epoch"], e["rows"]) for e in report["epochs"]] == [(0, 3), (1, 4)]

    bad = f"s3://{s3_bucket}/bad"
    file_sink_output_on_s3(tmp_path / "bad", bad, [[0, 1, 2], [2, 4, 5, 6]])  # 2 twice, no 3
    wrong = verify(source, bad)
    assert not wrong.ok
    assert wrong.duplicated.sample == [{"id": 2, "rows": 2}]
    assert wrong.missing.sample == [{"id": 3}]
    assert [(e.epoch, e.duplicated_rows) for e in wrong.epochs] == [(0, 1), (1, 1)]


@pytest.mark.parametrize("case, output, status, message", [
    ("no bucket", "s3://no-such-bucket-x/t", 2,
     "bucket 'no-such-bucket-x' of s3://no-such-bucket-x/t does not exist at "
     "AWS_ENDPOINT_URL=http://127.0.0.1:"),
    ("wrong secret", "s3://{bucket}/out", 2,
     "refused the credentials of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    ("no credentials", "s3://{bucket}/out", 2,
     "needs credentials and none were given (ACCESS_DENIED); set AWS_ACCESS_KEY_ID and "
     "AWS_SECRET_ACCESS_KEY"),
    ("empty prefix", "s3://{bucket}/nothing-here", 2,
     "s3://{bucket}/nothing-here holds no objects; check the prefix"),
    ("not parquet", "s3://{bucket}/broken", 2,
     "s3://{bucket}/broken: cannot read its data files: Could not open Parquet input source"),
    ("delta without a log", "delta:s3://{bucket}/out", 2,
     "s3://{bucket}/out is not a Delta table: it has no _delta_log/"),
    ("unreachable", "s3://{bucket}/out", 3,
     "verify failed: ObjectStoreUnreachable: cannot reach the object store for "
     "s3://{bucket}/out at AWS_ENDPOINT_URL=http://127.0.0.1:{port}"),
])
def test_bad_s3_locations_name_the_setting_to_fix_and_never_the_secret(
        s3_server, s3_bucket, tmp_path, monkeypatch, case, output, status, message):
    fs, path = Location.parse(f"s3://{s3_bucket}/out").filesystem()
    with fs.open_output_stream(f"{path}/epoch-000000000000/part-00000.parquet") as out:
        pq.write_table(pa.Table.from_batches([rows([0])]), out)
    with fs.open_output_stream(f"{path.rsplit('/', 1)[0]}/broken/part-00000.parquet") as out:
        out.write(b"not parquet at all")
    port = free_port()
    secret = s3_server.secret_key
    if case == "wrong secret":
        secret = "not-the-secret-key-0123456789"
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    elif case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif case == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    result = CliRunner().invoke(main, ["verify", "--expect", "select 0 as id", "--output",
                                       output.format(bucket=s3_bucket)])
    assert result.exit_code == status, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("verify: bad input: " if status == 2 else "verify failed: ")
    assert message.format(bucket=s3_bucket, port=port) in lines[-1], lines[-1]
    assert secret not in result.output

"""The Delta sink's pending marker on S3 (S3Proxy): its PUT runs while the task encodes its
rows, and is done before the data object exists (an object exists only once its upload
completes, in pre-commit)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.fs as pafs

from exactly.connectors import lake_files
from exactly.connectors.delta.sink import DeltaSink
from exactly.protocol.contract import TaskInfo

SCHEMA = pa.schema([("id", pa.int64())])


def test_on_s3_the_marker_put_overlaps_the_rows_and_precedes_the_data_object(
        s3_server, s3_bucket, tmp_path, monkeypatch):
    sink = DeltaSink(f"s3://{s3_bucket}/t", tmp_path / "log",
                     storage_options=s3_server.storage_options())
    sink.prepare_target(SCHEMA)
    fs, base = sink.location.filesystem()
    task = TaskInfo("q", "r", 0, 0, 0)
    data = f"{base}/{sink._data_name(task)}"
    release = threading.Event()
    seen: list[pafs.FileType] = []
    original = lake_files.put_object

    def held_put(fs_: pafs.FileSystem, path: str, body: bytes) -> None:
        release.wait(10)
        seen.append(fs.get_file_info(data).type)  # the data object, as the marker lands
        original(fs_, path, body)

    monkeypatch.setattr(lake_files, "put_object", held_put)
    txn = sink.begin_transaction(task)
    sink.write(txn, pa.record_batch({"id": [1, 2, 3]}, schema=SCHEMA))
    marker = f"{base}/{sink._marker_name(task)}"
    assert fs.get_file_info(marker).type == pafs.FileType.NotFound  # its PUT is held
    payloads = []
    closing = threading.Thread(target=lambda: payloads.append(sink.pre_commit(txn)))
    closing.start()
    time.sleep(0.3)  # a pre-commit that did not wait would have uploaded the data by now
    release.set()
    closing.join(30)
    assert seen == [pafs.FileType.NotFound]
    assert [p.rows for p in payloads] == [3]
    assert fs.get_file_info(marker).type == pafs.FileType.File
    assert fs.get_file_info(data).size == payloads[0].size

"""The commit protocol on the file sink: what tests/contract does not cover.

The protocol's scenarios (visibility, replays, a crash at every point, orphans, Spark's
abort, data loss, fencing, at-least-once) run over every sink in
tests/contract/test_commit_protocol.py. ``run_tasks``, ``visible_ids``, ``QUERY`` and
``DEAD_DRIVER`` serve tests/unit/test_epoch_identity.py.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.connectors.files.sink import FileSink
from exactly.errors import OwnershipError
from exactly.procs import ProcessId
from exactly.protocol.contract import Handle, TaskInfo
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.protocol.task import run_task
from exactly.testing.harness import ProtocolHarness

QUERY = str(uuid.uuid4())
#: a driver on this host that no longer runs: its lease can be taken over
DEAD_DRIVER = ProcessId(socket.gethostname(), 4_000_000, 1)


def run_tasks(sink: FileSink, run_id: str, epoch: int, parts: int = 2, rows: int = 5,
              attempt_base: int = 0) -> list[Handle]:
    """Step 1 of query ``QUERY``: one task per partition (``run_task``), ids from
    ``epoch * 1000``."""
    handles = []
    for p in range(parts):
        start = epoch * 1000 + p * rows
        batch = pa.record_batch({"id": list(range(start, start + rows))})
        handle = run_task(sink, TaskInfo(QUERY, run_id, epoch, p, attempt_base + p), [batch])
        assert handle is not None
        handles.append(handle)
    return handles


def visible_ids(root: Path) -> list[int]:
    files = [str(f) for f in data_files(root)] if root.exists() else []
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


def test_a_different_query_cannot_write_into_an_owned_output(tmp_path):
    sink = FileSink(str(tmp_path / "out"))
    batch = pa.record_batch({"id": [1, 2, 3]})
    ProtocolHarness(sink).run_epoch(0, [batch])
    other = ProtocolHarness(sink)  # another query (a new checkpoint), the same output path
    with pytest.raises(OwnershipError, match="new, empty output path"):
        other.run_epoch(1, [batch])
    assert visible_ids(sink.root) == [1, 2, 3]


def test_fault_spec_parsing_rejects_unknown_points():
    assert FaultSpec.parse("after_intent@3").min_epoch == 3
    assert FaultSpec.parse("IN_WRITE").point == FaultPoint.IN_WRITE
    with pytest.raises(ValueError, match="unknown"):
        FaultSpec.parse("after_lunch")

"""Checks of the file sink's output directory after a crash test."""

from __future__ import annotations

import json
from pathlib import Path

from exactly.connectors.files.sink import FileSink
from exactly.protocol.commitlog import CommitLog


def assert_no_dangling_pre_commits(out: Path) -> None:
    """No staged attempt, no intent without completion, no half-assembled epoch is left."""
    sink = FileSink(str(out))
    log = CommitLog(sink.log_directory)
    query_id = json.loads((sink.log_directory / "query.json").read_text())["query_id"]
    assert sink.list_pre_commits(query_id) == []
    assert log.incomplete_intents() == []
    assert not any(sink.staging.glob("*/_publish")), "an epoch was left half-assembled"
